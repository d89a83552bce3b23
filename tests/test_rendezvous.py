"""Rendezvous hashing: the documented vectors, and what moves when a member comes or goes
(only the partitions that member ranks first on)."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from app.cluster.rendezvous import ALGORITHM, owner_set, score
from app.loadtest import routing

PARTITIONS = 4096
# (seed, topic, partition, member) -> score, as docs/protocol.md lists them.
VECTORS = [
    ((0, "orders", 0, "b1.w0"), 0xB106C1AF8AD72BFD),
    ((0, "orders", 0, "b2.w0"), 0x82B4241A744E77D3),
    ((0, "orders", 0, "b3.w0"), 0x122CBBBC0FD3772A),
    ((0, "orders", 7, "b1.w0"), 0xAAD48490B7B9252D),
    ((1, "orders", 0, "b1.w0"), 0xF2D7718C5AC190C3),
]
RANKINGS = {0: ["b1.w0", "b2.w0", "b3.w0"], 1: ["b1.w0", "b3.w0", "b2.w0"],
            2: ["b2.w0", "b1.w0", "b3.w0"], 3: ["b3.w0", "b1.w0", "b2.w0"]}


def test_the_documented_vectors_hold() -> None:
    for (seed, topic, partition, member), expected in VECTORS:
        assert score(seed, topic, partition, member) == expected
        text = f"{seed}|{topic}|{partition}|{member}".encode()
        assert hashlib.sha256(text).hexdigest()[:16] == f"{expected:016x}"
    for partition, ranking in RANKINGS.items():
        assert owner_set(0, "orders", partition, ["b3.w0", "b2.w0", "b1.w0"], 3) == ranking


def test_the_load_generator_ranks_with_the_same_functions() -> None:
    assert routing.ALGORITHM == ALGORITHM == "rendezvous-sha256"
    assert routing.owner_set is owner_set and routing.score is score


def _firsts(members: list[str]) -> list[str]:
    return [owner_set(0, "t", p, members, 1)[0] for p in range(PARTITIONS)]


_IDS = st.lists(st.from_regex(r"[a-z0-9]{1,8}\.w[0-9]", fullmatch=True), min_size=2,
                max_size=6, unique=True)


@settings(max_examples=10, deadline=None)
@given(members=_IDS)
def test_a_member_that_joins_takes_only_what_it_now_ranks_first_on(members: list[str]
                                                                    ) -> None:
    *before, newcomer = members
    old, new = _firsts(before), _firsts(members)
    moved = [p for p in range(PARTITIONS) if old[p] != new[p]]
    assert all(new[p] == newcomer for p in moved)  # each from its old first to the newcomer
    assert all(old[p] == new[p] for p in range(PARTITIONS) if new[p] != newcomer)
    # About PARTITIONS / len(members) of them (the hash spreads them evenly).
    expected = PARTITIONS / len(members)
    assert 0.7 * expected < len(moved) < 1.3 * expected


@settings(max_examples=10, deadline=None)
@given(members=_IDS, leaving=st.integers(0, 5))
def test_a_member_that_leaves_gives_each_partition_to_its_second_choice(
        members: list[str], leaving: int) -> None:
    gone = members[leaving % len(members)]
    rest = [m for m in members if m != gone]
    old, new = _firsts(members), _firsts(rest)
    for p in range(PARTITIONS):
        if old[p] == gone:
            assert new[p] == owner_set(0, "t", p, members, 2)[1]
        else:
            assert new[p] == old[p]
    if len(rest) > 1:  # spread over the survivors, not piled on one
        heirs = {new[p] for p in range(PARTITIONS) if old[p] == gone}
        assert heirs == set(rest)
