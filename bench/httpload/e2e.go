package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"llog.local/loadtest/latency"
)

type E2EResult struct {
	Mode              string         `json:"mode"`
	URL               string         `json:"url"`
	ConsumeURL        string         `json:"consume_url"`
	Topic             string         `json:"topic"`
	Partitions        int            `json:"partitions"`
	EntriesPerRequest int            `json:"entries_per_request"`
	RecordsPerEntry   int            `json:"records_per_entry"`
	RecordBytes       int            `json:"record_bytes"`
	Format            string         `json:"format"`
	RateRequestsPerS  float64        `json:"rate_requests_per_s"`
	MaxWaitMs         int            `json:"max_wait_ms"`
	WarmupS           float64        `json:"warmup_s"`
	DurationS         float64        `json:"duration_s"`
	ElapsedS          float64        `json:"elapsed_s"`
	Produced          uint64         `json:"produced"`
	ProduceRequests   uint64         `json:"produce_requests"`
	ProduceErrors     uint64         `json:"produce_errors"`
	Consumed          uint64         `json:"consumed"`
	ConsumeRequests   uint64         `json:"consume_requests"`
	ConsumeEmpty      uint64         `json:"consume_empty"`
	ConsumeErrors     uint64         `json:"consume_errors"`
	Missing           int64          `json:"missing"`
	Drained           bool           `json:"drained"`
	ErrorSamples      []string       `json:"error_samples"`
	ProduceLatency    LatencySummary `json:"produce_latency_ms"`
	E2ELatency        LatencySummary `json:"e2e_latency_ms"`
	CPUSeconds        float64        `json:"loadgen_cpu_s"`
	GoVersion         string         `json:"go_version"`
}

type produceResponse struct {
	Results []struct {
		OK        bool   `json:"ok"`
		Partition int    `json:"partition"`
		EndOffset int64  `json:"end_offset"`
		ErrorType string `json:"error_type"`
	} `json:"results"`
}

type consumeResult struct {
	OK         bool   `json:"ok"`
	NextOffset int64  `json:"next_offset"`
	ErrorType  string `json:"error_type"`
	Error      string `json:"error"`
	Records    []struct {
		Offset int64   `json:"offset"`
		Value  *string `json:"value"`
	} `json:"records"`
}

type consumeResponse struct {
	Results []consumeResult `json:"results"`
}

// A record starts with its send time: ns since the run began (with -rate, the time its
// request was due, so queueing in the generator counts too: no coordinated omission).
const stampDigits = 19

// e2e is one produce-to-consume latency run: producers send to -url (one request at a
// time, or -rate requests per second over -connections), one consumer per partition
// long-polls -consume-url and times each record it sees arrive.
type e2e struct {
	c           *config
	res         *E2EResult
	partitions  int
	t0          time.Time
	measureFrom int64  // stamp: records sent before it are warm-up
	pad         string // what follows the stamp in each record, to make it c.size bytes
	samples     errorSamples
	mu          sync.Mutex // guards the counters and histograms below
	lastAcked   []atomic.Int64
	next        atomic.Uint64 // round robin over partitions
	prodHist    *latency.Histogram
	consHist    *latency.Histogram
}

