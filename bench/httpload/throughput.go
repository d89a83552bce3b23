package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"llog.local/loadtest/latency"
)

type ThroughputResult struct {
	Mode              string            `json:"mode"`
	URL               string            `json:"url"`
	Connections       int               `json:"connections"`
	Partitions        int               `json:"partitions"`
	PartitionSet      []int             `json:"partition_set,omitempty"`
	RecordsPerRequest int               `json:"records_per_request"`
	EntriesPerRequest int               `json:"entries_per_request"`
	Format            string            `json:"format"`
	RecordBytes       int               `json:"record_bytes"`
	RequestBodyBytes  int               `json:"request_body_bytes"`
	RateRequestsPerS  float64           `json:"rate_requests_per_s"` // -rate; 0: back to back
	DurationS         float64           `json:"duration_s"`
	ElapsedS          float64           `json:"elapsed_s"`
	Requests          uint64            `json:"requests"`
	OK                uint64            `json:"ok"`
	Status503         uint64            `json:"status_503"`
	OtherStatus       uint64            `json:"other_status"`
	Statuses          map[string]uint64 `json:"statuses"`
	Errors            uint64            `json:"errors"`
	ErrorSamples      []string          `json:"error_samples"`
	RecordsAcked      uint64            `json:"records_acked"`
	BytesAcked        uint64            `json:"bytes_acked"`
	RequestsPerS      float64           `json:"requests_per_s"`
	RecordsPerS       float64           `json:"records_per_s"`
	MiBPerS           float64           `json:"mib_per_s"`
	Latency           LatencySummary    `json:"latency_ms"`
	NewConnections    int64             `json:"new_connections"`
	CPUSeconds        float64           `json:"loadgen_cpu_s"`
	GoVersion         string            `json:"go_version"`
	// -route members: each member URL with its partitions, and the requests sent again
	// through -url because their member did not answer.
	Routes    []RouteResult `json:"routes,omitempty"`
	Fallbacks uint64        `json:"fallbacks"`
}

type RouteResult struct {
	URL               string `json:"url"`
	Partitions        []int  `json:"partitions"`
	RecordsPerRequest uint64 `json:"records_per_request"`
}

// worker is one connection sending produce requests back to back; its counters are its
// own until the run ends.
type worker struct {
	requests, ok, s503, other, errs uint64
	records                         uint64 // acknowledged
	statuses                        map[int]uint64
	hist                            *latency.Histogram
}

// target is where some connections send: a URL and the bodies they send it in turn.
type target struct {
	url        string
	partitions []int
	bodies     [][]byte // produce bodies, sent in turn (throughputBodies)
	sizes      []int64  // the record bytes of each body
	records    []uint64 // the records of each body
	next       atomic.Uint64
}

// throughput is what the workers of one run share.
type throughput struct {
	c         *config
	targets   []*target
	fallback  string // -route members: where a request goes when its member does not answer
	ctype     string
	client    *http.Client
	samples   errorSamples
	deadline  time.Time
	acked     atomic.Int64 // record bytes acknowledged, for -total-mib
	fallbacks atomic.Uint64
	// -rate: each request's due time (then the connections send at that rate, not back
	// to back); closed when the run ends. nil without -rate.
	due <-chan time.Time
}

func runThroughput(c *config) (*ThroughputResult, error) {
	t := &throughput{c: c}
	if err := t.plan(); err != nil {
		return nil, err
	}
	var dials dialCounter
	t.client = newClient(c.connections, c.timeout, &dials)
	defer t.client.CloseIdleConnections()
	workers := make([]*worker, c.connections)
	cpu0 := cpuSeconds()
	start := time.Now()
	t.deadline = start.Add(c.duration)
	if c.rate > 0 {
		t.due = pace(start, c.rate, t.deadline)
	}
	var wg sync.WaitGroup
	for i, to := range connectionTargets(t.targets, c.connections) {
		w := &worker{statuses: map[int]uint64{}, hist: latency.New()}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.work(w, to)
		}()
	}
	wg.Wait()
	res := t.result(workers, time.Since(start).Seconds())
	res.NewConnections = dials.n.Load()
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

