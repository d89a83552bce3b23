package main

import (
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
