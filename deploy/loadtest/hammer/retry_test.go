package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestACutAnswerIsRetriedWithTheSameKeyOnAnotherBroker(t *testing.T) {
	c := newFakeCluster()
	respond := firstThen(cutAfterCommit, commitAll)
	h := testHammer(t, 1, "", c.broker(t, "b1", respond).URL, c.broker(t, "b2", respond).URL)
	h.produceOnce(0, 1, time.Now())

	if len(c.attempts) != 2 {
		t.Fatalf("%d attempts, want 2", len(c.attempts))
	}
	first, second := c.attempts[0], c.attempts[1]
	if first.broker == second.broker {
		t.Fatalf("the retry went to %s again although the other owner was up", first.broker)
	}
	if !reflect.DeepEqual(first.entries, second.entries) || first.entries[0].Key == "" {
		t.Fatalf("the retry is not the same keyed entry:\n%v\n%v", first.entries, second.entries)
	}
	s := h.stats
	if s.ackedEntries.Load() != 1 || s.ackedRecords.Load() != 3 || s.duplicateAcks.Load() != 1 {
		t.Fatalf("acked entries %d, records %d, duplicate acks %d; want 1, 3, 1",
			s.ackedEntries.Load(), s.ackedRecords.Load(), s.duplicateAcks.Load())
	}
	if s.retries.Load() != 1 || s.maybeRetries.Load() != 1 || s.retryReasons["transport_error"] != 1 {
		t.Fatalf("retries %d, maybe written %d, reasons %v", s.retries.Load(),
			s.maybeRetries.Load(), s.retryReasons)
	}
	lines := ackedLines(t, h)
	for i, line := range lines { // the first attempt's offsets, once each
		if cols := strings.Split(line, "\t"); cols[2] != []string{"1", "2", "3"}[i] || cols[4] != second.broker {
			t.Fatalf("acked.tsv line %d: %q", i, line)
		}
	}
	events := retryEvents(t, h)
	if len(events) != 1 || events[0]["from"] != first.broker || events[0]["to"] != second.broker {
		t.Fatalf("retry events %v", events)
	}
	entry := events[0]["entries"].([]any)[0].(map[string]any)
	if entry["key"] != first.entries[0].Key || entry["maybe_written"] != true {
		t.Fatalf("retry event entry %v", entry)
	}
}

func TestOnlyTheEntriesThatDidNotSucceedAreSentAgain(t *testing.T) {
	c := newFakeCluster()
	inDoubt := func(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, entries []wireEntry) {
		ok := c.commit(entries[0])
		c.commit(entries[1]) // committed, but the broker could not confirm it
		doubt := produceResult{Topic: entries[1].Topic, Partition: entries[1].Partition,
			ErrorType: "CommitInDoubt", Retriable: true, MaybeWritten: true}
		writeJSON(t, w, http.StatusConflict, produceResponse{Results: []produceResult{ok, doubt}})
	}
	respond := firstThen(inDoubt, commitAll)
	h := testHammer(t, 2, `,"entries_per_request":2`, c.broker(t, "b1", respond).URL,
		c.broker(t, "b2", respond).URL)
	h.produceOnce(0, 1, time.Now())

	if len(c.attempts) != 2 || len(c.attempts[0].entries) != 2 {
		t.Fatalf("attempts %v", c.attempts)
	}
	again := c.attempts[1].entries
	if len(again) != 1 || !reflect.DeepEqual(again[0], c.attempts[0].entries[1]) {
		t.Fatalf("sent again %v, want only the in-doubt entry %v", again, c.attempts[0].entries[1])
	}
	if k0, k1 := c.attempts[0].entries[0].Key, c.attempts[0].entries[1].Key; k0 == k1 {
		t.Fatalf("two entries share the key %q", k0)
	}
	s := h.stats
	if s.ackedEntries.Load() != 2 || s.duplicateAcks.Load() != 1 || s.retryReasons["CommitInDoubt"] != 1 {
		t.Fatalf("acked %d, duplicate acks %d, reasons %v", s.ackedEntries.Load(),
			s.duplicateAcks.Load(), s.retryReasons)
	}
	if got := len(ackedLines(t, h)); got != 6 {
		t.Fatalf("%d acked records, want 6", got)
	}
}

