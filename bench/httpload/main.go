// httpload: a closed-loop HTTP load generator for the llog broker (stdlib only).
//
// Mode "throughput" (default): N connections, each sending POST {path} back to back for
// a fixed duration, with produce bodies of R records of S bytes, round-robin over P
// partitions. Counts statuses and errors, acknowledged records and bytes, and latency
// percentiles.
//
// Mode "e2e": one producer connection sends one record at a time carrying its send time
// while one long-poll consumer (POST /consume, following next_offset) measures the
// produce-to-consume latency.
//
// Both print one JSON object on stdout; diagnostics go to stderr.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"llog.local/loadtest/latency"
)

type config struct {
	url         string
	path        string
	mode        string
	connections int
	duration    time.Duration
	warmup      time.Duration
	topic       string
	partitions  int
	records     int
	size        int
	timeout     time.Duration
	backoff     time.Duration
	maxWaitMs   int
	drain       time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.url, "url", "http://127.0.0.1:8080", "base URL of the server")
	flag.StringVar(&c.path, "path", "/produce", "produce path (throughput mode)")
	flag.StringVar(&c.mode, "mode", "throughput", "throughput or e2e")
	flag.IntVar(&c.connections, "connections", 32, "concurrent connections (throughput mode)")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "measured duration")
	flag.DurationVar(&c.warmup, "warmup", 0, "e2e mode: unmeasured time before the measurement")
	flag.StringVar(&c.topic, "topic", "bench", "topic name")
	flag.IntVar(&c.partitions, "partitions", 8, "partitions, round-robin (throughput mode)")
	flag.IntVar(&c.records, "records", 10, "records per produce request (throughput mode)")
	flag.IntVar(&c.size, "size", 1024, "bytes per record")
	flag.DurationVar(&c.timeout, "timeout", 30*time.Second, "timeout of one produce request")
	flag.DurationVar(&c.backoff, "backoff", 20*time.Millisecond,
		"pause of a connection after a 503 or a transport error")
	flag.IntVar(&c.maxWaitMs, "max-wait-ms", 5000, "e2e mode: consume long-poll max_wait_ms")
	flag.DurationVar(&c.drain, "drain", 15*time.Second,
		"e2e mode: how long the consumer may lag behind the producer's last record")
	flag.Parse()

	if err := validate(&c); err != nil {
		fmt.Fprintf(os.Stderr, "httpload: %v\n", err)
		os.Exit(2)
	}
	var out any
	var err error
	switch c.mode {
	case "throughput":
		out, err = runThroughput(&c)
	case "e2e":
		out, err = runE2E(&c)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "httpload: %v\n", err)
		os.Exit(1)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "httpload: %v\n", err)
		os.Exit(1)
	}
}

var topicRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

func validate(c *config) error {
	switch {
	case c.mode != "throughput" && c.mode != "e2e":
		return fmt.Errorf("-mode must be throughput or e2e, not %q", c.mode)
	case c.connections < 1:
		return errors.New("-connections must be at least 1")
	case c.duration <= 0:
		return errors.New("-duration must be positive")
	case c.warmup < 0:
		return errors.New("-warmup must not be negative")
	case !topicRe.MatchString(c.topic) || c.topic == "." || c.topic == "..":
		return fmt.Errorf("-topic %q is not a valid topic name", c.topic)
	case c.partitions < 1:
		return errors.New("-partitions must be at least 1")
	case c.records < 1:
		return errors.New("-records must be at least 1")
	case c.size < 1:
		return errors.New("-size must be at least 1")
	case c.timeout <= 0:
		return errors.New("-timeout must be positive")
	case c.maxWaitMs < 0:
		return errors.New("-max-wait-ms must not be negative")
	case !strings.HasPrefix(c.path, "/"):
		return errors.New("-path must start with /")
	}
	c.url = strings.TrimRight(c.url, "/")
	return nil
}

// ---- shared ----------------------------------------------------------------------

type dialCounter struct{ n atomic.Int64 }

func newClient(conns int, timeout time.Duration, dials *dialCounter) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.n.Add(1)
			return dialer.DialContext(ctx, network, addr)
		},
		MaxIdleConns:          conns,
		MaxIdleConnsPerHost:   conns,
		MaxConnsPerHost:       conns,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// asciiRecord is a JSON-safe ASCII string of n bytes.
func asciiRecord(n int, seed int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[(i+seed)%len(alphabet)]
	}
	return string(b)
}

func produceBody(topic string, partition int, records []string) []byte {
	type tp struct {
		Topic     string   `json:"topic"`
		Partition int      `json:"partition"`
		Records   []string `json:"records"`
	}
	body, err := json.Marshal(map[string][]tp{
		"topic_partitions": {{Topic: topic, Partition: partition, Records: records}},
	})
	if err != nil {
		panic(err)
	}
	return body
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

type errorSamples struct {
	mu      sync.Mutex
	samples []string
}

func (e *errorSamples) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.samples) < 5 {
		if len(s) > 300 {
			s = s[:300] + "…"
		}
		e.samples = append(e.samples, s)
	}
}

