package latency

import (
	"math/rand"
	"sort"
	"testing"
	"time"
)

func TestQuantilesWithinOnePercentAndNeverAboveTheMaximum(t *testing.T) {
	h := New()
	rng := rand.New(rand.NewSource(1))
	vals := make([]int64, 100000)
	for i := range vals {
		vals[i] = int64(rng.ExpFloat64() * 20000)
		h.Record(vals[i])
	}
	sort.Slice(vals, func(a, b int) bool { return vals[a] < vals[b] })
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := h.Quantile(q)
		if got < exact || float64(got-exact) > 0.01*float64(exact) {
			t.Fatalf("q%.3f: got %d, exact %d", q, got, exact)
		}
	}
	if got, top := h.Quantile(1), vals[len(vals)-1]; got != top {
		t.Fatalf("q1: got %d, largest value %d", got, top)
	}
	s := h.Summary()
	if s.Count != int64(len(vals)) || s.Min != vals[0] || s.Max != vals[len(vals)-1] {
		t.Fatalf("summary %+v", s)
	}
}

func TestSmallValuesAreExactAndOutOfRangeValuesClamped(t *testing.T) {
	h := New()
	for _, us := range []int64{-5, 0, 7, 100, 199} {
		h.Record(us)
	}
	if got := []int64{h.Quantile(0.2), h.Quantile(0.6), h.Quantile(0.8), h.Quantile(1)}; got[0] != 0 ||
		got[1] != 7 || got[2] != 100 || got[3] != 199 {
		t.Fatalf("quantiles %v", got)
	}
	h.RecordDuration(48 * time.Hour)
	if s := h.Summary(); s.Max != HighestUs || s.Min != 0 || h.Quantile(1) != HighestUs {
		t.Fatalf("clamped: %+v", s)
	}
}

func TestMergeAndEmpty(t *testing.T) {
	a, b := New(), New()
	if s := a.Summary(); s != (Summary{}) || a.Quantile(0.5) != 0 || len(a.Buckets()) != 0 {
		t.Fatalf("empty: %+v", s)
	}
	for i := int64(1); i <= 1000; i++ {
		a.RecordDuration(time.Duration(i) * time.Millisecond)
	}
	b.RecordDuration(5 * time.Second)
	b.Record(3)
	a.Merge(b)
	a.Merge(New())
	s := a.Summary()
	if s.Count != 1002 || s.Max != 5_000_000 || s.Min != 3 {
		t.Fatalf("merged: %+v", s)
	}
	if s.P50 < 499_000 || s.P50 > 505_000 || s.P99 < 989_000 || s.P99 > 1_000_000 {
		t.Fatalf("merged percentiles: %+v", s)
	}
	var total int64
	prevHigh := int64(-1)
	for _, b := range a.Buckets() {
		if b[0] <= prevHigh || b[1] < b[0] || b[2] < 1 {
			t.Fatalf("bucket %v after one ending at %d", b, prevHigh)
		}
		prevHigh = b[1]
		total += b[2]
	}
	if total != s.Count {
		t.Fatalf("buckets hold %d values, want %d", total, s.Count)
	}
}