func runE2E(c *config) (*E2EResult, error) {
	parts := 1
	if c.rate > 0 {
		parts = c.partitions
	}
	e := &e2e{c: c, t0: time.Now(), measureFrom: int64(c.warmup), partitions: parts,
		lastAcked: make([]atomic.Int64, parts), prodHist: latency.New(),
		consHist: latency.New()}
	if c.size > stampDigits+1 {
		e.pad = "-" + asciiRecord(c.size-stampDigits-1, 0)
	}
	e.res = &E2EResult{
		Mode: "e2e", URL: c.url, ConsumeURL: c.consumeURL, Topic: c.topic, Partitions: parts,
		EntriesPerRequest: min(c.entries, parts), RecordsPerEntry: 1, RecordBytes: c.size,
		Format: c.format, RateRequestsPerS: c.rate, MaxWaitMs: c.maxWaitMs,
		WarmupS: c.warmup.Seconds(), DurationS: c.duration.Seconds(),
		GoVersion: runtime.Version(),
	}
	if c.rate > 0 {
		e.res.RecordsPerEntry = c.records
	}
	var dials dialCounter
	senders := 1
	if c.rate > 0 {
		senders = c.connections
	}
	prodClient := newClient(senders, c.timeout, &dials)
	consTimeout := time.Duration(c.maxWaitMs)*time.Millisecond + 15*time.Second
	consClient := newClient(parts, consTimeout, &dials)
	defer prodClient.CloseIdleConnections()
	defer consClient.CloseIdleConnections()
	cpu0 := cpuSeconds()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	producerDone := make(chan struct{})
	var consumers sync.WaitGroup
	for p := 0; p < parts; p++ {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			e.consume(ctx, consClient, p, producerDone)
		}()
	}
	e.produce(prodClient, senders)
	close(producerDone)
	consumersDone := make(chan struct{})
	go func() { consumers.Wait(); close(consumersDone) }()
	select {
	case <-consumersDone:
	case <-time.After(c.drain + consTimeout + 5*time.Second):
		cancel()
		<-consumersDone
	}
	res := e.res
	res.ElapsedS = time.Since(e.t0).Seconds()
	res.Missing = int64(res.Produced) - int64(res.Consumed)
	res.Drained = res.Missing == 0
	res.ProduceLatency = summarize(e.prodHist)
	res.E2ELatency = summarize(e.consHist)
	res.ErrorSamples = e.samples.list()
	sort.Strings(res.ErrorSamples)
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

func (e *e2e) stamp() int64 { return int64(time.Since(e.t0)) } // monotonic

// fail counts a failed request in count, keeps a sample of why, and backs off.
func (e *e2e) fail(count *uint64, format string, args ...any) {
	e.mu.Lock()
	*count++
	e.mu.Unlock()
	e.samples.add(fmt.Sprintf(format, args...))
	time.Sleep(e.c.backoff)
}

// produce sends until the run ends: back to back, or each request at its due time.
func (e *e2e) produce(client *http.Client, senders int) {
	end := int64(e.c.warmup + e.c.duration)
	if e.c.rate <= 0 {
		for e.stamp() < end {
			e.produceOnce(client, e.stamp())
		}
		return
	}
	due := make(chan int64, 1024)
	go func() {
		defer close(due)
		interval := float64(time.Second) / e.c.rate
		for i := 0; ; i++ {
			at := int64(float64(i) * interval)
			if at >= end {
				return
			}
			if wait := time.Duration(at - e.stamp()); wait > 0 {
				time.Sleep(wait)
			}
			due <- at
		}
	}()
	var wg sync.WaitGroup
	for i := 0; i < senders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				e.produceOnce(client, at)
			}
		}()
	}
	wg.Wait()
}

