// Producing: the closed and open loops, one produce request with its retries, and the
// bookkeeping of what was acknowledged.

package main

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
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
	Topic        string `json:"topic"`
	Partition    int    `json:"partition"`
	OK           bool   `json:"ok"`
	StartOffset  int64  `json:"start_offset"`
	EndOffset    int64  `json:"end_offset"`
	Count        int64  `json:"count"`
	Duplicate    bool   `json:"duplicate"`
	ErrorType    string `json:"error_type"`
	Retriable    bool   `json:"retriable"`
	MaybeWritten bool   `json:"maybe_written"`
}

type produceResponse struct {
	Results []produceResult `json:"results"`
}

// entry is one topic-partition entry of a produce request. Its key and records are
// fixed when it is made, so every attempt sends the same bytes and the broker can
// recognise a retry of an append it already committed.
type entry struct {
	pi           int // index into Hammer.produce
	topic        string
	partition    int
	key          string
	records      [][]byte
	size         int
	body         []byte // the entry as JSON
	issuedAt     int64  // keys issued to the partition, this one included, when it was made
	ahead        int64  // other entries of the partition unsettled when it was made
	maybeWritten bool   // an attempt may have committed it (see retry.go)
	why          string // why the last attempt did not settle it
}

// request is the unsettled part of one produce request: its entries share an owner set.
type request struct {
	intended time.Time
	routes   []*Route
	pending  []*entry
	ackedAt  time.Time // last acknowledgement of an entry (zero: none)
}

// recordValues are the entry's records: each value starts with
// `<send time ns, hex>-<worker>-<seq>-<partition>-<i>-`, unique per record of a run.
func (h *Hammer) recordValues(worker int, seq int64, partition int, now time.Time) ([][]byte, int) {
	n := h.cfg.RecordsPerRequest
	out := make([][]byte, n)
	ts := strconv.FormatInt(now.UnixNano(), 16)
	size := 0
	for i := 0; i < n; i++ {
		head := fmt.Sprintf("%s-%d-%d-%d-%d-", ts, worker, seq, partition, i)
		v := bytes.Repeat([]byte{'x'}, max(len(head), h.cfg.RecordBytes))
		copy(v, head)
		out[i] = v
		size += len(v)
	}
	return out, size
}

// idempotencyKey is `<producer>-<seq>-<partition>`, the producer being
// `<hammer start, unix ns, hex>.<worker>`: unique per entry, also across runs on one stack.
func (h *Hammer) idempotencyKey(worker int, seq int64, partition int) string {
	return fmt.Sprintf("%s.%d-%d-%d", h.nonce, worker, seq, partition)
}

func (h *Hammer) newEntry(pi, worker int, seq int64, now time.Time) *entry {
	rt := h.produce[pi]
	e := &entry{pi: pi, topic: rt.Topic, partition: rt.Partition}
	e.records, e.size = h.recordValues(worker, seq, rt.Partition, now)
	if h.cfg.IdempotencyKeys {
		e.key = h.idempotencyKey(worker, seq, rt.Partition)
	}
	e.body = entryJSON(e.topic, e.partition, e.key, e.records)
	st := &h.parts[pi]
	e.issuedAt = st.issued.Add(1)
	e.ahead = st.unsettled.Add(1) - 1
	h.stats.entries.Add(1)
	return e
}

// newRequest takes the next partition in rotation and, with entries_per_request > 1,
// the partitions after it in its owner-set group (each partition at most once).
func (h *Hammer) newRequest(worker int, seq int64, intended time.Time) *request {
	first := int(h.nextPart.Add(1)-1) % len(h.produce)
	group := h.groups[h.groupOf[first]]
	at := slices.Index(group, first)
	req := &request{intended: intended}
	now := time.Now()
	for j := 0; j < min(h.cfg.EntriesPerRequest, len(group)); j++ {
		pi := group[(at+j)%len(group)]
		req.pending = append(req.pending, h.newEntry(pi, worker, seq, now))
		req.routes = append(req.routes, h.produce[pi])
	}
	return req
}

