// Command hammer is the load generator of `llog loadtest`: closed- or open-loop produce
// against the brokers of a run, routed inside each partition's owner set
// (routing-manifest.json), with an optional consumer measuring produce-to-consume
// latency. Every produce entry carries an idempotency key, so that requests whose
// outcome is unknown can be retried without storing records twice (retry.go). It writes
// client-30s.jsonl, client-summary.json, remap-events.jsonl, retry-events.jsonl and,
// when asked, the acknowledged records (topic, partition, offset, value hash, broker).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
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
	errors        map[string]int64 // failed entries by kind
	retryReasons  map[string]int64 // entries sent again, by why the attempt before failed
	requests      atomic.Int64
	ackedRequests atomic.Int64
	entries       atomic.Int64 // entries made (each sent at least once)
	ackedEntries  atomic.Int64
	duplicateAcks atomic.Int64 // entries acknowledged by a `duplicate: true` answer
	retriedEnts   atomic.Int64 // entry resends
	maybeRetries  atomic.Int64 // resends of entries an earlier attempt may have written
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
		e2eInterval: latency.New(), statuses: map[string]int64{}, errors: map[string]int64{},
		retryReasons: map[string]int64{}}
}

func (s *Stats) status(code string) {
	s.mu.Lock()
	s.statuses[code]++
	s.mu.Unlock()
}

func (s *Stats) retried(why string, maybeWritten bool) {
	s.mu.Lock()
	s.retryReasons[why]++
	s.mu.Unlock()
	s.retriedEnts.Add(1)
	if maybeWritten {
		s.maybeRetries.Add(1)
	}
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
	groups    [][]int // produce partitions (indices) by owner set
	groupOf   []int   // partition index -> group
	parts     []partState
	router    *Router
	retryLog  *EventLog
	nonce     string // the producer ids' prefix: hammer start, unix ns, hex
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
	events, closeEvents, err := openEventLog(cfg, cfg.Out.RemapEvents)
	if err != nil {
		return err
	}
	defer closeEvents()
	retryLog, closeRetries, err := openEventLog(cfg, cfg.Out.RetryEvents)
	if err != nil {
		return err
	}
	defer closeRetries()
	h := newHammer(cfg, events, retryLog)
	flushAcked, err := h.openAcked()
	if err != nil {
		return err
	}
	defer flushAcked()
	intervals, err := os.Create(outPath(cfg, cfg.Out.Intervals))
	if err != nil {
		return err
	}
	defer intervals.Close()

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	// Consumers first, positioned at each partition's current end, so they only see
	// records produced by this run.
	cons := h.startConsumers()
	defer cons.stop()
	h.begin(time.Now())
	runCtx, stopRun := context.WithDeadline(ctx, h.start.Add(time.Duration(cfg.DurationS*float64(time.Second))))
	defer stopRun()
	reporterDone := make(chan struct{})
	go h.reporter(runCtx, intervals, reporterDone)
	if cfg.Mode == "open" {
		h.openLoop(runCtx)
	} else {
		h.closedLoop(runCtx)
	}
	end := time.Now()
	cons.drain(time.Duration(cfg.Consumer.DrainTimeoutS * float64(time.Second)))
	stopRun()
	<-reporterDone
	h.writeInterval(intervals, time.Now(), true)
	return h.writeSummary(end, events)
}

// newHammer sets up brokers, routes and counters from the configuration.
func newHammer(cfg *Config, events, retryLog *EventLog) *Hammer {
	transport := &http.Transport{
		MaxIdleConns:        4 * (cfg.Connections + 64),
		MaxIdleConnsPerHost: cfg.Connections + 64,
		IdleConnTimeout:     60 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	}
	h := &Hammer{
		cfg:      cfg,
		client:   &http.Client{Transport: transport},
		brokers:  map[string]*Broker{},
		router:   &Router{policy: cfg.Policy, backoff: time.Duration(cfg.DownBackoffMs) * time.Millisecond, events: events},
		stats:    newStats(),
		retryLog: retryLog,
		maxAcked: make([]atomic.Int64, len(cfg.Partitions)),
		parts:    make([]partState, len(cfg.Partitions)),
	}
	for _, bc := range cfg.Brokers {
		b := &Broker{ID: bc.ID, URL: bc.URL}
		h.brokers[bc.ID] = b
		h.order = append(h.order, b)
	}
	for _, p := range cfg.Partitions {
		readers := p.Readers
		if len(readers) == 0 {
			readers = p.Owners
		}
		h.produce = append(h.produce, newRoute(p.Topic, p.Partition, h.lookup(p.Owners)))
		h.consume = append(h.consume, newRoute(p.Topic, p.Partition, h.lookup(readers)))
	}
	h.groups, h.groupOf = ownerSetGroups(h.produce)
	return h
}

func (h *Hammer) lookup(ids []string) []*Broker {
	out := make([]*Broker, len(ids))
	for i, id := range ids {
		out[i] = h.brokers[id]
	}
	return out
}

// begin starts the clock of the run; the producer ids derive from it.
func (h *Hammer) begin(now time.Time) {
	h.start = now
	h.nonce = strconv.FormatInt(now.UnixNano(), 16)
	h.measureAt = now.Add(time.Duration(h.cfg.WarmupS * float64(time.Second)))
}

// openAcked opens acked.tsv when asked for; the function returned flushes it.
func (h *Hammer) openAcked() (func(), error) {
	p := outPath(h.cfg, h.cfg.Out.Acked)
	if p == "" {
		return func() {}, nil
	}
	f, err := os.Create(p)
	if err != nil {
		return nil, err
	}
	h.acked = bufio.NewWriterSize(f, 1<<20)
	return func() {
		h.ackedMu.Lock()
		h.acked.Flush()
		h.ackedMu.Unlock()
		f.Close()
	}, nil
}

func openEventLog(cfg *Config, name string) (*EventLog, func(), error) {
	p := outPath(cfg, name)
	if p == "" {
		return &EventLog{}, func() {}, nil
	}
	f, err := os.Create(p)
	if err != nil {
		return nil, nil, err
	}
	return &EventLog{f: f}, func() { f.Close() }, nil
}

// ownerSetGroups groups the routes whose owner sets hold the same brokers (in any
// order): the partitions one produce request may carry together.
func ownerSetGroups(routes []*Route) ([][]int, []int) {
	index := map[string]int{}
	var groups [][]int
	groupOf := make([]int, len(routes))
	for i, rt := range routes {
		key := fmt.Sprint(slices.Sorted(slices.Values(rt.ownerIDs)))
		g, ok := index[key]
		if !ok {
			g = len(groups)
			index[key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
		groupOf[i] = g
	}
	return groups, groupOf
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
