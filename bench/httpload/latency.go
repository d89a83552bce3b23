package main

import "llog.local/loadtest/latency"

// LatencySummary is how the result JSON carries a latency histogram (milliseconds).
type LatencySummary struct {
	Count  int64   `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func summarize(h *latency.Histogram) LatencySummary {
	s := h.Summary()
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return LatencySummary{Count: s.Count, MeanMs: s.Mean / 1000, P50Ms: ms(s.P50),
		P90Ms: ms(s.P90), P99Ms: ms(s.P99), P999Ms: ms(s.P999), MaxMs: ms(s.Max)}
}
