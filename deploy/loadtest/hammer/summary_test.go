package main

import (
	"encoding/json"
	"testing"

	"llog.local/loadtest/latency"
)

func TestSummaryMsIsNullWhileEmpty(t *testing.T) {
	data, err := json.Marshal(summaryMs(latency.New()))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"count":0,"max":null,"mean":null,"min":null,"p50":null,"p90":null,"p99":null,"p999":null}`
	if string(data) != want {
		t.Fatalf("got %s", data)
	}
}

func TestSummaryMsInMilliseconds(t *testing.T) {
	h := latency.New()
	for _, us := range []int64{1500, 2500, 120_000} {
		h.Record(us)
	}
	got := summaryMs(h)
	s := h.Summary()
	want := map[string]any{"count": int64(3), "min": 1.5, "mean": 41.333, "max": 120.0,
		"p50": float64(s.P50) / 1000, "p90": 120.0, "p99": 120.0, "p999": 120.0}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: got %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	if p50 := got["p50"].(float64); p50 < 2.5 || p50 > 2.52 {
		t.Fatalf("p50 %v ms, want the bucket of 2.5 ms", p50)
	}
}
