// Consuming: consumers long-poll groups of partitions from their end and time each
// record of this run they see arrive.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

type consumeRecord struct {
	Offset int64   `json:"offset"`
	Value  *string `json:"value"`
	Base64 *string `json:"base64"`
}

type consumeResult struct {
	Topic         string          `json:"topic"`
	Partition     int             `json:"partition"`
	OK            bool            `json:"ok"`
	HighWatermark int64           `json:"high_watermark"`
	NextOffset    int64           `json:"next_offset"`
	Records       []consumeRecord `json:"records"`
	ErrorType     string          `json:"error_type"`
}

type consumeResponse struct {
	Results []consumeResult `json:"results"`
}

func (h *Hammer) consumeRequest(parts []int, offsets []int64, waitMs int, partMax int) []byte {
	var body bytes.Buffer
	body.WriteString(`{"topic_partitions":[`)
	for i, pi := range parts {
		if i > 0 {
			body.WriteByte(',')
		}
		rt := h.consume[pi]
		fmt.Fprintf(&body, `{"topic":%q,"partition":%d,"fetch_offset":%d`, rt.Topic, rt.Partition, offsets[i])
		if partMax > 0 {
			fmt.Fprintf(&body, `,"partition_max_bytes":%d`, partMax)
		}
		body.WriteByte('}')
	}
	fmt.Fprintf(&body, `],"max_wait_ms":%d,"min_bytes":1,"max_bytes":%d}`, waitMs, h.cfg.Consumer.MaxBytes)
	return body.Bytes()
}

func (h *Hammer) consumeLoop(ctx context.Context, parts []int, ready chan<- struct{}, producersDone <-chan struct{}) {
	offsets := make([]int64, len(parts))
	timeout := time.Duration(h.cfg.RequestTimeoutS*float64(time.Second)) + time.Duration(h.cfg.Consumer.MaxWaitMs)*time.Millisecond
	rt := h.consume[parts[0]] // every partition of the group has the same reader set
	// Position at the current end of each partition.
	for tries := 0; ; tries++ {
		b := h.router.Pick(rt, "consume")
		status, resp, err := h.post(b, "/consume", h.consumeRequest(parts, offsets, 0, 1), timeout)
		var cr consumeResponse
		if err == nil && status == 200 && json.Unmarshal(resp, &cr) == nil && len(cr.Results) == len(parts) {
			for i, r := range cr.Results {
				offsets[i] = r.HighWatermark + 1
			}
			break
		}
		if err != nil && isDialError(err) {
			h.router.MarkDown(b, err.Error())
		}
		if tries > 50 || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	ready <- struct{}{}
	done := false
	for ctx.Err() == nil {
		if !done {
			select {
			case <-producersDone:
				done = true
			default:
			}
		}
		if done && h.caughtUp(parts, offsets) {
			return
		}
		b := h.router.Pick(rt, "consume")
		b.inflight.Add(1)
		h.stats.consRequests.Add(1)
		status, resp, err := h.post(b, "/consume", h.consumeRequest(parts, offsets, h.cfg.Consumer.MaxWaitMs, 0), timeout)
		b.inflight.Add(-1)
		now := time.Now()
		if err != nil || status != 200 {
			h.stats.consErrors.Add(1)
			if err != nil && (isDialError(err) || !isTimeout(err)) {
				h.router.MarkDown(b, err.Error())
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		h.router.MarkUp(b)
		var cr consumeResponse
		if json.Unmarshal(resp, &cr) != nil || len(cr.Results) != len(parts) {
			h.stats.consErrors.Add(1)
			continue
		}
		for i, r := range cr.Results {
			if !r.OK {
				h.stats.consErrors.Add(1)
				continue
			}
			for _, rec := range r.Records {
				var v string
				if rec.Value != nil {
					v = *rec.Value
				} else if rec.Base64 != nil {
					v = *rec.Base64 // not ours: counted, no latency
				}
				h.stats.consRecords.Add(1)
				h.stats.consBytes.Add(int64(len(v)))
				if ts, ok := recordTimestamp(v); ok && !time.Unix(0, ts).Before(h.measureAt) {
					us := now.Sub(time.Unix(0, ts)).Microseconds()
					h.stats.mu.Lock()
					h.stats.e2e.Record(us)
					h.stats.e2eInterval.Record(us)
					h.stats.mu.Unlock()
				}
			}
			if r.NextOffset > offsets[i] {
				offsets[i] = r.NextOffset
			}
		}
	}
}

func (h *Hammer) caughtUp(parts []int, offsets []int64) bool {
	for i, pi := range parts {
		if offsets[i] <= h.maxAcked[pi].Load() {
			return false
		}
	}
	return true
}

func recordTimestamp(v string) (int64, bool) {
	for i := 0; i < len(v) && i < 20; i++ {
		if v[i] == '-' {
			ts, err := strconv.ParseInt(v[:i], 16, 64)
			return ts, err == nil
		}
	}
	return 0, false
}
