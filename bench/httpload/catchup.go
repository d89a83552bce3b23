package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"time"

	"llog.local/loadtest/latency"
)

// CatchupResult is one consumer reading a partition from -from-offset as fast as the
// server answers, -max-bytes per request, until -catchup-mib of record bytes or the
// high watermark.
type CatchupResult struct {
	Mode         string         `json:"mode"`
	URL          string         `json:"url"`
	Format       string         `json:"format"`
	MaxBytes     int            `json:"max_bytes"`
	Requests     uint64         `json:"requests"`
	Records      uint64         `json:"records"`
	RecordBytes  int64          `json:"record_bytes"`
	BodyBytes    int64          `json:"body_bytes"`
	ElapsedS     float64        `json:"elapsed_s"`
	MiBPerS      float64        `json:"mib_per_s"`
	RecordsPerS  float64        `json:"records_per_s"`
	CaughtUp     bool           `json:"caught_up"`
	Errors       uint64         `json:"errors"`
	ErrorSamples []string       `json:"error_samples"`
	Latency      LatencySummary `json:"latency_ms"`
	CPUSeconds   float64        `json:"loadgen_cpu_s"`
	GoVersion    string         `json:"go_version"`
}

type jsonConsume struct {
	Results []struct {
		OK            bool   `json:"ok"`
		NextOffset    int64  `json:"next_offset"`
		HighWatermark int64  `json:"high_watermark"`
		ErrorType     string `json:"error_type"`
		Records       []struct {
			Value  string `json:"value"`
			Base64 string `json:"base64"`
		} `json:"records"`
	} `json:"results"`
}

func runCatchup(c *config) (*CatchupResult, error) {
	res := &CatchupResult{Mode: "catchup", URL: c.consumeURL, Format: c.format,
		MaxBytes: c.maxBytes, GoVersion: runtime.Version()}
	var dials dialCounter
	client := newClient(1, c.timeout, &dials)
	defer client.CloseIdleConnections()
	hist := latency.New()
	var samples errorSamples
	target := int64(c.catchupMiB) << 20
	offset := c.fromOffset
	cpu0 := cpuSeconds()
	start := time.Now()
	for res.RecordBytes < target && res.Errors < 10 {
		t0 := time.Now()
		next, hw, n, size, body, err := c.consumeOnce(client, offset)
		res.Requests++
		if err != nil {
			res.Errors++
			samples.add(err.Error())
			continue
		}
		hist.RecordDuration(time.Since(t0))
		res.Records += uint64(n)
		res.RecordBytes += size
		res.BodyBytes += body
		offset = next
		if next > hw {
			res.CaughtUp = true
			break
		}
	}
	res.ElapsedS = time.Since(start).Seconds()
	res.MiBPerS = float64(res.RecordBytes) / res.ElapsedS / (1 << 20)
	res.RecordsPerS = float64(res.Records) / res.ElapsedS
	res.Latency = summarize(hist)
	res.ErrorSamples = samples.list()
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

// consumeOnce reads from offset: next offset, high watermark, records, record bytes and
// answer bytes.
func (c *config) consumeOnce(client *http.Client, offset int64) (int64, int64, int, int64,
	int64, error) {
	req, _ := json.Marshal(map[string]any{
		"topic_partitions": []map[string]any{
			{"topic": c.topic, "partition": 0, "fetch_offset": offset}},
		"max_wait_ms": 0, "max_bytes": c.maxBytes,
	})
	accept := "application/json"
	if c.format == "binary" {
		accept = binaryRecordsType
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	httpReq, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.consumeURL+"/consume",
		bytesReader(req))
	httpReq.Header.Set("Content-Type", "application/json")
	httpReq.Header.Set("Accept", accept)
	resp, err := client.Do(httpReq)
	if err != nil {
		return 0, 0, 0, 0, 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, 0, 0, 0, 0, fmt.Errorf("status %d: %v %.200s", resp.StatusCode, err, raw)
	}
	if c.format == "binary" {
		results, ok := parseLLR1(raw, false)
		if !ok || len(results) != 1 || !results[0].ok {
			return 0, 0, 0, 0, 0, fmt.Errorf("bad binary answer (%d bytes)", len(raw))
		}
		r := results[0]
		return r.nextOffset, r.highWater, r.records, r.recordBytes, int64(len(raw)), nil
	}
	var jc jsonConsume
	if err := json.Unmarshal(raw, &jc); err != nil || len(jc.Results) != 1 || !jc.Results[0].OK {
		return 0, 0, 0, 0, 0, fmt.Errorf("bad JSON answer: %v %.200s", err, raw)
	}
	r := jc.Results[0]
	size := int64(0)
	for _, rec := range r.Records {
		size += int64(len(rec.Value)) + int64(len(rec.Base64))*3/4
	}
	return r.NextOffset, r.HighWatermark, len(r.Records), size, int64(len(raw)), nil
}
