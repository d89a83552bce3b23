// Retries: what an attempt's outcome means for its entries, how long to wait before the
// next attempt, and when a retry would no longer be recognised by the broker.
//
// An attempt the broker may have carried out without the hammer learning the result
// (a connection reset or closed after sending, a timeout, a 5xx other than 503, an
// unreadable answer, an entry failed with maybe_written) is retried with the same
// idempotency keys: the broker answers a key it committed with the first offsets and
// `duplicate: true` instead of writing it again. It remembers the last key_window keys
// per partition, so a retry is only sent while fewer keys than that can have been
// committed to the partition after the entry's own.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// outcome is what one attempt tells about its entries: per-entry results, or a reason
// that applies to all of them.
type outcome struct {
	results      []produceResult // one per entry sent, in order; nil: see reason
	reason       string          // why the request as a whole did not settle
	retriable    bool            // the entries may succeed if sent again
	maybeWritten bool            // the entries may have been committed by this attempt
	retryAfter   time.Duration   // the broker's Retry-After (503)
}

// classify reads an attempt's answer (or its transport error).
func classify(status int, header http.Header, body []byte, err error, sent []*entry) outcome {
	if err != nil {
		switch {
		case isDialError(err): // never reached a broker
			return outcome{reason: "connect_error", retriable: true}
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
			return outcome{reason: "timeout", retriable: true, maybeWritten: true}
		default: // reset, or closed before the whole answer arrived
			return outcome{reason: "transport_error", retriable: true, maybeWritten: true}
		}
	}
	out := outcome{reason: "http_" + strconv.Itoa(status)}
	if status == http.StatusServiceUnavailable {
		out.retryAfter = retryAfter(header)
	}
	if status == http.StatusOK || status == http.StatusConflict || status == http.StatusServiceUnavailable {
		if results, ok := parseResults(body, sent); ok {
			out.results = results
			return out
		}
	}
	switch {
	case status == http.StatusServiceUnavailable: // refused before anything was written
		out.retriable = true
	case status >= 500 || status == http.StatusOK || status == http.StatusConflict:
		out.retriable, out.maybeWritten = true, true
		if status < 500 {
			out.reason = "bad_response"
		}
	}
	return out
}

// parseResults are the results of a produce answer when there is one per entry sent,
// naming the entry's topic-partition.
func parseResults(body []byte, sent []*entry) ([]produceResult, bool) {
	var pr produceResponse
	if json.Unmarshal(body, &pr) != nil || len(pr.Results) != len(sent) {
		return nil, false
	}
	for i, r := range pr.Results {
		if r.Topic != sent[i].topic || r.Partition != sent[i].partition {
			return nil, false
		}
	}
	return pr.Results, true
}

// retryAfter is a Retry-After header in seconds (0 when absent or a date).
func retryAfter(header http.Header) time.Duration {
	s, err := strconv.Atoi(header.Get("Retry-After"))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// backoff is the wait before retry attempt+1: none when no pending entry was sent
// (connection refused: another owner can take it at once), otherwise an exponential
// delay from retry_backoff_ms with jitter, at least the broker's Retry-After, and at
// most retry_backoff_max_ms.
func (h *Hammer) backoff(attempt int, pending []*entry, after time.Duration) time.Duration {
	sent := false
	for _, e := range pending {
		sent = sent || e.why != "connect_error"
	}
	if !sent {
		return 0
	}
	return backoffDelay(h.cfg.RetryBackoffMs, h.cfg.RetryBackoffMaxMs, attempt, after, rand.Float64())
}

func backoffDelay(baseMs, maxMs, attempt int, after time.Duration, jitter float64) time.Duration {
	ceiling := time.Duration(maxMs) * time.Millisecond
	d := time.Duration(baseMs) * time.Millisecond << min(attempt, 20)
	d = min(d, ceiling)
	d = d/2 + time.Duration(float64(d/2)*jitter)
	return min(max(d, after), ceiling)
}

// partState counts, per partition, the keyed entries made and those not yet settled.
type partState struct {
	issued    atomic.Int64
	unsettled atomic.Int64
}

// keysAfter bounds how many keys can have been committed to e's partition after e
// itself: the entries made since e, and those that were unsettled when e was made
// (they may commit after it). The hammer is the only writer of its partitions.
func (h *Hammer) keysAfter(e *entry) int64 {
	return h.parts[e.pi].issued.Load() - e.issuedAt + e.ahead
}

// dropBeyondWindow fails the entries whose retry the broker might no longer recognise:
// an entry that may already be written is not sent again once key_window keys can have
// been committed after it, since a retry could then store it twice.
func (h *Hammer) dropBeyondWindow(req *request) {
	if !h.cfg.IdempotencyKeys {
		return
	}
	var keep []*entry
	for _, e := range req.pending {
		if e.maybeWritten && h.keysAfter(e) >= int64(h.cfg.KeyWindow) {
			h.fail(e, "key_window")
			continue
		}
		keep = append(keep, e)
	}
	req.pending = keep
}

// noteRetry counts a retry attempt and logs it to retry-events.jsonl.
func (h *Hammer) noteRetry(req *request, attempt int, from, to *Broker) {
	h.stats.retries.Add(1)
	entries := make([]map[string]any, len(req.pending))
	for i, e := range req.pending {
		h.stats.retried(e.why, e.maybeWritten)
		entries[i] = map[string]any{"topic": e.topic, "partition": e.partition, "key": e.key,
			"reason": e.why, "maybe_written": e.maybeWritten}
	}
	h.retryLog.Write(map[string]any{"event": "retry", "attempt": attempt, "from": from.ID,
		"to": to.ID, "entries": entries})
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
