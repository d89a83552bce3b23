package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// wireEntry is a produce entry as the hammer sends it.
type wireEntry struct {
	Topic     string   `json:"topic"`
	Partition int      `json:"partition"`
	Key       string   `json:"idempotency_key"`
	Records   []string `json:"records"`
}

// attemptSeen is one produce request as a broker of the fake cluster received it.
type attemptSeen struct {
	broker  string
	entries []wireEntry
}

// fakeCluster answers POST /produce for its brokers from one shared log, remembering
// keys as the real brokers do: the first append of a key is written, a repeat is
// answered with the same offsets and duplicate.
type fakeCluster struct {
	mu       sync.Mutex
	next     map[string]int64
	keys     map[string]produceResult
	attempts []attemptSeen
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{next: map[string]int64{}, keys: map[string]produceResult{}}
}

func (c *fakeCluster) commit(e wireEntry) produceResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	tp := fmt.Sprintf("%s/%d", e.Topic, e.Partition)
	if r, ok := c.keys[tp+"/"+e.Key]; ok && e.Key != "" {
		r.Duplicate = true
		return r
	}
	n := int64(len(e.Records))
	start := c.next[tp] + 1
	c.next[tp] += n
	r := produceResult{Topic: e.Topic, Partition: e.Partition, OK: true, StartOffset: start,
		EndOffset: start + n - 1, Count: n}
	c.keys[tp+"/"+e.Key] = r
	return r
}

// answer decides the response to attempt number n (0-based, over the whole cluster).
type answer func(t *testing.T, c *fakeCluster, w http.ResponseWriter, n int, entries []wireEntry)

func (c *fakeCluster) broker(t *testing.T, id string, respond answer) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			TopicPartitions []wireEntry `json:"topic_partitions"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("%s: bad request body: %v", id, err)
		}
		c.mu.Lock()
		n := len(c.attempts)
		c.attempts = append(c.attempts, attemptSeen{id, body.TopicPartitions})
		c.mu.Unlock()
		respond(t, c, w, n, body.TopicPartitions)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// commitAll commits every entry and answers 200.
func commitAll(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, entries []wireEntry) {
	var results []produceResult
	for _, e := range entries {
		results = append(results, c.commit(e))
	}
	writeJSON(t, w, http.StatusOK, produceResponse{Results: results})
}

// cutAfterCommit commits every entry, then drops the connection without an answer: a
// broker that died between its commit and its answer.
func cutAfterCommit(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, entries []wireEntry) {
	for _, e := range entries {
		c.commit(e)
	}
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
}

// firstThen answers the first attempt of the cluster with first, the others with rest.
func firstThen(first, rest answer) answer {
	return func(t *testing.T, c *fakeCluster, w http.ResponseWriter, n int, entries []wireEntry) {
		if n == 0 {
			first(t, c, w, n, entries)
		} else {
			rest(t, c, w, n, entries)
		}
	}
}

func writeJSON(t *testing.T, w http.ResponseWriter, status int, doc any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(doc); err != nil {
		t.Error(err)
	}
}

// testHammer is a hammer against two brokers b1, b2 that own partitions 0..parts-1 of
// topic "t", with acked.tsv and retry-events.jsonl in a temporary directory.
func testHammer(t *testing.T, parts int, extra string, urls ...string) *Hammer {
	dir := t.TempDir()
	var ps []string
	for p := 0; p < parts; p++ {
		ps = append(ps, fmt.Sprintf(`{"topic":"t","partition":%d,"owners":["b1","b2"]}`, p))
	}
	raw := fmt.Sprintf(`{"brokers":[{"id":"b1","url":%q},{"id":"b2","url":%q}],
		"partitions":[%s],"duration_s":1,"records_per_request":3,"record_bytes":40,
		"retry_backoff_ms":1,"retry_backoff_max_ms":5,"request_timeout_s":5,
		"out":{"dir":%q,"acked":"acked.tsv","retry_events":"retry-events.jsonl"}%s}`,
		urls[0], urls[1], strings.Join(ps, ","), dir, extra)
	path := filepath.Join(dir, "hammer-config.json")
	if err := os.WriteFile(path, []byte(raw), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	retryLog, closeRetries, err := openEventLog(cfg, cfg.Out.RetryEvents)
	if err != nil {
		t.Fatal(err)
	}
	h := newHammer(cfg, &EventLog{}, retryLog)
	flush, err := h.openAcked()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { flush(); closeRetries() })
	h.begin(time.Now())
	return h
}

// ackedLines flushes and reads acked.tsv.
func ackedLines(t *testing.T, h *Hammer) []string {
	h.acked.Flush()
	data, err := os.ReadFile(outPath(h.cfg, h.cfg.Out.Acked))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

func retryEvents(t *testing.T, h *Hammer) []map[string]any {
	f, err := os.Open(outPath(h.cfg, h.cfg.Out.RetryEvents))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev map[string]any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
	return out
}
