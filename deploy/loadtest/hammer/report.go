// Reporting: a line of client-30s.jsonl per interval and client-summary.json at the end.

package main

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"time"

	"llog.local/loadtest/latency"
)

type intervalState struct {
	at       time.Time
	records  int64
	bytes    int64
	requests int64
	retries  int64
	errors   int64
	consRecs int64
}

func (h *Hammer) reporter(ctx context.Context, out *os.File, done chan<- struct{}) {
	defer close(done)
	h.last = intervalState{at: h.start}
	every := time.Duration(h.cfg.IntervalS * float64(time.Second))
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-ticker.C:
			h.writeInterval(out, now, false)
		}
	}
}

func (h *Hammer) failedTotal() int64 {
	h.stats.mu.Lock()
	defer h.stats.mu.Unlock()
	var n int64
	for _, v := range h.stats.errors {
		n += v
	}
	return n
}

func (h *Hammer) writeInterval(out *os.File, now time.Time, final bool) {
	s := h.stats
	s.mu.Lock()
	lat := s.latInterval
	s.latInterval = latency.New()
	e2e := s.e2eInterval
	s.e2eInterval = latency.New()
	s.mu.Unlock()
	cur := intervalState{at: now, records: s.ackedRecords.Load(), bytes: s.ackedBytes.Load(),
		requests: s.requests.Load(), retries: s.retries.Load(), errors: h.failedTotal(),
		consRecs: s.consRecords.Load()}
	dt := now.Sub(h.last.at).Seconds()
	if dt <= 0 {
		return
	}
	if final && cur.records == h.last.records && cur.requests == h.last.requests &&
		cur.consRecs == h.last.consRecs {
		return
	}
	line := map[string]any{
		"ts":                  float64(now.UnixNano()) / 1e9,
		"elapsed_s":           math.Round(now.Sub(h.start).Seconds()*1000) / 1000,
		"interval_s":          math.Round(dt*1000) / 1000,
		"final":               final,
		"acked_records":       cur.records - h.last.records,
		"acked_bytes":         cur.bytes - h.last.bytes,
		"requests":            cur.requests - h.last.requests,
		"retries":             cur.retries - h.last.retries,
		"errors":              cur.errors - h.last.errors,
		"records_per_s":       float64(cur.records-h.last.records) / dt,
		"mib_per_s":           float64(cur.bytes-h.last.bytes) / dt / (1 << 20),
		"inflight":            s.inflight.Load(),
		"latency_ms":          summaryMs(lat),
		"consumed_records":    cur.consRecs - h.last.consRecs,
		"e2e_latency_ms":      summaryMs(e2e),
		"acked_records_total": cur.records,
	}
	data, _ := json.Marshal(line)
	out.Write(append(data, '\n'))
	h.last = cur
}

func (h *Hammer) writeSummary(end time.Time, events *EventLog) error {
	cfg := h.cfg
	measured := end.Sub(h.measureAt).Seconds()
	if measured <= 0 {
		measured = end.Sub(h.start).Seconds()
	}
	byBroker := map[string]any{}
	for _, b := range h.order {
		byBroker[b.ID] = map[string]any{"requests": b.requests.Load(), "acked_records": b.acked.Load(),
			"errors": b.errors.Load(), "url": b.URL}
	}
	summary := map[string]any{
		"version":      1,
		"run_id":       cfg.RunID,
		"mode":         cfg.Mode,
		"policy":       cfg.Policy,
		"connections":  cfg.Connections,
		"target_rate":  cfg.Rate,
		"started_at":   float64(h.start.UnixNano()) / 1e9,
		"finished_at":  float64(end.UnixNano()) / 1e9,
		"duration_s":   end.Sub(h.start).Seconds(),
		"warmup_s":     cfg.WarmupS,
		"measured_s":   measured,
		"record_bytes": cfg.RecordBytes, "records_per_request": cfg.RecordsPerRequest,
		"entries_per_request": cfg.EntriesPerRequest,
		"partitions":          len(cfg.Partitions),
		"produce":             h.produceSummary(end, measured),
		"consume":             h.consumeSummary(),
		"by_broker":           byBroker,
		"remaps":              h.router.remaps.Load(),
		"broker_down_events":  h.router.downs.Load(),
		"acked_file":          cfg.Out.Acked,
	}
	data, err := json.MarshalIndent(summary, "", "  ")
	if err != nil {
		return err
	}
	path := outPath(cfg, cfg.Out.Summary)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func copyCounts(m map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (h *Hammer) produceSummary(end time.Time, measured float64) map[string]any {
	s := h.stats
	s.mu.Lock()
	statuses, errs, reasons := copyCounts(s.statuses), copyCounts(s.errors), copyCounts(s.retryReasons)
	lat := summaryMs(s.lat)
	latBuckets := s.lat.Buckets()
	s.mu.Unlock()
	return map[string]any{
		"requests":                s.requests.Load(),
		"acked_requests":          s.ackedRequests.Load(),
		"entries":                 s.entries.Load(),
		"acked_entries":           s.ackedEntries.Load(),
		"acked_records":           s.ackedRecords.Load(),
		"acked_bytes":             s.ackedBytes.Load(),
		"failed_records":          s.failedRecords.Load(),
		"duplicate_acks":          s.duplicateAcks.Load(),
		"retries":                 s.retries.Load(),
		"retried_entries":         s.retriedEnts.Load(),
		"retry_reasons":           reasons,
		"maybe_written_retries":   s.maybeRetries.Load(),
		"idempotency_keys":        h.cfg.IdempotencyKeys,
		"key_window":              h.cfg.KeyWindow,
		"max_retries":             h.cfg.MaxRetries,
		"statuses":                statuses,
		"errors":                  errs,
		"records_per_s":           float64(s.measuredRecs.Load()) / measured,
		"mib_per_s":               float64(s.measuredBytes.Load()) / measured / (1 << 20),
		"latency_ms":              lat,
		"latency_histogram_us":    latBuckets,
		"late_starts":             s.lateStarts.Load(),
		"max_schedule_lag_ms":     float64(s.scheduleLagUs.Load()) / 1000,
		"achieved_requests_per_s": float64(s.requests.Load()-s.retries.Load()) / end.Sub(h.start).Seconds(),
	}
}

func (h *Hammer) consumeSummary() map[string]any {
	s := h.stats
	s.mu.Lock()
	e2e := summaryMs(s.e2e)
	e2eBuckets := s.e2e.Buckets()
	s.mu.Unlock()
	return map[string]any{
		"enabled":                  h.cfg.Consumer.Enabled,
		"requests":                 s.consRequests.Load(),
		"records":                  s.consRecords.Load(),
		"bytes":                    s.consBytes.Load(),
		"errors":                   s.consErrors.Load(),
		"e2e_latency_ms":           e2e,
		"e2e_latency_histogram_us": e2eBuckets,
	}
}
