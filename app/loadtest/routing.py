"""Owner sets by rendezvous (highest-random-weight) hashing (app/cluster/rendezvous.py).

Each partition's brokers are ranked by ``sha256("{seed}|{topic}|{partition}|{broker_id}")``
and the top ``owner_set_size`` form its owner set. The ranking depends only on those
four values, so the manifest is reproducible for a seed, and removing a broker from the
candidate list changes only the owner sets it was part of. The hammer reads the owner
sets from ``routing-manifest.json`` (it never recomputes them) and sends a partition's
requests only to brokers of its set; a broker that becomes unavailable is replaced by
another member of the same set, never by a global rebalance.

With ``stack.proxy`` the manifest is still written (``proxy`` names the load balancer),
but the hammer sends every request to the proxy, which chooses the broker itself.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from app.cluster.rendezvous import ALGORITHM, owner_set, score
from app.loadtest.scenario import Scenario

__all__ = ["ALGORITHM", "build_manifest", "owner_set", "owners_by_partition", "score"]


def build_manifest(scenario: Scenario) -> dict[str, Any]:
    seed = scenario.routing_seed
    size = scenario.routing.owner_set_size
    ids = scenario.broker_ids()
    writers = [b for b in ids if "write" in scenario.roles_of(b)]
    readers = [b for b in ids if "read" in scenario.roles_of(b)]
    partitions: list[dict[str, Any]] = []
    owned: Counter[str] = Counter()
    primary: Counter[str] = Counter()
    for topic in scenario.topics:
        for p in range(topic.partitions):
            owners = owner_set(seed, topic.name, p, writers, size)
            reader_set = owner_set(seed, topic.name, p, readers, min(size, len(readers)))
            owned.update(owners)
            primary[owners[0]] += 1
            partitions.append({"topic": topic.name, "partition": p, "owners": owners,
                               "readers": reader_set})
    return {
        "version": 1,
        "algorithm": ALGORITHM,
        "key": "sha256('{seed}|{topic}|{partition}|{broker_id}')[:8], highest first",
        "seed": seed,
        "owner_set_size": size,
        "policy": scenario.routing.policy,
        "proxy": None if scenario.stack.proxy == "none" else scenario.stack.proxy,
        "brokers": ids,
        "writers": writers,
        "readers": readers,
        "partitions": partitions,
        "load": {b: {"owned": owned[b], "primary": primary[b]} for b in ids},
    }


def owners_by_partition(manifest: dict[str, Any]) -> dict[tuple[str, int], list[str]]:
    return {(p["topic"], int(p["partition"])): list(p["owners"])
            for p in manifest["partitions"]}
