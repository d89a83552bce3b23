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
			timeout: time.Second}
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
	} {
		c := good()
		spoil(&c)
		if err := validate(&c); err == nil || !strings.HasPrefix(err.Error(), want+" ") {
			t.Fatalf("%s: got %v", want, err)
		}
	}
}
