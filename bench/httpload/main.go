// httpload: a closed-loop HTTP load generator for the llog broker.
//
// Mode "throughput" (default): N connections, each sending POST {path} back to back for
// a fixed duration, with produce bodies of R records of S bytes, round-robin over P
// partitions (or over the partitions of -partition-set). Counts statuses and errors,
// acknowledged records and bytes, and latency percentiles.
//
// Mode "e2e": one producer connection sends one record at a time carrying its send time
// while one long-poll consumer (POST /consume, following next_offset) measures the
// produce-to-consume latency.
//
// Both print one JSON object on stdout; diagnostics go to stderr. Latencies are kept in
// the HDR histogram of deploy/loadtest/latency, shared with the load-test hammer.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"
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
	entries     int
	format      string
	rate        float64
	consumeURL  string
	maxBytes    int
	partMax     int // catchup mode: partition_max_bytes of every partition (0: none)
	catchupMiB  int
	fromOffset  int64
	readParts   int // catchup mode: partitions 0..n-1, all of them in every request
	totalMiB    int
	keyBytes    int // a key of this many bytes on every record (JSON bodies)
	headers     int // this many headers on every record (JSON bodies)
	// throughput mode: the partitions written, round-robin (-partition-set; default
	// 0..partitions-1). validate fills it in.
	partitionSet string
	written      []int
	// throughput mode: "members" sends each partition's records to its preferred
	// member's URL (route.go); "" sends everything to -url.
	route string
	// throughput mode: the first extraRecords entries of a body carry one record more
	// than -records (a routed request keeps the records of an unrouted one).
	extraRecords int
	// throughput mode: record values from a file (-records-file), taken in turn.
	recordsFile string
	corpus      [][]byte
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
	flag.IntVar(&c.entries, "entries", 1, "partitions (entries) per produce request")
	flag.IntVar(&c.keyBytes, "key-bytes", 0, "a key of this many bytes on every record (json)")
	flag.IntVar(&c.headers, "headers", 0,
		"headers on every record, each a 16-byte value (json)")
	flag.StringVar(&c.format, "format", "json",
		"json, or binary (produce: the LLP1 envelope; consume: Accept the LLR1 answer)")
	flag.Float64Var(&c.rate, "rate", 0,
		"e2e and throughput modes: produce requests per second over all connections, each "+
			"request's latency counted from its due time (0: e2e one request at a time, "+
			"throughput every connection back to back)")
	flag.StringVar(&c.consumeURL, "consume-url", "",
		"e2e and catchup modes: the broker consumers read from (default: -url)")
	flag.IntVar(&c.maxBytes, "max-bytes", 8<<20, "catchup mode: max_bytes per consume request")
	flag.IntVar(&c.partMax, "partition-max-bytes", 0,
		"catchup mode: partition_max_bytes of every partition in a request (0: none, the "+
			"partitions share max_bytes in request order)")
	flag.IntVar(&c.catchupMiB, "catchup-mib", 1024, "catchup mode: MiB of records to read")
	flag.Int64Var(&c.fromOffset, "from-offset", 1, "catchup mode: the first offset")
	flag.IntVar(&c.readParts, "catchup-partitions", 1,
		"catchup mode: read partitions 0..n-1, all of them in every request")
	flag.StringVar(&c.partitionSet, "partition-set", "",
		"throughput mode: write only these partitions (comma-separated, each below "+
			"-partitions), round-robin; entries per request at most their number")
	flag.StringVar(&c.route, "route", "",
		"throughput mode: members sends each partition's records straight to the broker "+
			"preferred for it (the map from GET -url/cluster), each request as many records "+
			"as one over every partition; a request its broker does not answer goes to -url")
	flag.IntVar(&c.totalMiB, "total-mib", 0,
		"throughput mode: stop once this many MiB of records are acknowledged (0: -duration)")
	flag.StringVar(&c.recordsFile, "records-file", "",
		"throughput mode: record values from this file, each a 4-byte big-endian length "+
			"then the bytes (bench/corpus.py --out), taken in turn; -size is then ignored")
	flag.Parse()

	if err := validate(&c); err != nil {
		fmt.Fprintf(os.Stderr, "httpload: %v\n", err)
		os.Exit(2)
	}
	if err := loadCorpus(&c); err != nil {
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
	case "catchup":
		out, err = runCatchup(&c)
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
	for _, check := range []struct {
		bad bool
		why string
	}{
		{c.mode != "throughput" && c.mode != "e2e" && c.mode != "catchup",
			fmt.Sprintf("-mode must be throughput, e2e or catchup, not %q", c.mode)},
		{c.entries < 1 || c.entries > c.partitions,
			"-entries must be between 1 and -partitions"},
		{c.format != "json" && c.format != "binary", "-format must be json or binary"},
		{c.keyBytes < 0 || c.headers < 0, "-key-bytes and -headers must not be negative"},
		{(c.keyBytes > 0 || c.headers > 0) && c.format != "json",
			"-key-bytes and -headers need -format json"},
		{c.rate < 0, "-rate must not be negative"},
		{c.maxBytes < 1, "-max-bytes must be positive"},
		{c.partMax < 0, "-partition-max-bytes must not be negative"},
		{c.readParts < 1, "-catchup-partitions must be at least 1"},
		{c.connections < 1, "-connections must be at least 1"},
		{c.duration <= 0, "-duration must be positive"},
		{c.warmup < 0, "-warmup must not be negative"},
		{!topicRe.MatchString(c.topic) || c.topic == "." || c.topic == "..",
			fmt.Sprintf("-topic %q is not a valid topic name", c.topic)},
		{c.partitions < 1, "-partitions must be at least 1"},
		{c.records < 1, "-records must be at least 1"},
		{c.size < 1, "-size must be at least 1"},
		{c.timeout <= 0, "-timeout must be positive"},
		{c.maxWaitMs < 0, "-max-wait-ms must not be negative"},
		{!strings.HasPrefix(c.path, "/"), "-path must start with /"},
		{c.route != "" && (c.route != "members" || c.mode != "throughput"),
			"-route must be members, and only in throughput mode"},
	} {
		if check.bad {
			return errors.New(check.why)
		}
	}
	if err := choosePartitions(c); err != nil {
		return err
	}
	c.url = strings.TrimRight(c.url, "/")
	if c.consumeURL == "" {
		c.consumeURL = c.url
	}
	c.consumeURL = strings.TrimRight(c.consumeURL, "/")
	return nil
}

