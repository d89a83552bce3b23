package main

import (
	"math"

	"llog.local/loadtest/latency"
)

// summaryMs is a latency summary in milliseconds, as client-30s.jsonl and
// client-summary.json carry it: every figure is null while nothing was recorded.
func summaryMs(h *latency.Histogram) map[string]any {
	s := h.Summary()
	figures := map[string]float64{
		"min": float64(s.Min), "mean": math.Round(s.Mean), "p50": float64(s.P50),
		"p90": float64(s.P90), "p99": float64(s.P99), "p999": float64(s.P999),
		"max": float64(s.Max),
	}
	out := map[string]any{"count": s.Count}
	for k, us := range figures {
		if s.Count == 0 {
			out[k] = nil
		} else {
			out[k] = us / 1000
		}
	}
	return out
}
