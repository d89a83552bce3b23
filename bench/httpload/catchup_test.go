package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// One request asks for every partition not caught up yet, each from where it ended.
func TestCatchupReadsEveryPartitionInEachRequest(t *testing.T) {
	highWater := map[int]int64{0: 3, 1: 1, 2: 2} // partition 1 is done after one answer
	var asked [][]int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			TPs []struct {
				Partition   int   `json:"partition"`
				FetchOffset int64 `json:"fetch_offset"`
			} `json:"topic_partitions"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request: %v", err)
		}
		parts := []int{}
		results := []map[string]any{}
		for _, tp := range req.TPs {
			parts = append(parts, tp.Partition)
			results = append(results, map[string]any{"ok": true,
				"next_offset": tp.FetchOffset + 1, "high_watermark": highWater[tp.Partition],
				"records": []map[string]any{{"value": "abcd"}}})
		}
		asked = append(asked, parts)
		_ = json.NewEncoder(w).Encode(map[string]any{"results": results})
	}))
	defer srv.Close()
	c := config{consumeURL: srv.URL, topic: "t", format: "json", maxBytes: 1 << 20,
		catchupMiB: 1, fromOffset: 1, readParts: 3, timeout: 5 * time.Second}
	res, err := runCatchup(&c)
	if err != nil {
		t.Fatal(err)
	}
	if !res.CaughtUp || res.Records != 6 || res.RecordBytes != 24 || res.Requests != 3 ||
		res.Partitions != 3 {
		t.Fatalf("got %+v", res)
	}
	want := [][]int{{0, 1, 2}, {0, 2}, {0}}
	if len(asked) != len(want) {
		t.Fatalf("asked %v", asked)
	}
	for i := range want {
		if len(asked[i]) != len(want[i]) {
			t.Fatalf("asked %v", asked)
		}
		for j := range want[i] {
			if asked[i][j] != want[i][j] {
				t.Fatalf("asked %v", asked)
			}
		}
	}
}
