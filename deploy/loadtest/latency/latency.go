// Package latency is the latency histogram of the project's load generators (the
// load-test hammer and the HTTP benchmark's httpload): an HDR histogram from
// github.com/HdrHistogram/hdrhistogram-go, read out one way, so that the percentiles
// both report can be compared.
//
// Values are microseconds, kept to two significant digits (each bucket is at most 1/128
// of its values wide, under 0.8%). A percentile is the highest value of the bucket that
// holds it, never above the largest value recorded. Count, minimum, maximum and mean are
// exact. Not safe for concurrent use; callers hold a lock or keep one per goroutine.
package latency

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// HighestUs is the largest value kept apart: longer latencies (beyond any request
// timeout) are recorded as this.
const HighestUs = int64(time.Hour / time.Microsecond)

const significantDigits = 2

// Histogram of latencies in microseconds.
type Histogram struct {
	hdr      *hdrhistogram.Histogram
	sum      float64
	min, max int64
}

func New() *Histogram {
	return &Histogram{hdr: hdrhistogram.New(1, HighestUs, significantDigits)}
}

// Record adds one value, clamped to 0..HighestUs.
func (h *Histogram) Record(us int64) {
	us = min(max(us, 0), HighestUs)
	if err := h.hdr.RecordValue(us); err != nil {
		panic(err) // cannot happen: the value is within the histogram's range
	}
	if h.hdr.TotalCount() == 1 || us < h.min {
		h.min = us
	}
	h.max = max(h.max, us)
	h.sum += float64(us)
}

// RecordDuration adds one duration, in whole microseconds.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(d.Microseconds()) }

// Merge adds every value of o.
func (h *Histogram) Merge(o *Histogram) {
	if o.Count() == 0 {
		return
	}
	if h.Count() == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.sum += o.sum
	h.hdr.Merge(o.hdr) // same range on both sides: nothing is dropped
}

func (h *Histogram) Count() int64 { return h.hdr.TotalCount() }

// Quantile is the value at quantile q (0..1), see the package comment; 0 when empty.
func (h *Histogram) Quantile(q float64) int64 {
	if h.Count() == 0 {
		return 0
	}
	return min(h.hdr.ValueAtQuantile(q*100), h.max)
}

// Summary is what the load generators report, in microseconds.
type Summary struct {
	Count               int64
	Min, Max            int64
	Mean                float64
	P50, P90, P99, P999 int64
}

func (h *Histogram) Summary() Summary {
	s := Summary{Count: h.Count()}
	if s.Count == 0 {
		return s
	}
	s.Min, s.Max, s.Mean = h.min, h.max, h.sum/float64(s.Count)
	s.P50, s.P90, s.P99, s.P999 = h.Quantile(0.5), h.Quantile(0.9), h.Quantile(0.99),
		h.Quantile(0.999)
	return s
}

// Buckets lists the non-empty buckets as [lowest, highest, count], in microseconds.
func (h *Histogram) Buckets() [][3]int64 {
	out := [][3]int64{}
	for _, bar := range h.hdr.Distribution() {
		if bar.Count > 0 {
			out = append(out, [3]int64{bar.From, bar.To, bar.Count})
		}
	}
	return out
}
