package main

import (
	"math"
	"math/bits"
)

// Histogram is a log-linear ("HDR-style") histogram of non-negative integer values
// (microseconds here). Values below 2^subBits are counted exactly; above that every
// power-of-two range is split into 2^(subBits-1) equal buckets, so a bucket is at most
// 1/2^(subBits-1) of its value wide: with subBits = 8 the relative error is below 0.8%.
// Not safe for concurrent use; callers hold a lock.
type Histogram struct {
	counts []uint64
	total  uint64
	sum    float64
	min    int64
	max    int64
}

const subBits = 8

func NewHistogram() *Histogram { return &Histogram{min: math.MaxInt64} }

func bucketIndex(v uint64) int {
	if v < 1<<subBits {
		return int(v)
	}
	shift := bits.Len64(v) - subBits
	top := v >> uint(shift)
	return 1<<subBits + (shift-1)<<(subBits-1) + int(top-1<<(subBits-1))
}

// bucketBounds returns the lowest and highest value counted by bucket i.
func bucketBounds(i int) (uint64, uint64) {
	if i < 1<<subBits {
		return uint64(i), uint64(i)
	}
	rel := i - 1<<subBits
	shift := rel>>(subBits-1) + 1
	top := uint64(rel&(1<<(subBits-1)-1)) + 1<<(subBits-1)
	lo := top << uint(shift)
	hi := (top+1)<<uint(shift) - 1
	return lo, hi
}

func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	i := bucketIndex(uint64(v))
	if i >= len(h.counts) {
		grown := make([]uint64, i+1+i/4)
		copy(grown, h.counts)
		h.counts = grown
	}
	h.counts[i]++
	h.total++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

func (h *Histogram) Merge(o *Histogram) {
	if o.total == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		grown := make([]uint64, len(o.counts))
		copy(grown, h.counts)
		h.counts = grown
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.sum += o.sum
	if o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
}

func (h *Histogram) Count() uint64 { return h.total }

// Quantile returns the value at quantile q (0..1): the midpoint of the bucket holding the
// ceil(q*count)-th value, clamped to the recorded minimum and maximum.
func (h *Histogram) Quantile(q float64) int64 {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketBounds(i)
			v := int64(lo + (hi-lo)/2)
			if v > h.max {
				v = h.max
			}
			if v < h.min {
				v = h.min
			}
			return v
		}
	}
	return h.max
}

// Summary in milliseconds (values are recorded in microseconds).
func (h *Histogram) SummaryMs() map[string]any {
	out := map[string]any{"count": h.total}
	if h.total == 0 {
		for _, k := range []string{"min", "mean", "p50", "p90", "p99", "p999", "max"} {
			out[k] = nil
		}
		return out
	}
	ms := func(us int64) float64 { return math.Round(float64(us)) / 1000 }
	out["min"] = ms(h.min)
	out["mean"] = math.Round(h.sum/float64(h.total)) / 1000
	out["p50"] = ms(h.Quantile(0.50))
	out["p90"] = ms(h.Quantile(0.90))
	out["p99"] = ms(h.Quantile(0.99))
	out["p999"] = ms(h.Quantile(0.999))
	out["max"] = ms(h.max)
	return out
}

// Buckets lists the non-empty buckets as [low_us, high_us, count] for offline analysis.
func (h *Histogram) Buckets() [][3]uint64 {
	out := [][3]uint64{}
	for i, c := range h.counts {
		if c > 0 {
			lo, hi := bucketBounds(i)
			out = append(out, [3]uint64{lo, hi, c})
		}
	}
	return out
}