func (e *e2e) produceOnce(client *http.Client, sent int64) {
	rec := []byte(fmt.Sprintf("%0*d", stampDigits, sent) + e.pad)
	entries := make([]entry, e.res.EntriesPerRequest)
	for i := range entries {
		recs := make([][]byte, e.res.RecordsPerEntry)
		for j := range recs {
			recs[j] = rec
		}
		entries[i] = entry{partition: int(e.next.Add(1)-1) % e.partitions, records: recs}
	}
	body, ctype := requestBody(e.c.format, e.c.topic, entries, extras{e.c.keyBytes, e.c.headers})
	resp, raw, err := post(context.Background(), client, e.c.url+"/produce", body, ctype, "",
		1<<20)
	if resp == nil {
		e.fail(&e.res.ProduceErrors, "produce: %v", err)
		return
	}
	took := time.Duration(e.stamp() - sent)
	var pr produceResponse
	if err == nil && resp.StatusCode == http.StatusOK {
		err = json.Unmarshal(raw, &pr)
	}
	if err != nil || resp.StatusCode != http.StatusOK || len(pr.Results) != len(entries) {
		e.fail(&e.res.ProduceErrors, "produce: status %d: %v %.200s", resp.StatusCode, err, raw)
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.res.ProduceRequests++
	for _, r := range pr.Results {
		if !r.OK {
			continue
		}
		e.res.Produced += uint64(e.res.RecordsPerEntry)
		acked := &e.lastAcked[r.Partition%e.partitions]
		if r.EndOffset > acked.Load() {
			acked.Store(r.EndOffset)
		}
	}
	if sent >= e.measureFrom {
		e.prodHist.RecordDuration(took)
	}
}

// consume follows one partition from its start until, once the producers are done, it
// has read past the last acknowledged offset (drained) or c.drain has passed.
func (e *e2e) consume(ctx context.Context, client *http.Client, partition int,
	producerDone <-chan struct{}) {
	fetch := int64(0)
	var drainDeadline time.Time
	for {
		select {
		case <-producerDone:
			if drainDeadline.IsZero() {
				drainDeadline = time.Now().Add(e.c.drain)
			}
		default:
		}
		if !drainDeadline.IsZero() {
			last := e.lastAcked[partition].Load()
			if fetch > last && last > 0 || last == 0 {
				return
			}
			if time.Now().After(drainDeadline) {
				return
			}
		}
		fetch = e.consumeOnce(ctx, client, partition, fetch, drainDeadline)
	}
}

// consumeOnce long-polls once from fetch and returns the offset to fetch next.
func (e *e2e) consumeOnce(ctx context.Context, client *http.Client, partition int,
	fetch int64, drainDeadline time.Time) int64 {
	body, _ := json.Marshal(map[string]any{
		"topic_partitions": []map[string]any{
			{"topic": e.c.topic, "partition": partition, "fetch_offset": fetch},
		},
		"max_wait_ms": e.c.maxWaitMs, "min_bytes": 1,
	})
	rctx, rcancel := ctx, context.CancelFunc(func() {})
	if !drainDeadline.IsZero() {
		rctx, rcancel = context.WithDeadline(ctx, drainDeadline)
	}
	defer rcancel()
	accept := ""
	if e.c.format == "binary" {
		accept = binaryRecordsType
	}
	resp, raw, err := post(rctx, client, e.c.consumeURL+"/consume", body, "application/json",
		accept, 64<<20)
	e.mu.Lock()
	e.res.ConsumeRequests++
	e.mu.Unlock()
	if resp == nil {
		if ctx.Err() == nil && rctx.Err() == nil { // the drain deadline ends the loop
			e.fail(&e.res.ConsumeErrors, "consume: %v", err)
		}
		return fetch
	}
	now := e.stamp()
	if err != nil || resp.StatusCode != http.StatusOK {
		e.fail(&e.res.ConsumeErrors, "consume: status %d: %v %.200s", resp.StatusCode, err, raw)
		return fetch
	}
	values, next, ok := e.decode(raw)
	if !ok {
		e.fail(&e.res.ConsumeErrors, "consume: bad body: %.200s", raw)
		return fetch
	}
	e.received(values, now)
	return max(fetch, next)
}

// decode gives the record values and the next offset of a one-partition answer.
func (e *e2e) decode(raw []byte) ([]string, int64, bool) {
	if e.c.format == "binary" {
		results, ok := parseLLR1(raw, true)
		if !ok || len(results) != 1 || !results[0].ok {
			return nil, 0, false
		}
		values := make([]string, len(results[0].values))
		for i, v := range results[0].values {
			values[i] = string(v[:min(len(v), stampDigits)])
		}
		return values, results[0].nextOffset, true
	}
	var cr consumeResponse
	if err := json.Unmarshal(raw, &cr); err != nil || len(cr.Results) != 1 || !cr.Results[0].OK {
		return nil, 0, false
	}
	values := make([]string, len(cr.Results[0].Records))
	for i, rec := range cr.Results[0].Records {
		if rec.Value != nil {
			values[i] = *rec.Value
		}
	}
	return values, cr.Results[0].NextOffset, true
}

// received counts the records of one answer and times the ones sent after the warm-up.
func (e *e2e) received(values []string, now int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(values) == 0 {
		e.res.ConsumeEmpty++
	}
	for _, v := range values {
		// Only this run's records count: a topic may hold records written before it.
		if len(v) < stampDigits {
			continue
		}
		sent, err := strconv.ParseInt(v[:stampDigits], 10, 64)
		if err != nil {
			continue
		}
		e.res.Consumed++
		if sent < e.measureFrom {
			continue
		}
		e.consHist.RecordDuration(time.Duration(now - sent))
	}
}
