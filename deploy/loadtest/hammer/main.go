// Command hammer is the load generator of `llog loadtest`: closed- or open-loop produce
// against the brokers of a run, routed inside each partition's owner set
// (routing-manifest.json), with an optional consumer measuring produce-to-consume
// latency. It writes client-30s.jsonl, client-summary.json, remap-events.jsonl and,
// when asked, the acknowledged records (topic, partition, offset, value hash, broker).
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"llog.local/loadtest/latency"
)

// EventLog appends JSON lines with a timestamp; safe for concurrent use.
type EventLog struct {
	mu sync.Mutex
	f  *os.File
	n  int64
}

func (e *EventLog) Write(ev map[string]any) {
	ev["ts"] = float64(time.Now().UnixNano()) / 1e9
	line, _ := json.Marshal(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if e.f != nil {
		e.f.Write(append(line, '\n'))
	}
}

// Stats are the produce and consume figures, both cumulative and per reporting interval.
type Stats struct {
	mu            sync.Mutex
	lat           *latency.Histogram // produce latency, measurement window, microseconds
	latInterval   *latency.Histogram
	e2e           *latency.Histogram // produce-to-consume latency
	e2eInterval   *latency.Histogram
	statuses      map[string]int64
	errors        map[string]int64
	requests      atomic.Int64
	ackedRequests atomic.Int64
	ackedRecords  atomic.Int64
	ackedBytes    atomic.Int64
	failedRecords atomic.Int64
	retries       atomic.Int64
	measuredRecs  atomic.Int64
	measuredBytes atomic.Int64
	consRequests  atomic.Int64
	consRecords   atomic.Int64
	consBytes     atomic.Int64
	consErrors    atomic.Int64
	inflight      atomic.Int64
	scheduleLagUs atomic.Int64
	lateStarts    atomic.Int64
}

func newStats() *Stats {
	return &Stats{lat: latency.New(), latInterval: latency.New(), e2e: latency.New(),
		e2eInterval: latency.New(), statuses: map[string]int64{}, errors: map[string]int64{}}
}

func (s *Stats) status(code string) {
	s.mu.Lock()
	s.statuses[code]++
	s.mu.Unlock()
}

func (s *Stats) fail(kind string, records int) {
	s.mu.Lock()
	s.errors[kind]++
	s.mu.Unlock()
	s.failedRecords.Add(int64(records))
}

type Hammer struct {
	cfg       *Config
	client    *http.Client
	brokers   map[string]*Broker
	order     []*Broker
	produce   []*Route
	consume   []*Route
	router    *Router
	stats     *Stats
	start     time.Time
	measureAt time.Time
	acked     *bufio.Writer
	ackedMu   sync.Mutex
	maxAcked  []atomic.Int64 // per partition index: highest acknowledged offset
	nextPart  atomic.Uint64
	last      intervalState
}

func main() {
	configPath := flag.String("config", "", "hammer-config.json written by the orchestrator")
	flag.Parse()
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "usage: hammer -config hammer-config.json")
		os.Exit(2)
	}
	cfg, err := loadConfig(*configPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hammer:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "hammer:", err)
		os.Exit(1)
	}
}

func outPath(cfg *Config, name string) string {
	if name == "" || filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(cfg.Out.Dir, name)
}

