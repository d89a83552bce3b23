package main

import (
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

// Pick chooses a broker of the route's owner set; it never leaves the owner set. Owners
// that are unavailable are skipped, and the first skip of an owner in each of its down
// periods is logged as a remap event for this partition.
func (r *Router) Pick(rt *Route, purpose string) *Broker {
	now := time.Now().UnixNano()
	k := len(rt.Owners)
	start := int(rt.rr.Add(1) % uint64(k))
	var chosen *Broker
	var skipped []int
	if r.policy == "least_inflight" {
		best := int64(-1)
		for i := 0; i < k; i++ {
			j := (start + i) % k
			b := rt.Owners[j]
			if !b.available(now) {
				skipped = append(skipped, j)
				continue
			}
			if n := b.inflight.Load(); best < 0 || n < best {
				best, chosen = n, b
			}
		}
	} else {
		for i := 0; i < k; i++ {
			j := (start + i) % k
			b := rt.Owners[j]
			if b.available(now) {
				chosen = b
				break
			}
			skipped = append(skipped, j)
		}
	}
	if chosen == nil {
		// Every owner is down: probe the one whose back-off ends first (still inside the set).
		chosen = rt.Owners[start]
		for _, b := range rt.Owners {
			if b.downUntil.Load() < chosen.downUntil.Load() {
				chosen = b
			}
		}
		return chosen
	}
	if len(skipped) > 0 {
		rt.mu.Lock()
		for _, j := range skipped {
			from := rt.Owners[j]
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
		rt.mu.Unlock()
	}
	return chosen
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
