package main

import (
	"encoding/json"
	"testing"
	"time"

	"llog.local/loadtest/latency"
)

func TestSummarizeInMilliseconds(t *testing.T) {
	h := latency.New()
	for i := 1; i <= 1000; i++ {
		h.RecordDuration(time.Duration(i) * time.Millisecond)
	}
	s := summarize(h)
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"p50", s.P50Ms, 500}, {"p90", s.P90Ms, 900}, {"p99", s.P99Ms, 990}, {"max", s.MaxMs, 1000}} {
		if c.got < c.want || c.got > c.want*1.01 {
			t.Fatalf("%s: got %.3f ms, want about %.0f", c.name, c.got, c.want)
		}
	}
	if s.Count != 1000 || s.MeanMs != 500.5 {
		t.Fatalf("summary %+v", s)
	}
	data, err := json.Marshal(summarize(latency.New()))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"count":0,"mean_ms":0,"p50_ms":0,"p90_ms":0,"p99_ms":0,"p999_ms":0,"max_ms":0}`
	if string(data) != want {
		t.Fatalf("empty: %s", data)
	}
}
