package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
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
}

// worker is one connection sending produce requests back to back; its counters are its
// own until the run ends.
type worker struct {
	requests, ok, s503, other, errs uint64
	statuses                        map[int]uint64
	hist                            *latency.Histogram
}

// throughput is what the workers of one run share.
type throughput struct {
	c        *config
	url      string
	bodies   [][]byte // produce bodies, sent in turn (throughputBodies)
	sizes    []int64  // the record bytes of each body
	ctype    string
	next     atomic.Uint64
	client   *http.Client
	samples  errorSamples
	deadline time.Time
	acked    atomic.Int64 // record bytes acknowledged, for -total-mib
}

func runThroughput(c *config) (*ThroughputResult, error) {
	t := &throughput{c: c, url: c.url + c.path}
	t.bodies, t.sizes, t.ctype = throughputBodies(c)
	var dials dialCounter
	t.client = newClient(c.connections, c.timeout, &dials)
	defer t.client.CloseIdleConnections()
	workers := make([]*worker, c.connections)
	cpu0 := cpuSeconds()
	start := time.Now()
	t.deadline = start.Add(c.duration)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{statuses: map[int]uint64{}, hist: latency.New()}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.work(w)
		}()
	}
	wg.Wait()
	res := t.result(workers, time.Since(start).Seconds())
	res.NewConnections = dials.n.Load()
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

// throughputBodies are the produce bodies the connections send in turn, the record bytes
// of each, and their content type. Each body has c.entries entries: body p starts at
// partition c.written[p mod len(c.written)] and takes the ones after it, wrapping around.
// Synthetic records make one body per partition written; records from -records-file
// make as many bodies as it takes to send every record of the file once per round.
func throughputBodies(c *config) ([][]byte, []int64, string) {
	n := len(c.written)
	perBody := c.records * c.entries
	if len(c.corpus) > 0 {
		// Whole rounds over the partitions, so each is written alike.
		n *= max(1, (len(c.corpus)+perBody*n-1)/(perBody*n))
	}
	bodies := make([][]byte, n)
	sizes := make([]int64, n)
	next := 0 // the corpus record to take next
	var ctype string
	for p := range bodies {
		entries := make([]entry, c.entries)
		for e := range entries {
			part := c.written[(p+e)%len(c.written)]
			recs := make([][]byte, c.records)
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
		}
		bodies[p], ctype = requestBody(c.format, c.topic, entries, extras{c.keyBytes, c.headers})
	}
	return bodies, sizes, ctype
}

func (t *throughput) work(w *worker) {
	buf := make([]byte, 32*1024)
	for time.Now().Before(t.deadline) &&
		(t.c.totalMiB == 0 || t.acked.Load() < int64(t.c.totalMiB)<<20) {
		turn := (t.next.Add(1) - 1) % uint64(len(t.bodies))
		body, perRequest := t.bodies[turn], t.sizes[turn]
		t0 := time.Now()
		req, err := http.NewRequest(http.MethodPost, t.url, bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", t.ctype)
		resp, err := t.client.Do(req)
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
			t.acked.Add(perRequest)
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

// fail counts a request without an answer, keeps a sample of why, and backs off.
func (t *throughput) fail(w *worker, why string) {
	w.errs++
	t.samples.add(why)
	time.Sleep(t.c.backoff)
}

func (t *throughput) result(workers []*worker, elapsed float64) *ThroughputResult {
	c := t.c
	res := &ThroughputResult{
		Mode: "throughput", URL: t.url, Connections: c.connections, Partitions: c.partitions,
		RecordsPerRequest: c.records, EntriesPerRequest: c.entries, Format: c.format,
		RecordBytes: c.size, RequestBodyBytes: len(t.bodies[0]),
		DurationS: c.duration.Seconds(), ElapsedS: elapsed, Statuses: map[string]uint64{},
		GoVersion: runtime.Version(),
	}
	if c.partitionSet != "" {
		res.PartitionSet = c.written
	}
	hist := latency.New()
	for _, w := range workers {
		res.Requests += w.requests
		res.OK += w.ok
		res.Status503 += w.s503
		res.OtherStatus += w.other
		res.Errors += w.errs
		for code, n := range w.statuses {
			res.Statuses[strconv.Itoa(code)] += n
		}
		hist.Merge(w.hist)
	}
	res.ErrorSamples = t.samples.list()
	res.RecordsAcked = res.OK * uint64(c.records) * uint64(c.entries)
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