func TestBackPressureIsRetriedAsNotWritten(t *testing.T) {
	c := newFakeCluster()
	refuse := func(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, entries []wireEntry) {
		w.Header().Set("Retry-After", "1")
		writeJSON(t, w, http.StatusServiceUnavailable, produceResponse{Results: []produceResult{{
			Topic: entries[0].Topic, Partition: entries[0].Partition,
			ErrorType: "BackPressureRejected", Retriable: true}}})
	}
	respond := firstThen(refuse, commitAll)
	h := testHammer(t, 1, "", c.broker(t, "b1", respond).URL, c.broker(t, "b2", respond).URL)
	began := time.Now()
	h.produceOnce(0, 1, began)
	s := h.stats
	if s.ackedEntries.Load() != 1 || s.duplicateAcks.Load() != 0 || s.maybeRetries.Load() != 0 ||
		s.retryReasons["BackPressureRejected"] != 1 {
		t.Fatalf("acked %d, duplicate acks %d, maybe written %d, reasons %v", s.ackedEntries.Load(),
			s.duplicateAcks.Load(), s.maybeRetries.Load(), s.retryReasons)
	}
	// Retry-After (1 s) is honoured up to retry_backoff_max_ms (5 ms here).
	if waited := time.Since(began); waited < 5*time.Millisecond || waited > 900*time.Millisecond {
		t.Fatalf("waited %v before the retry", waited)
	}
}

func TestFailuresThatCannotSucceedAreNotSentAgain(t *testing.T) {
	fenced := func(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, entries []wireEntry) {
		writeJSON(t, w, http.StatusConflict, produceResponse{Results: []produceResult{{
			Topic: entries[0].Topic, Partition: entries[0].Partition, ErrorType: "PartitionFenced"}}})
	}
	invalid := func(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, _ []wireEntry) {
		writeJSON(t, w, http.StatusBadRequest, map[string]string{"error_type": "InvalidRequest"})
	}
	for kind, respond := range map[string]answer{"PartitionFenced": fenced, "http_400": invalid} {
		c := newFakeCluster()
		h := testHammer(t, 1, "", c.broker(t, "b1", respond).URL, c.broker(t, "b2", respond).URL)
		h.produceOnce(0, 1, time.Now())
		if len(c.attempts) != 1 || h.stats.errors[kind] != 1 || h.stats.retries.Load() != 0 {
			t.Fatalf("%s: %d attempts, errors %v", kind, len(c.attempts), h.stats.errors)
		}
	}
}

func TestRetriesAreBounded(t *testing.T) {
	c := newFakeCluster()
	failing := func(t *testing.T, c *fakeCluster, w http.ResponseWriter, _ int, _ []wireEntry) {
		w.WriteHeader(http.StatusBadGateway)
	}
	h := testHammer(t, 1, `,"max_retries":2`, c.broker(t, "b1", failing).URL,
		c.broker(t, "b2", failing).URL)
	h.produceOnce(0, 1, time.Now())
	if len(c.attempts) != 3 || h.stats.errors["http_502"] != 1 || h.stats.failedRecords.Load() != 3 {
		t.Fatalf("%d attempts, errors %v", len(c.attempts), h.stats.errors)
	}
	if h.parts[0].unsettled.Load() != 0 {
		t.Fatalf("%d entries left unsettled", h.parts[0].unsettled.Load())
	}
}

func TestWithoutKeysARetryStoresTheRecordsTwice(t *testing.T) {
	c := newFakeCluster()
	respond := firstThen(cutAfterCommit, commitAll)
	h := testHammer(t, 1, `,"idempotency_keys":false`, c.broker(t, "b1", respond).URL,
		c.broker(t, "b2", respond).URL)
	h.produceOnce(0, 1, time.Now())
	if len(c.attempts) != 2 || c.attempts[1].entries[0].Key != "" {
		t.Fatalf("attempts %v", c.attempts)
	}
	if c.next["t/0"] != 6 || h.stats.duplicateAcks.Load() != 0 {
		t.Fatalf("log end %d, duplicate acks %d: want the 3 records written twice",
			c.next["t/0"], h.stats.duplicateAcks.Load())
	}
}

