package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"time"

	"llog.local/loadtest/latency"
)

// CatchupResult is one consumer reading partitions 0..-catchup-partitions-1 from
// -from-offset as fast as the server answers, all of them in every request (-max-bytes
// per request), until -catchup-mib of record bytes or every high watermark.
type CatchupResult struct {
	Mode         string         `json:"mode"`
	URL          string         `json:"url"`
	Format       string         `json:"format"`
	Partitions   int            `json:"partitions"`
	MaxBytes     int            `json:"max_bytes"`
	PartitionMax int            `json:"partition_max_bytes"`
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
		Partitions: c.readParts, MaxBytes: c.maxBytes, PartitionMax: c.partMax, GoVersion: runtime.Version()}
	var dials dialCounter
	client := newClient(1, c.timeout, &dials)
	defer client.CloseIdleConnections()
	hist := latency.New()
	var samples errorSamples
	target := int64(c.catchupMiB) << 20
	offsets := map[int]int64{}
	for p := 0; p < c.readParts; p++ {
		offsets[p] = c.fromOffset
	}
	var body []byte // one buffer for every answer (readBody)
	cpu0 := cpuSeconds()
	start := time.Now()
	for res.RecordBytes < target && res.Errors < 10 && len(offsets) > 0 {
		t0 := time.Now()
		parts, n, size, answer, err := c.consumeOnce(client, offsets, &body)
		res.Requests++
		if err != nil {
			res.Errors++
			samples.add(err.Error())
			continue
		}
		hist.RecordDuration(time.Since(t0))
		res.Records += uint64(n)
		res.RecordBytes += size
		res.BodyBytes += answer
		for _, r := range parts {
			offsets[r.partition] = r.next
			if r.next > r.highWater {
				delete(offsets, r.partition) // caught up
			}
		}
	}
	res.CaughtUp = len(offsets) == 0
	res.ElapsedS = time.Since(start).Seconds()
	res.MiBPerS = float64(res.RecordBytes) / res.ElapsedS / (1 << 20)
	res.RecordsPerS = float64(res.Records) / res.ElapsedS
	res.Latency = summarize(hist)
	res.ErrorSamples = samples.list()
	res.CPUSeconds = cpuSeconds() - cpu0
	return res, nil
}

// partitionRead is where one partition of an answer ends.
type partitionRead struct {
	partition       int
	next, highWater int64
}

// consumeOnce reads every partition of offsets (in partition order) from its offset:
// where each ends, records, record bytes and answer bytes.
func (c *config) consumeOnce(client *http.Client, offsets map[int]int64, buf *[]byte) ([]partitionRead,
	int, int64, int64, error) {
	order := make([]int, 0, len(offsets))
	for p := range offsets {
		order = append(order, p)
	}
	sort.Ints(order)
	tps := make([]map[string]any, 0, len(order))
	for _, p := range order {
		tp := map[string]any{"topic": c.topic, "partition": p, "fetch_offset": offsets[p]}
		if c.partMax > 0 {
			tp["partition_max_bytes"] = c.partMax
		}
		tps = append(tps, tp)
	}
	req, _ := json.Marshal(map[string]any{
		"topic_partitions": tps, "max_wait_ms": 0, "max_bytes": c.maxBytes,
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
		return nil, 0, 0, 0, err
	}
	defer resp.Body.Close()
	raw, err := readBody(resp, buf)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, 0, 0, 0, fmt.Errorf("status %d: %v %.200s", resp.StatusCode, err, raw)
	}
	out := make([]partitionRead, 0, len(order))
	records, size := 0, int64(0)
	if c.format == "binary" {
		results, ok := parseLLR1(raw, false)
		if !ok || len(results) != len(order) {
			return nil, 0, 0, 0, fmt.Errorf("bad binary answer (%d bytes)", len(raw))
		}
		for i, r := range results {
			if !r.ok {
				return nil, 0, 0, 0, fmt.Errorf("partition %d failed: %.200s", order[i], r.err)
			}
			out = append(out, partitionRead{order[i], r.nextOffset, r.highWater})
			records += r.records
			size += r.recordBytes
		}
		return out, records, size, int64(len(raw)), nil
	}
	var jc jsonConsume
	if err := json.Unmarshal(raw, &jc); err != nil || len(jc.Results) != len(order) {
		return nil, 0, 0, 0, fmt.Errorf("bad JSON answer: %v %.200s", err, raw)
	}
	for i, r := range jc.Results {
		if !r.OK {
			return nil, 0, 0, 0, fmt.Errorf("partition %d failed: %s", order[i], r.ErrorType)
		}
		out = append(out, partitionRead{order[i], r.NextOffset, r.HighWatermark})
		records += len(r.Records)
		for _, rec := range r.Records {
			size += int64(len(rec.Value)) + int64(len(rec.Base64))*3/4
		}
	}
	return out, records, size, int64(len(raw)), nil
}

// readBody reads a whole answer into *buf, grown to the declared length when it must and
// reused for the next answer: io.ReadAll would grow a fresh buffer by doubling for every
// answer, copying a 4 MiB answer about twice more and leaving the collector 8 MiB each.
func readBody(resp *http.Response, buf *[]byte) ([]byte, error) {
	if resp.ContentLength < 0 {
		return io.ReadAll(resp.Body)
	}
	n := int(resp.ContentLength)
	if cap(*buf) < n {
		*buf = make([]byte, n)
	}
	body := (*buf)[:n]
	_, err := io.ReadFull(resp.Body, body)
	return body, err
}
