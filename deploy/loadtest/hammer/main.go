// Command hammer is the load generator of `llog loadtest`: closed- or open-loop produce
// against the brokers of a run, routed inside each partition's owner set
// (routing-manifest.json), with an optional consumer measuring produce-to-consume
// latency. It writes client-30s.jsonl, client-summary.json, remap-events.jsonl and,
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