func run(cfg *Config) error {
	if err := os.MkdirAll(cfg.Out.Dir, 0o755); err != nil {
		return err
	}
	events := &EventLog{}
	if p := outPath(cfg, cfg.Out.RemapEvents); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		events.f = f
	}
	transport := &http.Transport{
		MaxIdleConns:        4 * (cfg.Connections + 64),
		MaxIdleConnsPerHost: cfg.Connections + 64,
		IdleConnTimeout:     60 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	h := &Hammer{
		cfg:     cfg,
		client:  &http.Client{Transport: transport},
		brokers: map[string]*Broker{},
		router:  &Router{policy: cfg.Policy, backoff: time.Duration(cfg.DownBackoffMs) * time.Millisecond, events: events},
		stats:   newStats(),
	}
	for _, bc := range cfg.Brokers {
		b := &Broker{ID: bc.ID, URL: bc.URL}
		h.brokers[bc.ID] = b
		h.order = append(h.order, b)
	}
	h.maxAcked = make([]atomic.Int64, len(cfg.Partitions))
	for _, p := range cfg.Partitions {
		owners := make([]*Broker, len(p.Owners))
		for i, id := range p.Owners {
			owners[i] = h.brokers[id]
		}
		h.produce = append(h.produce, newRoute(p.Topic, p.Partition, owners))
		readerIDs := p.Readers
		if len(readerIDs) == 0 {
			readerIDs = p.Owners
		}
		readers := make([]*Broker, len(readerIDs))
		for i, id := range readerIDs {
			readers[i] = h.brokers[id]
		}
		h.consume = append(h.consume, newRoute(p.Topic, p.Partition, readers))
	}
	if p := outPath(cfg, cfg.Out.Acked); p != "" {
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h.acked = bufio.NewWriterSize(f, 1<<20)
		defer func() {
			h.ackedMu.Lock()
			h.acked.Flush()
			h.ackedMu.Unlock()
		}()
	}
	intervals, err := os.Create(outPath(cfg, cfg.Out.Intervals))
	if err != nil {
		return err
	}
	defer intervals.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		cancel()
	}()

	// Consumers first, positioned at each partition's current end, so they only see
	// records produced by this run.
	var consumers sync.WaitGroup
	consumeCtx, stopConsumers := context.WithCancel(context.Background())
	defer stopConsumers()
	producersDone := make(chan struct{})
	if cfg.Consumer.Enabled {
		groups := h.consumerGroups()
		ready := make(chan struct{}, len(groups))
		for _, g := range groups {
			consumers.Add(1)
			go func(g []int) {
				defer consumers.Done()
				h.consumeLoop(consumeCtx, g, ready, producersDone)
			}(g)
		}
		for range groups {
			<-ready
		}
	}

	h.start = time.Now()
	h.measureAt = h.start.Add(time.Duration(cfg.WarmupS * float64(time.Second)))
	deadline := h.start.Add(time.Duration(cfg.DurationS * float64(time.Second)))
	runCtx, stopRun := context.WithDeadline(ctx, deadline)
	defer stopRun()

	reporterDone := make(chan struct{})
	go h.reporter(runCtx, intervals, reporterDone)

	if cfg.Mode == "open" {
		h.openLoop(runCtx)
	} else {
		h.closedLoop(runCtx)
	}
	end := time.Now()
	close(producersDone)
	if cfg.Consumer.Enabled {
		drained := make(chan struct{})
		go func() { consumers.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(time.Duration(cfg.Consumer.DrainTimeoutS * float64(time.Second))):
			stopConsumers()
			<-drained
		}
	}
	stopRun()
	<-reporterDone
	h.writeInterval(intervals, time.Now(), true)
	return h.writeSummary(end, events)
}

func (h *Hammer) consumerGroups() [][]int {
	byOwners := map[string][]int{}
	var keys []string
	for i, rt := range h.consume {
		key := fmt.Sprint(rt.ownerIDs)
		if _, ok := byOwners[key]; !ok {
			keys = append(keys, key)
		}
		byOwners[key] = append(byOwners[key], i)
	}
	var groups [][]int
	for _, key := range keys {
		idx := byOwners[key]
		for len(idx) > 0 {
			n := min(len(idx), h.cfg.Consumer.MaxPartitionsPerRequest)
			groups = append(groups, idx[:n])
			idx = idx[n:]
		}
	}
	return groups
}

// ---- produce -------------------------------------------------------------------------

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

// ---- consume -------------------------------------------------------------------------

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

// ---- reporting -----------------------------------------------------------------------

type intervalState struct {
	at       time.Time
	records  int64
	bytes    int64
	requests int64
	errors   int64
	consRecs int64
}

func (h *Hammer) reporter(ctx context.Context, out *os.File, done chan<- struct{}) {
	defer close(done)
	h.last = intervalState{at: h.start}
	every := time.Duration(h.cfg.IntervalS * float64(time.Second))
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticker.C:
			h.writeInterval(out, now, false)
		}
	}
}

func (h *Hammer) failedTotal() int64 {
	h.stats.mu.Lock()
	defer h.stats.mu.Unlock()
	var n int64
	for _, v := range h.stats.errors {
		n += v
	}
	return n
}

