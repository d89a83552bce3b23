"""Which member of a group reads which partition: a deterministic function of the
members (their ids and subscriptions) and the partition counts of their topics.

Every broker computes the same assignment from the same group record, so only its
inputs are stored. Partitions are taken in (topic, partition) order and each goes to the
least-loaded member subscribed to its topic, ties going to the smaller member id: with
equal subscriptions that is round-robin over the sorted members (counts differ by at
most one), and with different ones no member idles while another holds two more.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from app.storage.keys import TopicPartition

Assignment = dict[str, tuple[TopicPartition, ...]]


@dataclass(frozen=True)
class Subscription:
    member_id: str
    topics: frozenset[str]


def assign(members: Iterable[Subscription], partitions: Mapping[str, int]) -> Assignment:
    """Each member's partitions (every member appears, possibly with none); every
    partition of a subscribed topic goes to exactly one member subscribed to it."""
    ordered = sorted(members, key=lambda m: m.member_id)
    load = [0] * len(ordered)
    owned: list[list[TopicPartition]] = [[] for _ in ordered]
    # One heap of (load, member index) per distinct set of subscribers. A member's
    # entry in one heap goes stale when it gains a partition through another; stale
    # entries only underestimate, so they are refreshed when they surface.
    heaps: dict[frozenset[int], list[tuple[int, int]]] = {}
    for topic in sorted(partitions):
        eligible = frozenset(i for i, m in enumerate(ordered) if topic in m.topics)
        if not eligible:
            continue
        heap = heaps.get(eligible)
        if heap is None:
            heap = heaps[eligible] = sorted((load[i], i) for i in eligible)
        for partition in range(partitions[topic]):
            least, i = heapq.heappop(heap)
            while least != load[i]:
                least, i = heapq.heappushpop(heap, (load[i], i))
            owned[i].append(TopicPartition(topic, partition))
            load[i] += 1
            heapq.heappush(heap, (load[i], i))
    return {m.member_id: tuple(parts) for m, parts in zip(ordered, owned, strict=True)}