// choosePartitions sets the partitions throughput mode writes: -partition-set, or all
// of 0..partitions-1. A request carries at most one entry per partition, so a set smaller
// than -entries lowers the entries per request to its size.
func choosePartitions(c *config) error {
	if c.partitionSet == "" {
		c.written = make([]int, c.partitions)
		for p := range c.written {
			c.written[p] = p
		}
		return nil
	}
	if c.mode != "throughput" {
		return errors.New("-partition-set is for -mode throughput")
	}
	seen := map[int]bool{}
	c.written = nil
	for _, field := range strings.Split(c.partitionSet, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || p < 0 || p >= c.partitions || seen[p] {
			return fmt.Errorf("-partition-set %q: each partition once, between 0 and "+
				"-partitions - 1 (%d)", c.partitionSet, c.partitions-1)
		}
		seen[p] = true
		c.written = append(c.written, p)
	}
	c.entries = min(c.entries, len(c.written))
	return nil
}

// loadCorpus reads -records-file: length-prefixed records, at least one. JSON bodies
// carry records as strings, so there every record must be UTF-8.
func loadCorpus(c *config) error {
	if c.recordsFile == "" {
		return nil
	}
	if c.mode != "throughput" {
		return errors.New("-records-file is for -mode throughput")
	}
	data, err := os.ReadFile(c.recordsFile)
	if err != nil {
		return err
	}
	c.corpus, err = splitRecords(data)
	if err != nil {
		return fmt.Errorf("-records-file %s: %w", c.recordsFile, err)
	}
	if c.format == "json" {
		for i, r := range c.corpus {
			if !utf8.Valid(r) {
				return fmt.Errorf("-records-file %s: record %d is not UTF-8; use -format "+
					"binary", c.recordsFile, i)
			}
		}
	}
	return nil
}

// splitRecords cuts length-prefixed records (4-byte big-endian length, then the bytes).
func splitRecords(data []byte) ([][]byte, error) {
	var out [][]byte
	for len(data) > 0 {
		if len(data) < 4 {
			return nil, errors.New("a truncated length")
		}
		n := int(binary.BigEndian.Uint32(data))
		if n > len(data)-4 {
			return nil, errors.New("a truncated record")
		}
		out = append(out, data[4:4+n])
		data = data[4+n:]
	}
	if len(out) == 0 {
		return nil, errors.New("no records")
	}
	return out, nil
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

// list is the samples kept, never nil (the result JSON shows [] rather than null).
func (e *errorSamples) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string{}, e.samples...)
}

// post sends one body and reads at most limit bytes of the answer. A nil response means
// the request got no answer.
func post(ctx context.Context, client *http.Client, url string, body []byte,
	contentType, accept string, limit int64) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", contentType)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	return resp, raw, err
}
