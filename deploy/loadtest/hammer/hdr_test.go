package main

import (
	"math/rand"
	"sort"
	"testing"
)

func TestBucketsAreContiguous(t *testing.T) {
	var prevHi uint64
	for i := 0; i < 1<<subBits+40*(1<<(subBits-1)); i++ {
		lo, hi := bucketBounds(i)
		if i > 0 && lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if bucketIndex(lo) != i || bucketIndex(hi) != i {
			t.Fatalf("bucket %d [%d,%d] maps to %d/%d", i, lo, hi, bucketIndex(lo), bucketIndex(hi))
		}
		prevHi = hi
	}
}

func TestQuantileWithinOnePercent(t *testing.T) {
	h := NewHistogram()
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
		diff := float64(got-exact) / float64(exact)
		if diff > 0.01 || diff < -0.01 {
			t.Fatalf("q%.3f: got %d, exact %d", q, got, exact)
		}
	}
}
