"""How one read shares its total byte budget across partitions (app/storage/read_plan.py,
app/storage/read_assembly.py): units other than shared WAL slices in request order, then
WAL slices object by object across partitions, each partition a prefix of its plan, the
first unit always kept; and the planning room that feeds that order. Over synthetic
spans; the reader over the real servers is tests/test_wal_objects.py."""

from __future__ import annotations

import anyio
from hypothesis import given
from hypothesis import strategies as st

from app.errors import LlogError, LogGap
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.read_assembly import ReadResult, assemble_all
from app.storage.read_plan import (
    PlannedRoom,
    ReadPlan,
    ReadRequest,
    SpanFetch,
    merged,
    trim_to_total,
    unit_bytes,
)
from app.storage.records import IndexEntry
from app.storage.spans import Span

LAYOUT = KeyLayout("llog", "bucket")
RECORD = 100  # bytes of every synthetic record
PER_UNIT = 4  # records of every synthetic unit


def _wal(obj: int, at_ms: int | None = None) -> IndexEntry:
    """A slice of shared WAL object ``obj`` (written at ``at_ms``, default ``obj``)."""
    return IndexEntry("WAL", PER_UNIT, LAYOUT.uri(f"wal/{obj:04d}"), byte_offset=0,
                      byte_length=PER_UNIT * RECORD,
                      created_at_ms=obj if at_ms is None else at_ms)


def _compacted(blob: int) -> IndexEntry:
    return IndexEntry("COMPACTED", PER_UNIT, LAYOUT.uri(f"compacted/{blob}"),
                      object_bytes=PER_UNIT * RECORD)


def _plan(p: int, entries: list[IndexEntry], *, max_bytes: int | None = None) -> ReadPlan:
    """Partition ``p`` read from offset 1 through ``entries``, each unit's records
    fetched (``p:offset`` padded to ``RECORD`` bytes)."""
    units = []
    for n, entry in enumerate(entries):
        first = n * PER_UNIT + 1
        unit = SpanFetch(Span(first + PER_UNIT - 1, entry), first)
        unit.records = [f"{p}:{first + k}".encode().ljust(RECORD, b".")
                        for k in range(PER_UNIT)]
        units.append(unit)
    end = len(entries) * PER_UNIT
    return ReadPlan(ReadRequest(TopicPartition("t", p), 1, None, max_bytes), 1, end,
                    units=units)


def _order(plans: list[ReadPlan | LlogError]) -> list[tuple[int, str]]:
    return [(p, u.span.entry.data_key.rsplit("/", 1)[1]) for p, u in merged(plans)]


def test_wal_slices_of_several_partitions_are_taken_object_by_object() -> None:
    plans: list[ReadPlan | LlogError] = [_plan(p, [_wal(o) for o in range(4)])
                                         for p in range(3)]
    assert _order(plans) == [(p, f"{o:04d}") for o in range(4) for p in range(3)]
    # Budget for five slices: the first two objects for every partition, at most.
    trim_to_total(plans, 5 * PER_UNIT * RECORD)
    assert [len(p.units) for p in plans if isinstance(p, ReadPlan)] == [2, 2, 1]


def test_other_units_keep_request_order_ahead_of_wal_slices() -> None:
    plans: list[ReadPlan | LlogError] = [
        _plan(0, [_wal(0), _wal(1)]),
        _plan(1, [_compacted(1), _compacted(2), _wal(0)]),
        LogGap("a failed plan takes no part"),
        _plan(3, [_compacted(3)]),
    ]
    assert _order(plans) == [(1, "1"), (1, "2"), (3, "3"), (0, "0000"), (1, "0000"),
                             (0, "0001")]
    trim_to_total(plans, 3 * PER_UNIT * RECORD)
    kept = [len(p.units) for p in plans if isinstance(p, ReadPlan)]
    assert kept == [0, 2, 1]


def test_a_partition_never_skips_a_unit_when_object_times_go_back() -> None:
    # Partition 0's second object is older than its first (written by another broker):
    # it comes after the first all the same, and the partition keeps a prefix.
    plans: list[ReadPlan | LlogError] = [
        _plan(0, [_wal(5), _wal(9, at_ms=1), _wal(6)]),
        _plan(1, [_wal(2), _wal(7), _wal(8)]),
    ]
    assert _order(plans) == [(1, "0002"), (0, "0005"), (0, "0009"), (0, "0006"),
                             (1, "0007"), (1, "0008")]
    trim_to_total(plans, 3 * PER_UNIT * RECORD)
    assert [[u.span.entry.data_key[-4:] for u in p.units]
            for p in plans if isinstance(p, ReadPlan)] == [["0005", "0009"], ["0002"]]


def test_the_first_unit_is_kept_however_large() -> None:
    big = IndexEntry("WAL", PER_UNIT, LAYOUT.uri("wal/0000"), byte_offset=0,
                     byte_length=1 << 30, created_at_ms=5)
    plans: list[ReadPlan | LlogError] = [_plan(0, [_wal(6)]), _plan(1, [big, _wal(7)])]
    trim_to_total(plans, 10)
    assert [len(p.units) for p in plans if isinstance(p, ReadPlan)] == [0, 1]


