"""The assignment function of consumer groups (pure: no servers)."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from app.groups.assignment import Subscription, assign
from app.storage.keys import TopicPartition


def _members(*specs: tuple[str, set[str]]) -> list[Subscription]:
    return [Subscription(m, frozenset(topics)) for m, topics in specs]


def test_equal_subscriptions_are_round_robin_over_sorted_members() -> None:
    members = _members(("b", {"t"}), ("a", {"t"}), ("c", {"t"}))
    got = assign(members, {"t": 7})
    assert got == {
        "a": tuple(TopicPartition("t", p) for p in (0, 3, 6)),
        "b": tuple(TopicPartition("t", p) for p in (1, 4)),
        "c": tuple(TopicPartition("t", p) for p in (2, 5))}


def test_members_without_partitions_are_listed_with_none() -> None:
    got = assign(_members(("a", {"t"}), ("b", {"t"}), ("c", {"other"})), {"t": 1})
    assert got == {"a": (TopicPartition("t", 0),), "b": (), "c": ()}


def test_a_partition_goes_only_to_members_subscribed_to_its_topic() -> None:
    members = _members(("a", {"x"}), ("b", {"x", "y"}), ("c", {"y"}))
    got = assign(members, {"x": 4, "y": 4})
    assert {tp.topic for tp in got["a"]} == {"x"} and {tp.topic for tp in got["c"]} == {"y"}
    # b reads both topics and takes its turn in each: nobody holds two more than another.
    assert {m: len(v) for m, v in got.items()} == {"a": 2, "b": 3, "c": 3}


def test_no_members_or_no_partitions() -> None:
    assert assign([], {"t": 3}) == {}
    assert assign(_members(("a", {"t"})), {}) == {"a": ()}
    assert assign(_members(("a", {"t"})), {"t": 0}) == {"a": ()}


topics = st.sampled_from(["t0", "t1", "t2", "t3"])
subscriptions = st.dictionaries(
    st.text("abcdef0123456789", min_size=1, max_size=6),
    st.frozensets(topics, min_size=1), min_size=1, max_size=12)
counts = st.dictionaries(topics, st.integers(0, 40), max_size=4)


@given(subscriptions, counts, st.randoms(use_true_random=False))
def test_every_partition_once_to_a_subscriber_whatever_the_order(
        subs: dict[str, frozenset[str]], partitions: dict[str, int], rnd: random.Random
) -> None:
    members = [Subscription(m, t) for m, t in subs.items()]
    got = assign(members, partitions)
    shuffled = members[:]
    rnd.shuffle(shuffled)
    assert assign(shuffled, dict(reversed(list(partitions.items())))) == got
    owners = Counter(tp for tps in got.values() for tp in tps)
    subscribed = {t for s in subs.values() for t in s}
    expected = {TopicPartition(t, p) for t, n in partitions.items() if t in subscribed
                for p in range(n)}
    assert set(owners) == expected and set(owners.values()) <= {1}
    for member, tps in got.items():
        assert all(tp.topic in subs[member] for tp in tps)
        assert list(tps) == sorted(tps)


@given(st.lists(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=20,
                unique=True), st.integers(0, 200))
def test_equal_subscriptions_balance_within_one(ids: list[str], partitions: int) -> None:
    got = assign([Subscription(m, frozenset({"t"})) for m in ids], {"t": partitions})
    sizes = [len(v) for v in got.values()]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == partitions
