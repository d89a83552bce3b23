package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// The test vectors of docs/protocol.md (Preferred appenders).
func TestRendezvousVectors(t *testing.T) {
	for _, v := range []struct {
		seed      int
		partition int
		id, want  string
	}{
		{0, 0, "b1.w0", "b106c1af8ad72bfd"}, {0, 0, "b2.w0", "82b4241a744e77d3"},
		{0, 0, "b3.w0", "122cbbbc0fd3772a"}, {0, 7, "b1.w0", "aad48490b7b9252d"},
		{1, 0, "b1.w0", "f2d7718c5ac190c3"},
	} {
		if got := fmt.Sprintf("%016x", rendezvousScore(v.seed, "orders", v.partition, v.id)); got != v.want {
			t.Fatalf("%+v: score %s", v, got)
		}
	}
	ids := []string{"b3.w0", "b1.w0", "b2.w0"}
	for p, want := range []string{"b1.w0", "b1.w0", "b2.w0", "b3.w0"} {
		if got := preferredMember(0, "orders", p, ids); got != want {
			t.Fatalf("partition %d: %s, want %s", p, got, want)
		}
	}
}

func TestPlanRoutesGroupsPartitionsByTheirMembersURL(t *testing.T) {
	m := clusterMap{Algorithm: rendezvousAlgorithm, Members: []clusterMember{
		{MemberID: "b1.w0", URL: "http://one", Roles: []string{"read", "write"}},
		{MemberID: "b2.w0", URL: "http://two", Roles: []string{"write"}},
		{MemberID: "b3.w0", URL: "http://three", Roles: []string{"write"}},
		{MemberID: "r1.w0", URL: "http://reader", Roles: []string{"read"}},
	}}
	plan, err := planRoutes(m, "orders", []int{0, 1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := routePlan{urls: []string{"http://one", "http://three", "http://two"},
		partitions: [][]int{{0, 1}, {3}, {2}}}
	if !reflect.DeepEqual(plan, want) {
		t.Fatalf("plan %+v, want %+v", plan, want)
	}
	// Workers of one broker share its URL: their partitions go there together.
	m.Members[1].URL, m.Members[2].URL = "http://one", "http://one"
	if plan, _ = planRoutes(m, "orders", []int{0, 1, 2, 3}); len(plan.urls) != 1 ||
		len(plan.partitions[0]) != 4 {
		t.Fatalf("one URL: %+v", plan)
	}
	for why, bad := range map[string]clusterMap{
		"algorithm": {Algorithm: "other", Members: m.Members},
		"no member": {Algorithm: rendezvousAlgorithm, Members: m.Members[3:]},
	} {
		if _, err := planRoutes(bad, "orders", []int{0}); err == nil ||
			!strings.HasPrefix(err.Error(), "cluster map:") {
			t.Fatalf("%s: %v", why, err)
		}
	}
}

func TestConnectionsFollowPartitions(t *testing.T) {
	a := &target{url: "a", partitions: []int{0, 1, 2, 3}}
	b := &target{url: "b", partitions: []int{4, 5}}
	got := map[string]int{}
	for _, to := range connectionTargets([]*target{a, b}, 6) {
		got[to.url]++
	}
	if got["a"] != 4 || got["b"] != 2 {
		t.Fatalf("connections %v, want a:4 b:2", got)
	}
}

func TestRoutedRequestsCarryAsManyRecords(t *testing.T) {
	c := config{url: "http://proxy", path: "/produce", topic: "orders", records: 5,
		entries: 4, written: []int{0, 1, 2, 3}, size: 8, format: "binary", route: "members"}
	th := &throughput{c: &c}
	plan := routePlan{urls: []string{"http://one", "http://two"}, partitions: [][]int{{0, 1, 2}, {3}}}
	th.planFrom(plan)
	for i, to := range th.targets { // 20 records over 3 partitions: 7, 7 and 6
		for b, got := range to.records {
			if got != 20 {
				t.Fatalf("target %d body %d: %d records, want 20", i, b, got)
			}
		}
	}
	if th.targets[1].url != "http://two/produce" || th.fallback != "http://proxy/produce" {
		t.Fatalf("urls %q, fallback %q", th.targets[1].url, th.fallback)
	}
}

func TestOnlyARequestThatNeverConnectedGoesToTheFallback(t *testing.T) {
	dial := &net.OpError{Op: "dial", Err: errors.New("connection refused")}
	read := &net.OpError{Op: "read", Err: errors.New("connection reset")}
	if !notConnected(&url.Error{Op: "Post", Err: dial}) || notConnected(&url.Error{Op: "Post",
		Err: read}) || notConnected(errors.New("timeout")) {
		t.Fatal("notConnected: only a dial error proves nothing was sent")
	}
}

func TestEveryTargetGetsAConnection(t *testing.T) {
	c := config{url: "http://proxy", path: "/produce", topic: "orders", records: 5,
		entries: 4, written: []int{0, 1, 2, 3}, size: 8, format: "binary", route: "members",
		connections: 1}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(clusterMap{Algorithm: rendezvousAlgorithm,
			Members: []clusterMember{
				{MemberID: "b1.w0", URL: "http://one", Roles: []string{"write"}},
				{MemberID: "b2.w0", URL: "http://two", Roles: []string{"write"}}}})
	}))
	defer srv.Close()
	c.url = srv.URL
	err := (&throughput{c: &c}).plan()
	if err == nil || !strings.Contains(err.Error(), "1 connections for 2 brokers") {
		t.Fatalf("plan: %v", err)
	}
}
