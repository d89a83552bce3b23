// Producing: the closed and open loops, one produce request with its retries, and the
// bookkeeping of what was acknowledged.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

func (h *Hammer) closedLoop(ctx context.Context) {
	var wg sync.WaitGroup
	for w := 0; w < h.cfg.Connections; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var seq int64
			for ctx.Err() == nil {
				seq++
				h.produceOnce(w, seq, time.Now())
			}
		}(w)
	}
	wg.Wait()
}

// openLoop starts requests on a fixed schedule; latency runs from the intended start, so
// a slow broker is not hidden by the generator slowing down (coordinated omission).
func (h *Hammer) openLoop(ctx context.Context) {
	period := time.Duration(float64(time.Second) / h.cfg.Rate)
	slots := make(chan struct{}, h.cfg.Connections)
	var wg sync.WaitGroup
	for i := int64(0); ; i++ {
		intended := h.start.Add(time.Duration(i) * period)
		if d := time.Until(intended); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		lag := time.Since(intended)
		if lag > period {
			h.stats.lateStarts.Add(1)
		}
		if us := lag.Microseconds(); us > h.stats.scheduleLagUs.Load() {
			h.stats.scheduleLagUs.Store(us)
		}
		wg.Add(1)
		go func(i int64, intended time.Time) {
			defer wg.Done()
			defer func() { <-slots }()
			h.produceOnce(int(i%int64(h.cfg.Connections)), i, intended)
		}(i, intended)
	}
	wg.Wait()
}

type produceResult struct {
	Topic       string `json:"topic"`
	Partition   int    `json:"partition"`
	OK          bool   `json:"ok"`
	StartOffset int64  `json:"start_offset"`
	EndOffset   int64  `json:"end_offset"`
	Count       int64  `json:"count"`
	ErrorType   string `json:"error_type"`
}

type produceResponse struct {
	Results []produceResult `json:"results"`
}

func (h *Hammer) buildRecords(worker int, seq int64, now time.Time) [][]byte {
	n := h.cfg.RecordsPerRequest
	out := make([][]byte, n)
	ts := strconv.FormatInt(now.UnixNano(), 16)
	for i := 0; i < n; i++ {
		head := fmt.Sprintf("%s-%d-%d-%d-", ts, worker, seq, i)
		v := make([]byte, max(len(head), h.cfg.RecordBytes))
		copy(v, head)
		for j := len(head); j < len(v); j++ {
			v[j] = 'x'
		}
		out[i] = v
	}
	return out
}

func (h *Hammer) produceOnce(worker int, seq int64, intended time.Time) {
	pi := int(h.nextPart.Add(1)-1) % len(h.produce)
	rt := h.produce[pi]
	records := h.buildRecords(worker, seq, time.Now())
	var body bytes.Buffer
	fmt.Fprintf(&body, `{"topic_partitions":[{"topic":%q,"partition":%d,"records":[`, rt.Topic, rt.Partition)
	size := 0
	for i, r := range records {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteByte('"')
		body.Write(r)
		body.WriteByte('"')
		size += len(r)
	}
	body.WriteString(`]}]}`)
	payload := body.Bytes()
	timeout := time.Duration(h.cfg.RequestTimeoutS * float64(time.Second))

	for attempt := 0; ; attempt++ {
		b := h.router.Pick(rt, "produce")
		b.requests.Add(1)
		h.stats.requests.Add(1)
		b.inflight.Add(1)
		h.stats.inflight.Add(1)
		status, resp, err := h.post(b, "/produce", payload, timeout)
		b.inflight.Add(-1)
		h.stats.inflight.Add(-1)
		if err != nil {
			if isDialError(err) {
				h.router.MarkDown(b, err.Error())
				h.stats.status("connect_error")
				if attempt < h.cfg.MaxRetries {
					h.stats.retries.Add(1)
					continue // never sent: safe to send to another owner
				}
				b.errors.Add(1)
				h.stats.fail("connect_error", len(records))
				return
			}
			// Sent but unanswered: the outcome is unknown, so it is neither acknowledged
			// nor retried (a retry could store the records twice).
			kind := "transport_error"
			if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				kind = "timeout"
			} else {
				h.router.MarkDown(b, err.Error())
			}
			h.stats.status(kind)
			b.errors.Add(1)
			h.stats.fail(kind, len(records))
			return
		}
		h.router.MarkUp(b)
		h.stats.status(strconv.Itoa(status))
		if status == http.StatusServiceUnavailable && attempt < h.cfg.MaxRetries {
			h.stats.retries.Add(1)
			time.Sleep(time.Duration(10*(attempt+1)) * time.Millisecond)
			continue // back-pressure: nothing was written
		}
		var pr produceResponse
		if status != http.StatusOK && status != http.StatusConflict && status != http.StatusServiceUnavailable {
			b.errors.Add(1)
			h.stats.fail("http_"+strconv.Itoa(status), len(records))
			return
		}
		if jerr := json.Unmarshal(resp, &pr); jerr != nil || len(pr.Results) != 1 {
			b.errors.Add(1)
			h.stats.fail("bad_response", len(records))
			return
		}
		res := pr.Results[0]
		if !res.OK {
			b.errors.Add(1)
			h.stats.fail(res.ErrorType, len(records))
			return
		}
		done := time.Now()
		h.ack(pi, rt, b, res, records, size, intended, done)
		return
	}
}

func (h *Hammer) ack(pi int, rt *Route, b *Broker, res produceResult, records [][]byte, size int,
	intended, done time.Time) {
	n := int64(len(records))
	b.acked.Add(n)
	h.stats.ackedRequests.Add(1)
	h.stats.ackedRecords.Add(n)
	h.stats.ackedBytes.Add(int64(size))
	for {
		cur := h.maxAcked[pi].Load()
		if res.EndOffset <= cur || h.maxAcked[pi].CompareAndSwap(cur, res.EndOffset) {
			break
		}
	}
	if !done.Before(h.measureAt) {
		us := done.Sub(intended).Microseconds()
		h.stats.measuredRecs.Add(n)
		h.stats.measuredBytes.Add(int64(size))
		h.stats.mu.Lock()
		h.stats.lat.Record(us)
		h.stats.latInterval.Record(us)
		h.stats.mu.Unlock()
	}
	if h.acked != nil {
		var buf bytes.Buffer
		for i, r := range records {
			f := fnv.New64a()
			f.Write(r)
			fmt.Fprintf(&buf, "%s\t%d\t%d\t%016x\t%s\n", rt.Topic, rt.Partition,
				res.StartOffset+int64(i), f.Sum64(), b.ID)
		}
		h.ackedMu.Lock()
		h.acked.Write(buf.Bytes())
		h.ackedMu.Unlock()
	}
}

func (h *Hammer) post(b *Broker, path string, payload []byte, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+path, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, data, nil
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
