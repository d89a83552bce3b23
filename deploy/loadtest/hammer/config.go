package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
)

// Config is written by the Python orchestrator (app/loadtest/hammer.py) as
// hammer-config.json; the routing of every partition comes from routing-manifest.json.
type Config struct {
	RunID             string            `json:"run_id"`
	Brokers           []BrokerConfig    `json:"brokers"`
	Partitions        []PartitionConfig `json:"partitions"`
	Policy            string            `json:"policy"`
	Mode              string            `json:"mode"`
	Connections       int               `json:"connections"`
	Rate              float64           `json:"rate"`
	DurationS         float64           `json:"duration_s"`
	WarmupS           float64           `json:"warmup_s"`
	RecordBytes       int               `json:"record_bytes"`
	RecordsPerRequest int               `json:"records_per_request"`
	EntriesPerRequest int               `json:"entries_per_request"`
	RequestTimeoutS   float64           `json:"request_timeout_s"`
	MaxRetries        int               `json:"max_retries"`
	RetryBackoffMs    int               `json:"retry_backoff_ms"`
	RetryBackoffMaxMs int               `json:"retry_backoff_max_ms"`
	IdempotencyKeys   bool              `json:"idempotency_keys"`
	KeyWindow         int               `json:"key_window"` // keys a partition remembers
	IntervalS         float64           `json:"interval_s"`
	DownBackoffMs     int               `json:"down_backoff_ms"`
	Consumer          ConsumerConfig    `json:"consumer"`
	Out               OutConfig         `json:"out"`
}

type BrokerConfig struct {
	ID    string `json:"id"`
	URL   string `json:"url"`
	Write bool   `json:"write"`
	Read  bool   `json:"read"`
}

type PartitionConfig struct {
	Topic     string   `json:"topic"`
	Partition int      `json:"partition"`
	Owners    []string `json:"owners"`
	Readers   []string `json:"readers"`
}

type ConsumerConfig struct {
	Enabled                 bool    `json:"enabled"`
	MaxWaitMs               int     `json:"max_wait_ms"`
	MaxPartitionsPerRequest int     `json:"max_partitions_per_request"`
	MaxBytes                int     `json:"max_bytes"`
	DrainTimeoutS           float64 `json:"drain_timeout_s"`
}

type OutConfig struct {
	Dir         string `json:"dir"`
	Intervals   string `json:"client_intervals"`
	Summary     string `json:"client_summary"`
	RemapEvents string `json:"remap_events"`
	RetryEvents string `json:"retry_events"`
	Acked       string `json:"acked"`
}

var topicRe = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

func loadConfig(path string) (*Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c := &Config{Policy: "round_robin", Mode: "closed", Connections: 1, RecordBytes: 100,
		RecordsPerRequest: 1, EntriesPerRequest: 1, RequestTimeoutS: 10, MaxRetries: 3,
		RetryBackoffMs: 50, RetryBackoffMaxMs: 1000, IdempotencyKeys: true, KeyWindow: 64,
		IntervalS: 30, DownBackoffMs: 500}
	if err := json.Unmarshal(raw, c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := checkLayout(c); err != nil {
		return nil, err
	}
	switch c.Mode {
	case "closed":
	case "open":
		if c.Rate <= 0 {
			return nil, fmt.Errorf("open-loop mode needs rate > 0")
		}
	default:
		return nil, fmt.Errorf("mode must be closed or open, not %q", c.Mode)
	}
	if c.Policy != "round_robin" && c.Policy != "least_inflight" {
		return nil, fmt.Errorf("policy must be round_robin or least_inflight, not %q", c.Policy)
	}
	if c.Connections < 1 || c.RecordsPerRequest < 1 || c.EntriesPerRequest < 1 ||
		c.RecordBytes < 1 || c.DurationS <= 0 || c.KeyWindow < 1 {
		return nil, fmt.Errorf("connections, records_per_request, entries_per_request, " +
			"record_bytes, duration_s and key_window must be positive")
	}
	if c.MaxRetries < 0 || c.RetryBackoffMs < 0 || c.RetryBackoffMaxMs < c.RetryBackoffMs {
		return nil, fmt.Errorf("max_retries and retry_backoff_ms must be >= 0, " +
			"retry_backoff_max_ms >= retry_backoff_ms")
	}
	if c.IntervalS <= 0 {
		c.IntervalS = 30
	}
	if c.Consumer.MaxWaitMs <= 0 {
		c.Consumer.MaxWaitMs = 500
	}
	if c.Consumer.MaxPartitionsPerRequest <= 0 {
		c.Consumer.MaxPartitionsPerRequest = 16
	}
	if c.Consumer.MaxBytes <= 0 {
		c.Consumer.MaxBytes = 4 << 20
	}
	if c.Consumer.DrainTimeoutS <= 0 {
		c.Consumer.DrainTimeoutS = 5
	}
	return c, nil
}

// checkLayout checks that every partition has owners and names only known brokers.
func checkLayout(c *Config) error {
	if len(c.Brokers) == 0 || len(c.Partitions) == 0 {
		return fmt.Errorf("config needs brokers and partitions")
	}
	ids := map[string]bool{}
	for _, b := range c.Brokers {
		ids[b.ID] = true
	}
	for _, p := range c.Partitions {
		if !topicRe.MatchString(p.Topic) {
			return fmt.Errorf("invalid topic %q", p.Topic)
		}
		if len(p.Owners) == 0 {
			return fmt.Errorf("%s/%d has an empty owner set", p.Topic, p.Partition)
		}
		for _, o := range append(append([]string{}, p.Owners...), p.Readers...) {
			if !ids[o] {
				return fmt.Errorf("%s/%d: unknown broker %q", p.Topic, p.Partition, o)
			}
		}
	}
	return nil
}