// ---- throughput -------------------------------------------------------------------

type worker struct {
	requests, ok, s503, other, errs uint64
	statuses                        map[int]uint64
	hist                            *latency.Histogram
}

type ThroughputResult struct {
	Mode              string            `json:"mode"`
	URL               string            `json:"url"`
	Connections       int               `json:"connections"`
	Partitions        int               `json:"partitions"`
	RecordsPerRequest int               `json:"records_per_request"`
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

func runThroughput(c *config) (*ThroughputResult, error) {
	bodies := make([][]byte, c.partitions)
	for p := range bodies {
		recs := make([]string, c.records)
		for i := range recs {
			recs[i] = asciiRecord(c.size, p+i)
		}
		bodies[p] = produceBody(c.topic, p, recs)
	}
	url := c.url + c.path
	var dials dialCounter
	client := newClient(c.connections, c.timeout, &dials)
	defer client.CloseIdleConnections()
	var samples errorSamples
	var next atomic.Uint64
	workers := make([]*worker, c.connections)
	cpu0 := cpuSeconds()
	start := time.Now()
	deadline := start.Add(c.duration)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{statuses: map[int]uint64{}, hist: latency.New()}
		workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 32*1024)
			for time.Now().Before(deadline) {
				body := bodies[(next.Add(1)-1)%uint64(len(bodies))]
				t0 := time.Now()
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					panic(err)
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				w.requests++
				if err != nil {
					w.errs++
					samples.add(err.Error())
					time.Sleep(c.backoff)
					continue
				}
				var head []byte
				if resp.StatusCode != http.StatusOK {
					head, _ = io.ReadAll(io.LimitReader(resp.Body, 300))
				}
				_, err = io.CopyBuffer(io.Discard, resp.Body, buf)
				resp.Body.Close()
				if err != nil {
					w.errs++
					samples.add("reading response: " + err.Error())
					time.Sleep(c.backoff)
					continue
				}
				w.statuses[resp.StatusCode]++
				switch resp.StatusCode {
				case http.StatusOK:
					w.ok++
					w.hist.RecordDuration(time.Since(t0))
				case http.StatusServiceUnavailable:
					w.s503++
					time.Sleep(c.backoff)
				default:
					w.other++
					samples.add(fmt.Sprintf("status %d: %s", resp.StatusCode, head))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	res := &ThroughputResult{
		Mode: "throughput", URL: url, Connections: c.connections, Partitions: c.partitions,
		RecordsPerRequest: c.records, RecordBytes: c.size, RequestBodyBytes: len(bodies[0]),
		DurationS: c.duration.Seconds(), ElapsedS: elapsed, Statuses: map[string]uint64{},
		GoVersion: runtime.Version(),
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
	res.ErrorSamples = samples.samples
	if res.ErrorSamples == nil {
		res.ErrorSamples = []string{}
	}
	res.RecordsAcked = res.OK * uint64(c.records)
	res.BytesAcked = res.RecordsAcked * uint64(c.size)
	res.RequestsPerS = float64(res.OK) / elapsed
	res.RecordsPerS = float64(res.RecordsAcked) / elapsed
	res.MiBPerS = float64(res.BytesAcked) / elapsed / (1 << 20)
	res.Latency = summarize(hist)
	res.NewConnections = dials.n.Load()
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

// ---- e2e --------------------------------------------------------------------------

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

type consumeResponse struct {
	Results []struct {
		OK         bool   `json:"ok"`
		NextOffset int64  `json:"next_offset"`
		ErrorType  string `json:"error_type"`
		Error      string `json:"error"`
		Records    []struct {
			Offset int64   `json:"offset"`
			Value  *string `json:"value"`
		} `json:"records"`
	} `json:"results"`
}

const stampDigits = 19

func runE2E(c *config) (*E2EResult, error) {
	const partition = 0
	t0 := time.Now()
	stamp := func() int64 { return int64(time.Since(t0)) } // monotonic ns since t0
	pad := ""
	if c.size > stampDigits+1 {
		pad = "-" + asciiRecord(c.size-stampDigits-1, 0)
	}
	var samples errorSamples
	var prodDials, consDials dialCounter
	prodClient := newClient(1, c.timeout, &prodDials)
	consTimeout := time.Duration(c.maxWaitMs)*time.Millisecond + 15*time.Second
	consClient := newClient(1, consTimeout, &consDials)
	defer prodClient.CloseIdleConnections()
	defer consClient.CloseIdleConnections()

	measureFrom := int64(c.warmup)
	res := &E2EResult{
		Mode: "e2e", URL: c.url, Topic: c.topic, Partition: partition, RecordBytes: c.size,
		MaxWaitMs: c.maxWaitMs, WarmupS: c.warmup.Seconds(), DurationS: c.duration.Seconds(),
		GoVersion: runtime.Version(),
	}
	cpu0 := cpuSeconds()

	var lastAcked atomic.Int64 // highest acknowledged offset
	producerDone := make(chan struct{})
	prodHist := latency.New()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	consHist := latency.New()
	consumerDone := make(chan struct{})
	go func() { // consumer
		defer close(consumerDone)
		fetch := int64(0)
		var drainDeadline time.Time
		for {
			select {
			case <-producerDone:
				if drainDeadline.IsZero() {
					drainDeadline = time.Now().Add(c.drain)
				}
			default:
			}
			if !drainDeadline.IsZero() {
				last := lastAcked.Load()
				if fetch > last && last > 0 || last == 0 {
					res.Drained = true
					return
				}
				if time.Now().After(drainDeadline) {
					return
				}
			}
			body, _ := json.Marshal(map[string]any{
				"topic_partitions": []map[string]any{
					{"topic": c.topic, "partition": partition, "fetch_offset": fetch},
				},
				"max_wait_ms": c.maxWaitMs, "min_bytes": 1,
			})
			rctx := ctx
			var rcancel context.CancelFunc = func() {}
			if !drainDeadline.IsZero() {
				rctx, rcancel = context.WithDeadline(ctx, drainDeadline)
			}
			req, err := http.NewRequestWithContext(rctx, http.MethodPost, c.url+"/consume",
				bytes.NewReader(body))
			if err != nil {
				panic(err)
			}
			req.Header.Set("Content-Type", "application/json")
			res.ConsumeRequests++
			resp, err := consClient.Do(req)
			if err != nil {
				rcancel()
				if ctx.Err() != nil || rctx.Err() != nil {
					continue // the drain deadline ends the loop above
				}
				res.ConsumeErrors++
				samples.add("consume: " + err.Error())
				time.Sleep(c.backoff)
				continue
			}
			raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
			resp.Body.Close()
			rcancel()
			now := stamp()
			if err != nil || resp.StatusCode != http.StatusOK {
				res.ConsumeErrors++
				samples.add(fmt.Sprintf("consume: status %d: %v %.200s", resp.StatusCode, err, raw))
				time.Sleep(c.backoff)
				continue
			}
			var cr consumeResponse
			if err := json.Unmarshal(raw, &cr); err != nil || len(cr.Results) != 1 {
				res.ConsumeErrors++
				samples.add(fmt.Sprintf("consume: bad body: %v %.200s", err, raw))
				time.Sleep(c.backoff)
				continue
			}
			r := cr.Results[0]
			if !r.OK {
				res.ConsumeErrors++
				samples.add(fmt.Sprintf("consume: %s: %s", r.ErrorType, r.Error))
				time.Sleep(c.backoff)
				continue
			}
			if len(r.Records) == 0 {
				res.ConsumeEmpty++
			}
			for _, rec := range r.Records {
				res.Consumed++
				if rec.Value == nil || len(*rec.Value) < stampDigits {
					continue
				}
				sent, err := strconv.ParseInt((*rec.Value)[:stampDigits], 10, 64)
				if err != nil || sent < measureFrom {
					continue
				}
				consHist.RecordDuration(time.Duration(now - sent))
			}
			if r.NextOffset > fetch {
				fetch = r.NextOffset
			}
		}
	}()

	// producer
	end := c.warmup + c.duration
	for time.Since(t0) < end {
		sent := stamp()
		rec := fmt.Sprintf("%0*d", stampDigits, sent) + pad
		body := produceBody(c.topic, partition, []string{rec})
		req, err := http.NewRequest(http.MethodPost, c.url+"/produce", bytes.NewReader(body))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := prodClient.Do(req)
		if err != nil {
			res.ProduceErrors++
			samples.add("produce: " + err.Error())
			time.Sleep(c.backoff)
			continue
		}
		raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		took := time.Duration(stamp() - sent)
		var pr produceResponse
		if err == nil && resp.StatusCode == http.StatusOK {
			err = json.Unmarshal(raw, &pr)
		}
		if err != nil || resp.StatusCode != http.StatusOK || len(pr.Results) != 1 ||
			!pr.Results[0].OK {
			res.ProduceErrors++
			samples.add(fmt.Sprintf("produce: status %d: %v %.200s", resp.StatusCode, err, raw))
			time.Sleep(c.backoff)
			continue
		}
		res.Produced++
		if pr.Results[0].EndOffset > lastAcked.Load() {
			lastAcked.Store(pr.Results[0].EndOffset)
		}
		if sent >= measureFrom {
			prodHist.RecordDuration(took)
		}
	}
	close(producerDone)
	select {
	case <-consumerDone:
	case <-time.After(c.drain + consTimeout + 5*time.Second):
		cancel()
		<-consumerDone
	}
	res.ElapsedS = time.Since(t0).Seconds()
	res.LastAckedOffset = lastAcked.Load()
	res.Missing = int64(res.Produced) - int64(res.Consumed)
	res.ProduceLatency = summarize(prodHist)
	res.E2ELatency = summarize(consHist)
	res.ErrorSamples = samples.samples
	if res.ErrorSamples == nil {
		res.ErrorSamples = []string{}
	}
	sort.Strings(res.ErrorSamples)
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}
