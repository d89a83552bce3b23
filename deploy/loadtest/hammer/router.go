package main

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Broker is one broker as the hammer sees it: in-flight requests (for least_inflight)
// and availability. A broker that refuses connections is marked down for a back-off;
// afterwards requests probe it again (half-open) and the first success restores it.
type Broker struct {
	ID        string
	URL       string
	inflight  atomic.Int64
	down      atomic.Bool
	downUntil atomic.Int64 // unix nanos
	epoch     atomic.Int64 // incremented each time the broker goes down

	requests atomic.Int64
	acked    atomic.Int64
	errors   atomic.Int64
}

func (b *Broker) available(now int64) bool {
	return !b.down.Load() || now >= b.downUntil.Load()
}

// Route is the owner set of one partition (for produce, or readers for consume).
type Route struct {
	Topic     string
	Partition int
	Owners    []*Broker
	ownerIDs  []string
	rr        atomic.Uint64
	mu        sync.Mutex
	loggedEpo []int64 // per owner: the down-epoch whose remap was logged
}

func newRoute(topic string, partition int, owners []*Broker) *Route {
	ids := make([]string, len(owners))
	for i, b := range owners {
		ids[i] = b.ID
	}
	return &Route{Topic: topic, Partition: partition, Owners: owners, ownerIDs: ids,
		loggedEpo: make([]int64, len(owners))}
}

type Router struct {
	policy  string
	backoff time.Duration
	events  *EventLog
	remaps  atomic.Int64
	downs   atomic.Int64
}

// Pick chooses a broker of the owner set of rts[0] (the routes of one request share
// their owner set); it never leaves the owner set. Owners that are unavailable are
// skipped, and the first skip of an owner in each of its down periods is logged as a
// remap event for every partition of the request. A retry passes the broker of the
// attempt that failed as avoid: another available owner is preferred to it, since the
// failure may be that broker's.
func (r *Router) Pick(rts []*Route, purpose string, avoid *Broker) *Broker {
	rt := rts[0]
	now := time.Now().UnixNano()
	k := len(rt.Owners)
	start := int(rt.rr.Add(1) % uint64(k))
	var candidates []*Broker
	var skipped []*Broker
	for i := 0; i < k; i++ {
		if b := rt.Owners[(start+i)%k]; b.available(now) {
			candidates = append(candidates, b)
		} else {
			skipped = append(skipped, b)
		}
	}
	if len(candidates) == 0 {
		// Every owner is down: probe the one whose back-off ends first (still inside the set).
		chosen := rt.Owners[start]
		for _, b := range rt.Owners {
			if b.downUntil.Load() < chosen.downUntil.Load() {
				chosen = b
			}
		}
		return chosen
	}
	chosen := r.choose(withoutBroker(candidates, avoid))
	for _, each := range rts {
		r.logRemaps(each, skipped, chosen, purpose)
	}
	return chosen
}

// withoutBroker is candidates less avoid, unless that would leave none.
func withoutBroker(candidates []*Broker, avoid *Broker) []*Broker {
	if avoid == nil || len(candidates) < 2 {
		return candidates
	}
	out := make([]*Broker, 0, len(candidates))
	for _, b := range candidates {
		if b != avoid {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return candidates
	}
	return out
}

func (r *Router) choose(candidates []*Broker) *Broker {
	if r.policy != "least_inflight" {
		return candidates[0]
	}
	chosen := candidates[0]
	for _, b := range candidates[1:] {
		if b.inflight.Load() < chosen.inflight.Load() {
			chosen = b
		}
	}
	return chosen
}

// logRemaps logs each skipped owner once per down period of it, for this route.
func (r *Router) logRemaps(rt *Route, skipped []*Broker, chosen *Broker, purpose string) {
	if len(skipped) == 0 {
		return
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for j, from := range rt.Owners {
		if !slices.Contains(skipped, from) {
			continue
		}
		ep := from.epoch.Load()
		if rt.loggedEpo[j] != ep {
			rt.loggedEpo[j] = ep
			r.remaps.Add(1)
			r.events.Write(map[string]any{
				"event": "remap", "purpose": purpose, "topic": rt.Topic,
				"partition": rt.Partition, "from": from.ID, "to": chosen.ID,
				"owner_set": rt.ownerIDs, "reason": "broker_unavailable",
			})
		}
	}
}

func (r *Router) MarkDown(b *Broker, reason string) {
	b.downUntil.Store(time.Now().Add(r.backoff).UnixNano())
	if b.down.CompareAndSwap(false, true) {
		b.epoch.Add(1)
		r.downs.Add(1)
		r.events.Write(map[string]any{"event": "broker_down", "broker": b.ID, "reason": reason})
	}
}

func (r *Router) MarkUp(b *Broker) {
	if b.down.Load() && b.down.CompareAndSwap(true, false) {
		r.events.Write(map[string]any{"event": "broker_up", "broker": b.ID})
	}
}