func TestAnEntryMayBeWrittenIsNotRetriedBeyondTheKeyWindow(t *testing.T) {
	h := testHammer(t, 2, `,"key_window":4`, "http://127.0.0.1:1", "http://127.0.0.1:2")
	now := time.Now()
	early := h.newEntry(0, 0, 1, now)
	other := h.newEntry(1, 0, 1, now) // another partition: does not count
	for seq := int64(2); seq <= 4; seq++ {
		h.fail(h.newEntry(0, 1, seq, now), "x") // three keys made after early
	}
	early.maybeWritten, other.maybeWritten = true, true
	req := &request{pending: []*entry{early, other}}
	h.dropBeyondWindow(req)
	if len(req.pending) != 2 {
		t.Fatalf("dropped with 3 keys after it in a window of 4: %v", req.pending)
	}
	h.fail(h.newEntry(0, 1, 5, now), "x") // the fourth
	h.dropBeyondWindow(req)
	if len(req.pending) != 1 || req.pending[0] != other || h.stats.errors["key_window"] != 1 {
		t.Fatalf("pending %v, errors %v", req.pending, h.stats.errors)
	}
	// An entry that was never possibly written can always be sent again.
	late := h.newEntry(0, 2, 1, now)
	for seq := int64(2); seq <= 9; seq++ {
		h.fail(h.newEntry(0, 1, seq+10, now), "x")
	}
	req = &request{pending: []*entry{late}}
	h.dropBeyondWindow(req)
	if len(req.pending) != 1 {
		t.Fatal("dropped an entry no attempt could have written")
	}
}

func TestUnsettledEntriesCountTowardsTheWindow(t *testing.T) {
	h := testHammer(t, 1, `,"key_window":3`, "http://127.0.0.1:1", "http://127.0.0.1:2")
	now := time.Now()
	h.newEntry(0, 0, 1, now) // in flight before e: may commit after it
	h.newEntry(0, 1, 1, now)
	e := h.newEntry(0, 2, 1, now)
	if got := h.keysAfter(e); got != 2 {
		t.Fatalf("keysAfter %d, want the 2 entries unsettled when it was made", got)
	}
	h.newEntry(0, 3, 1, now)
	if got := h.keysAfter(e); got != 3 {
		t.Fatalf("keysAfter %d, want 3", got)
	}
}

func TestKeysAndValuesAreUniquePerEntry(t *testing.T) {
	h := testHammer(t, 3, "", "http://127.0.0.1:1", "http://127.0.0.1:2")
	keyRe := regexp.MustCompile(`^[0-9a-f]+\.[0-9]+-[0-9]+-[0-9]+$`)
	keys, values := map[string]bool{}, map[string]bool{}
	now := time.Now()
	for w := 0; w < 3; w++ {
		for seq := int64(1); seq <= 3; seq++ {
			for pi := 0; pi < 3; pi++ {
				e := h.newEntry(pi, w, seq, now)
				if !keyRe.MatchString(e.key) || len(e.key) > 128 || keys[e.key] {
					t.Fatalf("key %q: malformed, too long or repeated", e.key)
				}
				keys[e.key] = true
				for _, r := range e.records {
					if values[string(r)] || len(r) != 40 {
						t.Fatalf("value %q repeated or not record_bytes long", r)
					}
					values[string(r)] = true
				}
			}
		}
	}
	if !strings.HasPrefix(h.idempotencyKey(4, 7, 2), h.nonce+".4-7-2") {
		t.Fatalf("key %q", h.idempotencyKey(4, 7, 2))
	}
}

func TestARequestCarriesDistinctPartitionsOfOneOwnerSet(t *testing.T) {
	routes := []*Route{newRoute("t", 0, []*Broker{{ID: "b1"}, {ID: "b2"}}),
		newRoute("t", 1, []*Broker{{ID: "b2"}, {ID: "b1"}}),
		newRoute("t", 2, []*Broker{{ID: "b2"}, {ID: "b3"}})}
	groups, groupOf := ownerSetGroups(routes)
	if !reflect.DeepEqual(groups, [][]int{{0, 1}, {2}}) || !reflect.DeepEqual(groupOf, []int{0, 0, 1}) {
		t.Fatalf("groups %v, groupOf %v", groups, groupOf)
	}
	h := testHammer(t, 3, `,"entries_per_request":5`, "http://127.0.0.1:1", "http://127.0.0.1:2")
	req := h.newRequest(0, 1, time.Now())
	if len(req.pending) != 3 || len(req.routes) != 3 {
		t.Fatalf("%d entries, want one per partition of the group", len(req.pending))
	}
	for i, e := range req.pending {
		if e.partition != (i+req.pending[0].partition)%3 {
			t.Fatalf("partitions %v", req.pending)
		}
	}
}