func entryJSON(topic string, partition int, key string, records [][]byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"topic":%q,"partition":%d`, topic, partition)
	if key != "" {
		fmt.Fprintf(&b, `,"idempotency_key":%q`, key)
	}
	b.WriteString(`,"records":[`)
	for i, r := range records {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.Write(r)
		b.WriteByte('"')
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func requestBody(entries []*entry) []byte {
	var b bytes.Buffer
	b.WriteString(`{"topic_partitions":[`)
	for i, e := range entries {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.body)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// produceOnce sends one request and retries what did not settle: the entries the
// broker could not answer for (or that failed retriably) go again, with their keys and
// records, preferably to another owner, until they settle or max_retries is spent.
func (h *Hammer) produceOnce(worker int, seq int64, intended time.Time) {
	req := h.newRequest(worker, seq, intended)
	var last *Broker
	for attempt := 0; ; attempt++ {
		b := h.router.Pick(req.routes, "produce", last)
		if attempt > 0 {
			h.noteRetry(req, attempt, last, b)
		}
		out := h.attempt(b, req.pending)
		h.settle(req, b, out)
		if len(req.pending) > 0 && attempt >= h.cfg.MaxRetries {
			h.giveUp(req)
		}
		h.dropBeyondWindow(req)
		if len(req.pending) == 0 {
			break
		}
		time.Sleep(h.backoff(attempt, req.pending, out.retryAfter))
		last = b
	}
	h.finish(req)
}

// attempt sends the pending entries to b once.
func (h *Hammer) attempt(b *Broker, pending []*entry) outcome {
	timeout := time.Duration(h.cfg.RequestTimeoutS * float64(time.Second))
	b.requests.Add(1)
	h.stats.requests.Add(1)
	b.inflight.Add(1)
	h.stats.inflight.Add(1)
	status, header, resp, err := h.post(b, "/produce", requestBody(pending), timeout)
	b.inflight.Add(-1)
	h.stats.inflight.Add(-1)
	out := classify(status, header, resp, err, pending)
	switch {
	case err == nil:
		h.router.MarkUp(b)
		h.stats.status(strconv.Itoa(status))
	case out.reason == "timeout":
		h.stats.status(out.reason) // a slow broker is not a dead one
	default:
		h.router.MarkDown(b, err.Error())
		h.stats.status(out.reason)
	}
	if out.results == nil || slices.ContainsFunc(out.results, func(r produceResult) bool { return !r.OK }) {
		b.errors.Add(1)
	}
	return out
}

// settle acknowledges the entries answered ok, fails those that cannot succeed, and
// keeps the rest pending with the reason they need another attempt.
func (h *Hammer) settle(req *request, b *Broker, out outcome) {
	var keep []*entry
	for i, e := range req.pending {
		switch {
		case out.results == nil && out.retriable:
			e.why = out.reason
			e.maybeWritten = e.maybeWritten || out.maybeWritten
			keep = append(keep, e)
		case out.results == nil:
			h.fail(e, out.reason)
		case out.results[i].OK:
			h.ack(req, e, b, out.results[i])
		case out.results[i].Retriable:
			e.why = out.results[i].ErrorType
			e.maybeWritten = e.maybeWritten || out.results[i].MaybeWritten
			keep = append(keep, e)
		default:
			h.fail(e, out.results[i].ErrorType)
		}
	}
	req.pending = keep
}

// giveUp fails the entries still pending after the last attempt allowed.
func (h *Hammer) giveUp(req *request) {
	for _, e := range req.pending {
		h.fail(e, e.why)
	}
	req.pending = nil
}

func (h *Hammer) fail(e *entry, kind string) {
	h.stats.fail(kind, len(e.records))
	h.parts[e.pi].unsettled.Add(-1)
}

// ack counts an acknowledged entry once, whether this attempt wrote it or an earlier
// one did (duplicate: the offsets are those of the first append).
func (h *Hammer) ack(req *request, e *entry, b *Broker, res produceResult) {
	n := int64(len(e.records))
	if res.Count != n || res.EndOffset-res.StartOffset+1 != n || res.StartOffset < 1 {
		h.fail(e, "bad_offsets")
		return
	}
	h.parts[e.pi].unsettled.Add(-1)
	done := time.Now()
	req.ackedAt = done
	b.acked.Add(n)
	h.stats.ackedEntries.Add(1)
	h.stats.ackedRecords.Add(n)
	h.stats.ackedBytes.Add(int64(e.size))
	if res.Duplicate {
		h.stats.duplicateAcks.Add(1)
	}
	for {
		cur := h.maxAcked[e.pi].Load()
		if res.EndOffset <= cur || h.maxAcked[e.pi].CompareAndSwap(cur, res.EndOffset) {
			break
		}
	}
	if !done.Before(h.measureAt) {
		h.stats.measuredRecs.Add(n)
		h.stats.measuredBytes.Add(int64(e.size))
	}
	h.writeAcked(e, res.StartOffset, b)
}

func (h *Hammer) writeAcked(e *entry, start int64, b *Broker) {
	if h.acked == nil {
		return
	}
	var buf bytes.Buffer
	for i, r := range e.records {
		f := fnv.New64a()
		f.Write(r)
		fmt.Fprintf(&buf, "%s\t%d\t%d\t%016x\t%s\n", e.topic, e.partition, start+int64(i),
			f.Sum64(), b.ID)
	}
	h.ackedMu.Lock()
	h.acked.Write(buf.Bytes())
	h.ackedMu.Unlock()
}

// finish records the request's latency (intended start to its last acknowledgement)
// when any of its entries was acknowledged.
func (h *Hammer) finish(req *request) {
	if req.ackedAt.IsZero() {
		return
	}
	h.stats.ackedRequests.Add(1)
	if req.ackedAt.Before(h.measureAt) {
		return
	}
	us := req.ackedAt.Sub(req.intended).Microseconds()
	h.stats.mu.Lock()
	h.stats.lat.Record(us)
	h.stats.latInterval.Record(us)
	h.stats.mu.Unlock()
}

func (h *Hammer) post(b *Broker, path string, payload []byte, timeout time.Duration) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL+path, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, data, nil
}
