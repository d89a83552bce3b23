package main

import (
	"math/bits"
	"time"
)

// A log-linear latency histogram in microseconds: values below 2^subBits are counted
// exactly; above, every power of two is split into 2^subBits linear buckets, so any
// recorded value is known to within 1/2^subBits (about 3 %). No allocation per sample,
// a fixed 9 KiB per histogram, mergeable.

const (
	subBits    = 5
	subCount   = 1 << subBits
	maxExp     = 40 // 2^40 us: about 12 days, far beyond any timeout
	numBuckets = subCount + (maxExp-subBits+1)*subCount
)

type Histogram struct {
	counts [numBuckets]uint64
	n      uint64
	sumUs  uint64
	maxUs  uint64
	minUs  uint64
}

func bucketOf(us uint64) int {
	if us < subCount {
		return int(us)
	}
	e := bits.Len64(us) - 1 // >= subBits
	if e > maxExp {
		return numBuckets - 1
	}
	shift := e - subBits
	sub := int(us>>uint(shift)) - subCount // 0 .. subCount-1
	return subCount + (e-subBits)*subCount + sub
}

// upperOf is the largest value that falls in bucket i.
func upperOf(i int) uint64 {
	if i < subCount {
		return uint64(i)
	}
	k := i - subCount
	e := k/subCount + subBits
	sub := uint64(k % subCount)
	shift := uint(e - subBits)
	lower := (subCount + sub) << shift
	return lower + (uint64(1) << shift) - 1
}

func (h *Histogram) Record(d time.Duration) {
	us := uint64(0)
	if d > 0 {
		us = uint64(d / time.Microsecond)
	}
	h.counts[bucketOf(us)]++
	if h.n == 0 || us < h.minUs {
		h.minUs = us
	}
	h.n++
	h.sumUs += us
	if us > h.maxUs {
		h.maxUs = us
	}
}

func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i := range h.counts {
		h.counts[i] += o.counts[i]
	}
	if h.n == 0 || o.minUs < h.minUs {
		h.minUs = o.minUs
	}
	h.n += o.n
	h.sumUs += o.sumUs
	if o.maxUs > h.maxUs {
		h.maxUs = o.maxUs
	}
}

// Quantile in microseconds: the upper bound of the bucket holding the q-th sample,
// clamped to the observed maximum.
func (h *Histogram) Quantile(q float64) uint64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.999999)
	if rank < 1 {
		rank = 1
	}
	if rank > h.n {
		rank = h.n
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			v := upperOf(i)
			if v > h.maxUs {
				v = h.maxUs
			}
			if v < h.minUs {
				v = h.minUs
			}
			return v
		}
	}
	return h.maxUs
}

type LatencySummary struct {
	Count  uint64  `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	P50Ms  float64 `json:"p50_ms"`
	P90Ms  float64 `json:"p90_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	MaxMs  float64 `json:"max_ms"`
}

func (h *Histogram) Summary() LatencySummary {
	ms := func(us uint64) float64 { return float64(us) / 1000 }
	s := LatencySummary{Count: h.n}
	if h.n == 0 {
		return s
	}
	s.MeanMs = float64(h.sumUs) / float64(h.n) / 1000
	s.P50Ms = ms(h.Quantile(0.50))
	s.P90Ms = ms(h.Quantile(0.90))
	s.P99Ms = ms(h.Quantile(0.99))
	s.P999Ms = ms(h.Quantile(0.999))
	s.MaxMs = ms(h.maxUs)
	return s
}