func TestPickPrefersAnotherOwnerForARetry(t *testing.T) {
	b1, b2, b3 := &Broker{ID: "b1"}, &Broker{ID: "b2"}, &Broker{ID: "b3"}
	r := &Router{policy: "round_robin", backoff: time.Second, events: &EventLog{}}
	rt := newRoute("t", 0, []*Broker{b1, b2})
	for i := 0; i < 4; i++ {
		if got := r.Pick([]*Route{rt}, "produce", b1); got != b2 {
			t.Fatalf("picked %s, want b2", got.ID)
		}
	}
	r.MarkDown(b2, "refused")
	if got := r.Pick([]*Route{rt}, "produce", b1); got != b1 {
		t.Fatalf("picked %s: the avoided owner is the only one available", got.ID)
	}
	// Every route of the request logs its own remap, its owner set in its own order.
	other := newRoute("t", 1, []*Broker{b2, b1})
	r.MarkDown(b3, "refused")
	r.Pick([]*Route{newRoute("t", 2, []*Broker{b1, b2}), other}, "produce", nil)
	if r.remaps.Load() != 3 { // route 0 above, then routes 2 and 1
		t.Fatalf("%d remaps", r.remaps.Load())
	}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	sent := []*entry{{topic: "t", partition: 0}}
	ok := []byte(`{"results":[{"topic":"t","partition":0,"ok":true,"start_offset":1,"end_offset":1,"count":1}]}`)
	wrongTP := []byte(`{"results":[{"topic":"t","partition":9,"ok":true}]}`)
	cases := []struct {
		name                            string
		status                          int
		body                            []byte
		err                             error
		reason                          string
		results, retriable, maybeWriten bool
	}{
		{"refused", 0, nil, &net.OpError{Op: "dial", Err: errors.New("refused")}, "connect_error", false, true, false},
		{"timeout", 0, nil, timeoutError{}, "timeout", false, true, true},
		{"deadline", 0, nil, context.DeadlineExceeded, "timeout", false, true, true},
		{"reset", 0, nil, &net.OpError{Op: "read", Err: errors.New("reset")}, "transport_error", false, true, true},
		{"ok", 200, ok, nil, "http_200", true, false, false},
		{"garbled 200", 200, []byte("{"), nil, "bad_response", false, true, true},
		{"other partition", 200, wrongTP, nil, "bad_response", false, true, true},
		{"502", 502, nil, nil, "http_502", false, true, true},
		{"503 without results", 503, nil, nil, "http_503", false, true, false},
		{"413", 413, nil, nil, "http_413", false, false, false},
	}
	for _, tc := range cases {
		out := classify(tc.status, http.Header{}, tc.body, tc.err, sent)
		if out.reason != tc.reason || (out.results != nil) != tc.results ||
			out.retriable != tc.retriable || out.maybeWritten != tc.maybeWriten {
			t.Errorf("%s: %+v", tc.name, out)
		}
	}
	h := http.Header{}
	h.Set("Retry-After", "2")
	if out := classify(503, h, nil, nil, sent); out.retryAfter != 2*time.Second {
		t.Errorf("Retry-After read as %v", out.retryAfter)
	}
}

func TestBackoffDelay(t *testing.T) {
	ms := time.Millisecond
	for attempt, want := range []time.Duration{10 * ms, 20 * ms, 40 * ms, 50 * ms, 50 * ms} {
		low := backoffDelay(10, 50, attempt, 0, 0)
		high := backoffDelay(10, 50, attempt, 0, 1)
		if low != want/2 || high != want {
			t.Errorf("attempt %d: %v..%v, want %v..%v", attempt, low, high, want/2, want)
		}
	}
	if d := backoffDelay(10, 2000, 0, time.Second, 0); d != time.Second {
		t.Errorf("Retry-After not honoured: %v", d)
	}
	if d := backoffDelay(10, 500, 0, time.Second, 0); d != 500*ms {
		t.Errorf("Retry-After not capped at the maximum: %v", d)
	}
}
