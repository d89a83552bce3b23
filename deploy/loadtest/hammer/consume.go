// Consuming: consumers long-poll groups of partitions from their end and time each
// record of this run they see arrive.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
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

func (h *Hammer) consumeTimeout() time.Duration {
	return time.Duration(h.cfg.RequestTimeoutS*float64(time.Second)) +
		time.Duration(h.cfg.Consumer.MaxWaitMs)*time.Millisecond
}

func (h *Hammer) consumeLoop(ctx context.Context, parts []int, ready chan<- struct{}, producersDone <-chan struct{}) {
	rt := h.consume[parts[0]] // every partition of the group has the same reader set
	offsets := h.positionAtEnd(ctx, rt, parts)
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
		b := h.router.Pick([]*Route{rt}, "consume", nil)
		b.inflight.Add(1)
		h.stats.consRequests.Add(1)
		status, _, resp, err := h.post(b, "/consume", h.consumeRequest(parts, offsets, h.cfg.Consumer.MaxWaitMs, 0), h.consumeTimeout())
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
			h.consumed(r, now)
			if r.OK && r.NextOffset > offsets[i] {
				offsets[i] = r.NextOffset
			}
		}
	}
}

// positionAtEnd is the offset after the current end of each partition of the group.
func (h *Hammer) positionAtEnd(ctx context.Context, rt *Route, parts []int) []int64 {
	offsets := make([]int64, len(parts))
	for tries := 0; ; tries++ {
		b := h.router.Pick([]*Route{rt}, "consume", nil)
		status, _, resp, err := h.post(b, "/consume", h.consumeRequest(parts, offsets, 0, 1), h.consumeTimeout())
		var cr consumeResponse
		if err == nil && status == 200 && json.Unmarshal(resp, &cr) == nil && len(cr.Results) == len(parts) {
			for i, r := range cr.Results {
				offsets[i] = r.HighWatermark + 1
			}
			return offsets
		}
		if err != nil && isDialError(err) {
			h.router.MarkDown(b, err.Error())
		}
		if tries > 50 || ctx.Err() != nil {
			return offsets
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consumed counts one partition's records and times those of this run.
func (h *Hammer) consumed(r consumeResult, now time.Time) {
	if !r.OK {
		h.stats.consErrors.Add(1)
		return
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

// consumers are the running consume loops.
type consumers struct {
	wg            sync.WaitGroup
	stop          context.CancelFunc
	producersDone chan struct{}
}

// startConsumers starts a consume loop per group of partitions with the same readers,
// when consumers are enabled, and returns once each is positioned at its partitions' end.
func (h *Hammer) startConsumers() *consumers {
	ctx, stop := context.WithCancel(context.Background())
	c := &consumers{stop: stop, producersDone: make(chan struct{})}
	if !h.cfg.Consumer.Enabled {
		return c
	}
	groups := h.consumerGroups()
	ready := make(chan struct{}, len(groups))
	for _, g := range groups {
		c.wg.Add(1)
		go func(g []int) {
			defer c.wg.Done()
			h.consumeLoop(ctx, g, ready, c.producersDone)
		}(g)
	}
	for range groups {
		<-ready
	}
	return c
}

// drain tells the consumers the producers are done and waits until they have caught up
// with every acknowledged offset, or for timeout.
func (c *consumers) drain(timeout time.Duration) {
	close(c.producersDone)
	drained := make(chan struct{})
	go func() { c.wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(timeout):
		c.stop()
		<-drained
	}
}
