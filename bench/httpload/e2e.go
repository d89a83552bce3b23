package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"llog.local/loadtest/latency"
)

type E2EResult struct {
	Mode            string         `json:"mode"`
	URL             string         `json:"url"`
	Topic           string         `json:"topic"`
	Partition       int            `json:"partition"`
	RecordBytes     int            `json:"record_bytes"`
	MaxWaitMs       int            `json:"max_wait_ms"`
	WarmupS         float64        `json:"warmup_s"`
	DurationS       float64        `json:"duration_s"`
	ElapsedS        float64        `json:"elapsed_s"`
	Produced        uint64         `json:"produced"`
	ProduceErrors   uint64         `json:"produce_errors"`
	LastAckedOffset int64          `json:"last_acked_offset"`
	Consumed        uint64         `json:"consumed"`
	ConsumeRequests uint64         `json:"consume_requests"`
	ConsumeEmpty    uint64         `json:"consume_empty"`
	ConsumeErrors   uint64         `json:"consume_errors"`
	Missing         int64          `json:"missing"`
	Drained         bool           `json:"drained"`
	ErrorSamples    []string       `json:"error_samples"`
	ProduceLatency  LatencySummary `json:"produce_latency_ms"`
	E2ELatency      LatencySummary `json:"e2e_latency_ms"`
	CPUSeconds      float64        `json:"loadgen_cpu_s"`
	GoVersion       string         `json:"go_version"`
}

type produceResponse struct {
	Results []struct {
		OK        bool   `json:"ok"`
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

const (
	stampDigits  = 19 // a record starts with its send time: ns since the run began
	e2ePartition = 0
)

// e2e is one produce-to-consume latency run: the producer sends one record at a time,
// the consumer long-polls from the start and times each record it sees arrive.
type e2e struct {
	c           *config
	res         *E2EResult
	t0          time.Time
	measureFrom int64  // stamp: records sent before it are warm-up
	pad         string // what follows the stamp in each record, to make it c.size bytes
	samples     errorSamples
	lastAcked   atomic.Int64 // highest acknowledged offset
	prodHist    *latency.Histogram
	consHist    *latency.Histogram
}

func runE2E(c *config) (*E2EResult, error) {
	e := &e2e{c: c, t0: time.Now(), measureFrom: int64(c.warmup), prodHist: latency.New(),
		consHist: latency.New()}
	if c.size > stampDigits+1 {
		e.pad = "-" + asciiRecord(c.size-stampDigits-1, 0)
	}
	e.res = &E2EResult{
		Mode: "e2e", URL: c.url, Topic: c.topic, Partition: e2ePartition, RecordBytes: c.size,
		MaxWaitMs: c.maxWaitMs, WarmupS: c.warmup.Seconds(), DurationS: c.duration.Seconds(),
		GoVersion: runtime.Version(),
	}
	var dials dialCounter
	prodClient := newClient(1, c.timeout, &dials)
	consTimeout := time.Duration(c.maxWaitMs)*time.Millisecond + 15*time.Second
	consClient := newClient(1, consTimeout, &dials)
	defer prodClient.CloseIdleConnections()
	defer consClient.CloseIdleConnections()
	cpu0 := cpuSeconds()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	producerDone, consumerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(consumerDone)
		e.consume(ctx, consClient, producerDone)
	}()
	for end := c.warmup + c.duration; time.Since(e.t0) < end; {
		e.produceOnce(prodClient)
	}
	close(producerDone)
	select {
	case <-consumerDone:
	case <-time.After(c.drain + consTimeout + 5*time.Second):
		cancel()
		<-consumerDone
	}
	res := e.res
	res.ElapsedS = time.Since(e.t0).Seconds()
	res.LastAckedOffset = e.lastAcked.Load()
	res.Missing = int64(res.Produced) - int64(res.Consumed)
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
	*count++
	e.samples.add(fmt.Sprintf(format, args...))
	time.Sleep(e.c.backoff)
}

func (e *e2e) produceOnce(client *http.Client) {
	sent := e.stamp()
	rec := fmt.Sprintf("%0*d", stampDigits, sent) + e.pad
	body := produceBody(e.c.topic, e2ePartition, []string{rec})
	resp, raw, err := postJSON(context.Background(), client, e.c.url+"/produce", body, 1<<20)
	if resp == nil {
		e.fail(&e.res.ProduceErrors, "produce: %v", err)
		return
	}
	took := time.Duration(e.stamp() - sent)
	var pr produceResponse
	if err == nil && resp.StatusCode == http.StatusOK {
		err = json.Unmarshal(raw, &pr)
	}
	if err != nil || resp.StatusCode != http.StatusOK || len(pr.Results) != 1 ||
		!pr.Results[0].OK {
		e.fail(&e.res.ProduceErrors, "produce: status %d: %v %.200s", resp.StatusCode, err, raw)
		return
	}
	e.res.Produced++
	if end := pr.Results[0].EndOffset; end > e.lastAcked.Load() {
		e.lastAcked.Store(end)
	}
	if sent >= e.measureFrom {
		e.prodHist.RecordDuration(took)
	}
}

// consume follows the partition from its start until, once the producer is done, it has
// read past the last acknowledged offset (drained) or c.drain has passed.
func (e *e2e) consume(ctx context.Context, client *http.Client, producerDone <-chan struct{}) {
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
			last := e.lastAcked.Load()
			if fetch > last && last > 0 || last == 0 {
				e.res.Drained = true
				return
			}
			if time.Now().After(drainDeadline) {
				return
			}
		}
		fetch = e.consumeOnce(ctx, client, fetch, drainDeadline)
	}
}

// consumeOnce long-polls once from fetch and returns the offset to fetch next.
func (e *e2e) consumeOnce(ctx context.Context, client *http.Client, fetch int64,
	drainDeadline time.Time) int64 {
	body, _ := json.Marshal(map[string]any{
		"topic_partitions": []map[string]any{
			{"topic": e.c.topic, "partition": e2ePartition, "fetch_offset": fetch},
		},
		"max_wait_ms": e.c.maxWaitMs, "min_bytes": 1,
	})
	rctx, rcancel := ctx, context.CancelFunc(func() {})
	if !drainDeadline.IsZero() {
		rctx, rcancel = context.WithDeadline(ctx, drainDeadline)
	}
	defer rcancel()
	e.res.ConsumeRequests++
	resp, raw, err := postJSON(rctx, client, e.c.url+"/consume", body, 64<<20)
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
	var cr consumeResponse
	if err := json.Unmarshal(raw, &cr); err != nil || len(cr.Results) != 1 {
		e.fail(&e.res.ConsumeErrors, "consume: bad body: %v %.200s", err, raw)
		return fetch
	}
	r := cr.Results[0]
	if !r.OK {
		e.fail(&e.res.ConsumeErrors, "consume: %s: %s", r.ErrorType, r.Error)
		return fetch
	}
	e.received(r, now)
	return max(fetch, r.NextOffset)
}

// received counts the records of one answer and times the ones sent after the warm-up.
func (e *e2e) received(r consumeResult, now int64) {
	if len(r.Records) == 0 {
		e.res.ConsumeEmpty++
	}
	for _, rec := range r.Records {
		e.res.Consumed++
		if rec.Value == nil || len(*rec.Value) < stampDigits {
			continue
		}
		sent, err := strconv.ParseInt((*rec.Value)[:stampDigits], 10, 64)
		if err != nil || sent < e.measureFrom {
			continue
		}
		e.consHist.RecordDuration(time.Duration(now - sent))
	}
}