// plan makes the targets: -url with every partition written, or with -route members one
// per preferred member's URL with its partitions, each request carrying as many records
// as one over every partition would (a client that gathers each broker's records).
func (t *throughput) plan() error {
	c := t.c
	if c.route != "members" {
		to := &target{url: c.url + c.path, partitions: c.written}
		to.bodies, to.sizes, to.records, t.ctype = throughputBodies(c)
		t.targets = []*target{to}
		return nil
	}
	m, err := fetchClusterMap(c.url, c.timeout)
	if err != nil {
		return err
	}
	plan, err := planRoutes(m, c.topic, c.written)
	if err != nil {
		return err
	}
	if len(plan.urls) > c.connections {
		return fmt.Errorf("-route members: %d connections for %d brokers; give each one "+
			"at least", c.connections, len(plan.urls))
	}
	t.planFrom(plan)
	return nil
}

func (t *throughput) planFrom(plan routePlan) {
	c := t.c
	t.fallback = c.url + c.path
	perRequest := c.records * c.entries
	for i, u := range plan.urls {
		rc := *c
		rc.written = plan.partitions[i]
		rc.entries = min(c.entries, len(rc.written))
		rc.records = perRequest / rc.entries      // and one more in the first entries:
		rc.extraRecords = perRequest % rc.entries // perRequest in every request
		to := &target{url: strings.TrimRight(u, "/") + c.path, partitions: rc.written}
		to.bodies, to.sizes, to.records, t.ctype = throughputBodies(&rc)
		t.targets = append(t.targets, to)
	}
}

// connectionTargets gives each connection a target, in proportion to their partitions.
func connectionTargets(targets []*target, connections int) []*target {
	out := make([]*target, connections)
	given := make([]int, len(targets))
	for i := range out {
		best := 0
		for j, to := range targets { // the least served per partition
			if given[j]*len(targets[best].partitions) < given[best]*len(to.partitions) {
				best = j
			}
		}
		given[best]++
		out[i] = targets[best]
	}
	return out
}

// throughputBodies are the produce bodies the connections send in turn, the record bytes
// of each, and their content type. Each body has c.entries entries: body p starts at
// partition c.written[p mod len(c.written)] and takes the ones after it, wrapping around.
// Synthetic records make one body per partition written; records from -records-file
// make as many bodies as it takes to send every record of the file once per round.
func throughputBodies(c *config) ([][]byte, []int64, []uint64, string) {
	n := len(c.written)
	perBody := c.records*c.entries + c.extraRecords
	if len(c.corpus) > 0 {
		// Whole rounds over the partitions, so each is written alike.
		n *= max(1, (len(c.corpus)+perBody*n-1)/(perBody*n))
	}
	bodies := make([][]byte, n)
	sizes := make([]int64, n)
	records := make([]uint64, n)
	next := 0 // the corpus record to take next
	var ctype string
	for p := range bodies {
		entries := make([]entry, c.entries)
		for e := range entries {
			part := c.written[(p+e)%len(c.written)]
			n := c.records
			if e < c.extraRecords {
				n++
			}
			recs := make([][]byte, n)
			for i := range recs {
				if len(c.corpus) > 0 {
					recs[i] = c.corpus[next%len(c.corpus)]
					next++
				} else {
					recs[i] = []byte(asciiRecord(c.size, part+i))
				}
				sizes[p] += int64(len(recs[i]))
			}
			entries[e] = entry{partition: part, records: recs}
			records[p] += uint64(len(recs))
		}
		bodies[p], ctype = requestBody(c.format, c.topic, entries, extras{c.keyBytes, c.headers})
	}
	return bodies, sizes, records, ctype
}