func (h *Hammer) writeInterval(out *os.File, now time.Time, final bool) {
	s := h.stats
	s.mu.Lock()
	lat := s.latInterval
	s.latInterval = latency.New()
	e2e := s.e2eInterval
	s.e2eInterval = latency.New()
	s.mu.Unlock()
	cur := intervalState{at: now, records: s.ackedRecords.Load(), bytes: s.ackedBytes.Load(),
		requests: s.requests.Load(), errors: h.failedTotal(), consRecs: s.consRecords.Load()}
	dt := now.Sub(h.last.at).Seconds()
	if dt <= 0 {
		return
	}
	if final && cur.records == h.last.records && cur.requests == h.last.requests &&
		cur.consRecs == h.last.consRecs {
		return
	}
	line := map[string]any{
		"ts":                  float64(now.UnixNano()) / 1e9,
		"elapsed_s":           math.Round(now.Sub(h.start).Seconds()*1000) / 1000,
		"interval_s":          math.Round(dt*1000) / 1000,
		"final":               final,
		"acked_records":       cur.records - h.last.records,
		"acked_bytes":         cur.bytes - h.last.bytes,
		"requests":            cur.requests - h.last.requests,
		"errors":              cur.errors - h.last.errors,
		"records_per_s":       float64(cur.records-h.last.records) / dt,
		"mib_per_s":           float64(cur.bytes-h.last.bytes) / dt / (1 << 20),
		"inflight":            s.inflight.Load(),
		"latency_ms":          summaryMs(lat),
		"consumed_records":    cur.consRecs - h.last.consRecs,
		"e2e_latency_ms":      summaryMs(e2e),
		"acked_records_total": cur.records,
	}
	data, _ := json.Marshal(line)
	out.Write(append(data, '\n'))
	h.last = cur
}

func (h *Hammer) writeSummary(end time.Time, events *EventLog) error {
	s := h.stats
	cfg := h.cfg
	measured := end.Sub(h.measureAt).Seconds()
	if measured <= 0 {
		measured = end.Sub(h.start).Seconds()
	}
	byBroker := map[string]any{}
	for _, b := range h.order {
		byBroker[b.ID] = map[string]any{"requests": b.requests.Load(), "acked_records": b.acked.Load(),
			"errors": b.errors.Load(), "url": b.URL}
	}
	s.mu.Lock()
	statuses := map[string]int64{}
	for k, v := range s.statuses {
		statuses[k] = v
	}
	errs := map[string]int64{}
	keys := make([]string, 0, len(s.errors))
	for k := range s.errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		errs[k] = s.errors[k]
	}
	lat := summaryMs(s.lat)
	latBuckets := s.lat.Buckets()
	e2e := summaryMs(s.e2e)
	e2eBuckets := s.e2e.Buckets()
	s.mu.Unlock()
	summary := map[string]any{
		"version":      1,
		"run_id":       cfg.RunID,
		"mode":         cfg.Mode,
		"policy":       cfg.Policy,
		"connections":  cfg.Connections,
		"target_rate":  cfg.Rate,
		"started_at":   float64(h.start.UnixNano()) / 1e9,
		"finished_at":  float64(end.UnixNano()) / 1e9,
		"duration_s":   end.Sub(h.start).Seconds(),
		"warmup_s":     cfg.WarmupS,
		"measured_s":   measured,
		"record_bytes": cfg.RecordBytes, "records_per_request": cfg.RecordsPerRequest,
		"partitions": len(cfg.Partitions),
		"produce": map[string]any{
			"requests":                s.requests.Load(),
			"acked_requests":          s.ackedRequests.Load(),
			"acked_records":           s.ackedRecords.Load(),
			"acked_bytes":             s.ackedBytes.Load(),
			"failed_records":          s.failedRecords.Load(),
			"retries":                 s.retries.Load(),
			"statuses":                statuses,
			"errors":                  errs,
			"records_per_s":           float64(s.measuredRecs.Load()) / measured,
			"mib_per_s":               float64(s.measuredBytes.Load()) / measured / (1 << 20),
			"latency_ms":              lat,
			"latency_histogram_us":    latBuckets,
			"late_starts":             s.lateStarts.Load(),
			"max_schedule_lag_ms":     float64(s.scheduleLagUs.Load()) / 1000,
			"achieved_requests_per_s": float64(s.requests.Load()-s.retries.Load()) / end.Sub(h.start).Seconds(),
		},
		"consume": map[string]any{
			"enabled":                  cfg.Consumer.Enabled,
			"requests":                 s.consRequests.Load(),
			"records":                  s.consRecords.Load(),
			"bytes":                    s.consBytes.Load(),
			"errors":                   s.consErrors.Load(),
			"e2e_latency_ms":           e2e,
			"e2e_latency_histogram_us": e2eBuckets,
		},
		"by_broker":          byBroker,
		"remaps":             h.router.remaps.Load(),
		"broker_down_events": h.router.downs.Load(),
		"acked_file":         cfg.Out.Acked,
	}
	data, err := json.MarshalIndent(summary, "", "  ")
	if err != nil {
		return err
	}
	path := outPath(cfg, cfg.Out.Summary)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
