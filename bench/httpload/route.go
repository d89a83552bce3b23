package main

// -route members: a client that sends each partition's records to the broker preferred
// for it, as a smart client would. The map comes from GET {url}/cluster (the members and
// the ranking algorithm, docs/http-api.md); each partition's preferred member is the
// first of its rendezvous ranking over the members that write (docs/protocol.md,
// Preferred appenders); a member's URL is where its records go. A request its member
// takes no connection for is sent through -url instead (any broker, which forwards it);
// one that may have arrived is not sent again (these bodies carry no idempotency keys).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"
)

const (
	rendezvousAlgorithm = "rendezvous-sha256"
	rendezvousSeed      = 0
	writeRole           = "write"
)

type clusterMember struct {
	MemberID string   `json:"member_id"`
	BrokerID string   `json:"broker_id"`
	URL      string   `json:"url"`
	Roles    []string `json:"roles"`
}

type clusterMap struct {
	Digest    string          `json:"digest"`
	Algorithm string          `json:"algorithm"`
	Members   []clusterMember `json:"members"`
}

// rendezvousScore is the first 8 bytes, big-endian, of sha256("seed|topic|partition|id").
func rendezvousScore(seed int, topic string, partition int, id string) uint64 {
	sum := sha256.Sum256([]byte(strconv.Itoa(seed) + "|" + topic + "|" +
		strconv.Itoa(partition) + "|" + id))
	return binary.BigEndian.Uint64(sum[:8])
}

// preferredMember is the highest-scoring id (ties to the smaller id); "" if none.
func preferredMember(seed int, topic string, partition int, ids []string) string {
	best, bestScore := "", uint64(0)
	for _, id := range ids {
		s := rendezvousScore(seed, topic, partition, id)
		if best == "" || s > bestScore || (s == bestScore && id < best) {
			best, bestScore = id, s
		}
	}
	return best
}

// routePlan groups the written partitions by the URL of their preferred member, in the
// order of the URLs; it fails if the map has no member that writes.
type routePlan struct {
	urls       []string
	partitions [][]int
}

func planRoutes(m clusterMap, topic string, written []int) (routePlan, error) {
	if m.Algorithm != rendezvousAlgorithm {
		return routePlan{}, fmt.Errorf("cluster map: algorithm %q, expected %q",
			m.Algorithm, rendezvousAlgorithm)
	}
	urlOf := map[string]string{}
	var ids []string
	for _, mem := range m.Members {
		for _, role := range mem.Roles {
			if role == writeRole {
				urlOf[mem.MemberID] = mem.URL
				ids = append(ids, mem.MemberID)
				break
			}
		}
	}
	if len(ids) == 0 {
		return routePlan{}, fmt.Errorf("cluster map: no member that writes (is " +
			"LLOG_AFFINITY on?)")
	}
	byURL := map[string][]int{}
	for _, p := range written {
		u := urlOf[preferredMember(rendezvousSeed, topic, p, ids)]
		byURL[u] = append(byURL[u], p)
	}
	var plan routePlan
	for u := range byURL {
		plan.urls = append(plan.urls, u)
	}
	sort.Strings(plan.urls)
	for _, u := range plan.urls {
		plan.partitions = append(plan.partitions, byURL[u])
	}
	return plan, nil
}

func fetchClusterMap(base string, timeout time.Duration) (clusterMap, error) {
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get(base + "/cluster")
	if err != nil {
		return clusterMap{}, fmt.Errorf("cluster map: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return clusterMap{}, fmt.Errorf("cluster map: GET %s/cluster answered %d", base,
			resp.StatusCode)
	}
	var m clusterMap
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		return clusterMap{}, fmt.Errorf("cluster map: %w", err)
	}
	return m, nil
}