func (t *throughput) work(w *worker, to *target) {
	buf := make([]byte, 32*1024)
	for time.Now().Before(t.deadline) &&
		(t.c.totalMiB == 0 || t.acked.Load() < int64(t.c.totalMiB)<<20) {
		t0 := time.Now()
		if t.due != nil {
			at, more := <-t.due
			if !more {
				return
			}
			t0 = at // a request sent late counts from when it was due: no coordinated omission
		}
		turn := (to.next.Add(1) - 1) % uint64(len(to.bodies))
		resp, err := t.send(to.url, to.bodies[turn])
		if err != nil && t.fallback != "" && notConnected(err) {
			// The member took no connection, so nothing was sent (the bodies carry no
			// idempotency keys: a request that may have arrived is never sent twice).
			t.fallbacks.Add(1)
			resp, err = t.send(t.fallback, to.bodies[turn])
		}
		w.requests++
		if err != nil {
			t.fail(w, err.Error())
			continue
		}
		var head []byte
		if resp.StatusCode != http.StatusOK {
			head, _ = io.ReadAll(io.LimitReader(resp.Body, 300))
		}
		_, err = io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		if err != nil {
			t.fail(w, "reading response: "+err.Error())
			continue
		}
		w.statuses[resp.StatusCode]++
		switch resp.StatusCode {
		case http.StatusOK:
			w.ok++
			w.records += to.records[turn]
			t.acked.Add(to.sizes[turn])
			w.hist.RecordDuration(time.Since(t0))
		case http.StatusServiceUnavailable:
			w.s503++
			time.Sleep(t.c.backoff)
		default:
			w.other++
			t.samples.add(fmt.Sprintf("status %d: %s", resp.StatusCode, head))
		}
	}
}

// pace gives the due time of each request at rate requests per second from start until
// the deadline, then closes. A due time waits in the channel while every connection is
// busy and keeps its value, so the lateness counts in that request's latency.
func pace(start time.Time, rate float64, deadline time.Time) <-chan time.Time {
	due := make(chan time.Time, 1024)
	go func() {
		defer close(due)
		interval := float64(time.Second) / rate
		for i := 0; ; i++ {
			at := start.Add(time.Duration(float64(i) * interval))
			if !at.Before(deadline) {
				return
			}
			if wait := time.Until(at); wait > 0 {
				time.Sleep(wait)
			}
			due <- at
		}
	}()
	return due
}

// notConnected: the request failed while dialing, before any byte of it was sent.
func notConnected(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func (t *throughput) send(url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", t.ctype)
	return t.client.Do(req)
}

// fail counts a request without an answer, keeps a sample of why, and backs off.
func (t *throughput) fail(w *worker, why string) {
	w.errs++
	t.samples.add(why)
	time.Sleep(t.c.backoff)
}

func (t *throughput) result(workers []*worker, elapsed float64) *ThroughputResult {
	c := t.c
	res := &ThroughputResult{
		Mode: "throughput", URL: t.targets[0].url, Connections: c.connections,
		Partitions: c.partitions, RecordsPerRequest: c.records, EntriesPerRequest: c.entries,
		Format: c.format, RecordBytes: c.size, RequestBodyBytes: len(t.targets[0].bodies[0]),
		DurationS: c.duration.Seconds(), ElapsedS: elapsed, Statuses: map[string]uint64{},
		GoVersion: runtime.Version(), RateRequestsPerS: c.rate,
	}
	if c.partitionSet != "" {
		res.PartitionSet = c.written
	}
	if t.fallback != "" {
		res.Fallbacks = t.fallbacks.Load()
		for _, to := range t.targets {
			res.Routes = append(res.Routes, RouteResult{URL: to.url, Partitions: to.partitions,
				RecordsPerRequest: to.records[0]})
		}
	}
	hist := latency.New()
	for _, w := range workers {
		res.Requests += w.requests
		res.OK += w.ok
		res.Status503 += w.s503
		res.OtherStatus += w.other
		res.Errors += w.errs
		res.RecordsAcked += w.records
		for code, n := range w.statuses {
			res.Statuses[strconv.Itoa(code)] += n
		}
		hist.Merge(w.hist)
	}
	res.ErrorSamples = t.samples.list()
	res.BytesAcked = uint64(t.acked.Load())
	if res.RecordsAcked > 0 {
		res.RecordBytes = int(res.BytesAcked / res.RecordsAcked) // the mean, from a corpus
	}
	res.RequestsPerS = float64(res.OK) / elapsed
	res.RecordsPerS = float64(res.RecordsAcked) / elapsed
	res.MiBPerS = float64(res.BytesAcked) / elapsed / (1 << 20)
	res.Latency = summarize(hist)
	return res
}