def test_the_answer_takes_records_in_the_merged_order() -> None:
    plans: list[ReadPlan | LlogError] = [_plan(p, [_wal(o) for o in range(4)])
                                         for p in range(4)]
    budget = 6 * PER_UNIT * RECORD + 2 * RECORD  # six slices and half of a seventh
    trim_to_total(plans, budget)
    results = assemble_all(plans, budget, oversized_first=True)
    counts = [len(r.records) for r in results if isinstance(r, ReadResult)]
    # Objects 0 and 1 of partitions 0 and 1, object 0 of 2 and 3, half of 2's next.
    assert counts == [2 * PER_UNIT, 2 * PER_UNIT, PER_UNIT + 2, PER_UNIT]
    assert sum(r.size for r in results if isinstance(r, ReadResult)) == budget
    for p, r in enumerate(results):
        assert isinstance(r, ReadResult)
        assert [at for at, _ in r.records] == list(range(1, counts[p] + 1))
        assert r.next_offset == counts[p] + 1


def test_a_partition_limit_leaves_the_rest_to_the_others() -> None:
    plans: list[ReadPlan | LlogError] = [
        _plan(0, [_wal(o) for o in range(3)], max_bytes=PER_UNIT * RECORD + RECORD),
        _plan(1, [_wal(o) for o in range(3)]),
    ]
    budget = 4 * PER_UNIT * RECORD
    trim_to_total(plans, budget)
    results = assemble_all(plans, budget, oversized_first=True)
    assert [len(r.records) for r in results if isinstance(r, ReadResult)] == [
        PER_UNIT + 1, 2 * PER_UNIT]


def test_the_first_record_of_the_merged_answer_may_exceed_the_budget() -> None:
    plans: list[ReadPlan | LlogError] = [_plan(0, [_wal(1)]), _plan(1, [_wal(0)])]
    trim_to_total(plans, RECORD // 2)
    results = assemble_all(plans, RECORD // 2, oversized_first=True)
    assert [len(r.records) for r in results if isinstance(r, ReadResult)] == [0, 1]
    results = assemble_all(plans, RECORD // 2, oversized_first=False)
    assert [len(r.records) for r in results if isinstance(r, ReadResult)] == [0, 0]


def test_a_failed_unit_fails_its_partition_alone() -> None:
    plans: list[ReadPlan | LlogError] = [_plan(p, [_wal(o) for o in range(2)])
                                         for p in range(2)]
    first = plans[0]
    assert isinstance(first, ReadPlan)
    first.units[0].error = LogGap("no such object")
    results = assemble_all(plans, None, oversized_first=True)
    assert isinstance(results[0], LogGap)
    assert isinstance(results[1], ReadResult) and len(results[1].records) == 2 * PER_UNIT


_UNIT = st.one_of(st.tuples(st.just("wal"), st.integers(0, 20), st.integers(1, 900)),
                  st.tuples(st.just("blob"), st.integers(0, 20), st.integers(1, 900)))


@given(st.lists(st.lists(_UNIT, max_size=8), min_size=1, max_size=5),
       st.integers(1, 5000))
def test_the_trim_keeps_a_prefix_of_every_plan_within_the_budget(
        shapes: list[list[tuple[str, int, int]]], budget: int) -> None:
    plans: list[ReadPlan | LlogError] = []
    for p, shape in enumerate(shapes):
        entries = [_wal(o, at_ms=o) if kind == "wal" else _compacted(o)
                   for kind, o, _ in shape]
        for entry, (_, _, size) in zip(entries, shape, strict=True):
            if entry.byte_length is not None:
                entry.byte_length = size
            else:
                entry.object_bytes = size
        plans.append(_plan(p, entries))
    before = [list(p.units) for p in plans if isinstance(p, ReadPlan)]
    order = [u for _, u in merged(plans)]
    trim_to_total(plans, budget)
    after = [p.units for p in plans if isinstance(p, ReadPlan)]
    kept = [u for units in after for u in units]
    for units, was in zip(after, before, strict=True):
        assert units == was[:len(units)]  # a prefix: no partition skips a unit
    # What is kept is a leading run of the merged order, within the budget but for its
    # last unit, and never nothing when there was something.
    assert {id(u) for u in kept} == {id(u) for u in order[:len(kept)]}
    assert sum(unit_bytes(u) for u in order[:len(kept) - 1]) < budget or len(kept) <= 1
    assert kept or not order
    if len(kept) < len(order):
        assert sum(unit_bytes(u) for u in order[:len(kept)]) >= budget


def _spans(p: int, objects: range) -> list[Span]:
    return [s.span for s in _plan(p, [_wal(o) for o in objects]).units]


async def test_the_plan_furthest_behind_plans_on_and_one_past_the_budget_stops() -> None:
    slice_bytes = PER_UNIT * RECORD
    room = PlannedRoom(3, max_bytes=10 * slice_bytes)
    for i in range(3):
        room.started(i)
    answers: dict[int, bool] = {}

    async def ask(i: int, objects: range) -> None:
        answers[i] = await room.left(i, 1, _spans(i, objects))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask, 1, range(0, 2))  # waits: plans 0 and 2 may plan before it
        await anyio.wait_all_tasks_blocked()
        assert answers == {}
        tg.start_soon(ask, 2, range(0, 4))  # waits for plans 0 and 1
        await anyio.wait_all_tasks_blocked()
        assert answers == {}
        # Plan 0 is furthest behind: it never waits, and one slice precedes its next.
        assert await room.left(0, 1, _spans(0, range(0, 1))) is True
        assert answers == {}
        room.planned(0, _plan(0, [_wal(o) for o in range(4)]))
        await anyio.wait_all_tasks_blocked()
        # Plan 1: its two and plan 0's two below its last: room. Plan 2 waits for it.
        assert answers == {1: True}
        room.planned(1, _plan(1, [_wal(o) for o in range(3)]))
    # Plan 2: its four, plan 0's four and plan 1's three before its last: no room.
    assert answers == {1: True, 2: False}
