package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	good := func() config {
		return config{url: "http://h:1//", path: "/produce", mode: "e2e", connections: 1,
			duration: time.Second, topic: "t.1", partitions: 1, records: 1, size: 1,
			timeout: time.Second, entries: 1, format: "json", maxBytes: 1, readParts: 1}
	}
	c := good()
	if err := validate(&c); err != nil || c.url != "http://h:1" {
		t.Fatalf("valid config: %v, url %q", err, c.url)
	}
	for want, spoil := range map[string]func(*config){
		"-mode":        func(c *config) { c.mode = "x" },
		"-connections": func(c *config) { c.connections = 0 },
		"-warmup":      func(c *config) { c.warmup = -time.Second },
		"-topic":       func(c *config) { c.topic = ".." },
		"-size":        func(c *config) { c.size = 0 },
		"-max-wait-ms": func(c *config) { c.maxWaitMs = -1 },
		"-path":        func(c *config) { c.path = "produce" },
		"-entries":     func(c *config) { c.entries = 2 },
		"-format":      func(c *config) { c.format = "xml" },
		"-rate":        func(c *config) { c.rate = -1 },
	} {
		c := good()
		spoil(&c)
		if err := validate(&c); err == nil || !strings.HasPrefix(err.Error(), want+" ") {
			t.Fatalf("%s: got %v", want, err)
		}
	}
}

func TestValidateCatchupPartitions(t *testing.T) {
	c := config{url: "http://h:1", path: "/produce", mode: "catchup", connections: 1,
		duration: time.Second, topic: "t", partitions: 1, records: 1, size: 1,
		timeout: time.Second, entries: 1, format: "binary", maxBytes: 1, readParts: 0}
	if err := validate(&c); err == nil || !strings.HasPrefix(err.Error(), "-catchup-partitions ") {
		t.Fatalf("got %v", err)
	}
}

// bodyPartitions are the partitions of each JSON produce body, in order.
func bodyPartitions(t *testing.T, bodies [][]byte) [][]int {
	t.Helper()
	out := make([][]int, len(bodies))
	for i, body := range bodies {
		var doc struct {
			TopicPartitions []struct {
				Partition int `json:"partition"`
			} `json:"topic_partitions"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatal(err)
		}
		for _, tp := range doc.TopicPartitions {
			out[i] = append(out[i], tp.Partition)
		}
	}
	return out
}

func TestPartitionSetWritesOnlyItsPartitions(t *testing.T) {
	c := config{url: "http://h:1", path: "/produce", mode: "throughput", connections: 1,
		duration: time.Second, topic: "t", partitions: 16, records: 1, size: 1,
		timeout: time.Second, entries: 16, format: "json", maxBytes: 1, readParts: 1,
		partitionSet: "0, 3,7"}
	if err := validate(&c); err != nil {
		t.Fatal(err)
	}
	if c.entries != 3 {
		t.Fatalf("entries %d, want 3 (the set's size)", c.entries)
	}
	bodies, _, _, _ := throughputBodies(&c)
	got := fmt.Sprint(bodyPartitions(t, bodies))
	if want := "[[0 3 7] [3 7 0] [7 0 3]]"; got != want {
		t.Fatalf("partitions per body %s, want %s", got, want)
	}
	c.entries, c.partitionSet = 2, "5,9"
	if err := validate(&c); err != nil || c.entries != 2 {
		t.Fatalf("entries %d, err %v", c.entries, err)
	}
	// Without a set: every partition, as before.
	c.entries, c.partitions, c.partitionSet = 2, 3, ""
	if err := validate(&c); err != nil {
		t.Fatal(err)
	}
	bodies, _, _, _ = throughputBodies(&c)
	if got, want := fmt.Sprint(bodyPartitions(t, bodies)), "[[0 1] [1 2] [2 0]]"; got != want {
		t.Fatalf("partitions per body %s, want %s", got, want)
	}
}

func TestPartitionSetValidation(t *testing.T) {
	for _, set := range []string{"16", "-1", "1,1", "x", "1,,2"} {
		c := config{url: "http://h:1", path: "/produce", mode: "throughput", connections: 1,
			duration: time.Second, topic: "t", partitions: 16, records: 1, size: 1,
			timeout: time.Second, entries: 1, format: "json", maxBytes: 1, readParts: 1,
			partitionSet: set}
		if err := validate(&c); err == nil || !strings.HasPrefix(err.Error(), "-partition-set ") {
			t.Fatalf("%q: got %v", set, err)
		}
	}
	c := config{url: "http://h:1", path: "/produce", mode: "e2e", connections: 1,
		duration: time.Second, topic: "t", partitions: 16, records: 1, size: 1,
		timeout: time.Second, entries: 1, format: "json", maxBytes: 1, readParts: 1,
		partitionSet: "1"}
	if err := validate(&c); err == nil || !strings.HasPrefix(err.Error(), "-partition-set ") {
		t.Fatalf("e2e: got %v", err)
	}
}

// With -rate the connections send one request per due time, not back to back: never
// more requests than due times in the run, whatever the server's speed.
func TestThroughputRateBoundsTheRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"results":[]}`))
	}))
	defer srv.Close()
	c := config{url: srv.URL, path: "/produce", mode: "throughput", connections: 4,
		duration: 200 * time.Millisecond, topic: "t", partitions: 2, records: 1, size: 8,
		timeout: 5 * time.Second, entries: 2, format: "binary", maxBytes: 1, readParts: 1,
		rate: 50}
	if err := validate(&c); err != nil {
		t.Fatal(err)
	}
	res, err := runThroughput(&c)
	if err != nil {
		t.Fatal(err)
	}
	// due times every 20 ms in [0, 200 ms): 10 of them
	if res.Requests < 1 || res.Requests > 10 || res.OK != res.Requests ||
		res.RateRequestsPerS != 50 {
		t.Fatalf("got %+v", res)
	}
}
