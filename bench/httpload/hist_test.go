package main

import (
	"testing"
	"time"
)

func TestBucketsRoundTrip(t *testing.T) {
	prev := -1
	for _, us := range []uint64{0, 1, 31, 32, 33, 63, 64, 65, 100, 1000, 12345, 1 << 30, 1<<40 - 1} {
		i := bucketOf(us)
		if i < prev {
			t.Fatalf("bucket of %d (%d) below previous %d", us, i, prev)
		}
		prev = i
		if up := upperOf(i); up < us || float64(up-us) > float64(us)/float64(subCount)+1 {
			t.Fatalf("value %d: bucket %d upper %d", us, i, up)
		}
		if i > 0 && upperOf(i-1) >= us {
			t.Fatalf("value %d: previous bucket upper %d not below it", us, upperOf(i-1))
		}
	}
}

func TestQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 500_000}, {0.9, 900_000}, {0.99, 990_000}, {1, 1_000_000}} {
		got := float64(h.Quantile(c.q))
		if got < c.want || got > c.want*1.04 {
			t.Fatalf("q%.2f: got %.0f us, want about %.0f", c.q, got, c.want)
		}
	}
	var other Histogram
	other.Record(5 * time.Second)
	h.Merge(&other)
	if h.Summary().MaxMs != 5000 || h.Summary().Count != 1001 {
		t.Fatalf("merge: %+v", h.Summary())
	}
}
