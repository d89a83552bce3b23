"""A read's plan: per partition, the offset it starts from and the units of bytes to
fetch (a WAL slice, a run of chunks of a compacted blob, a whole object), and how the
units of one call share its total byte budget: in request order, except slices of
shared WAL objects, taken object by object across partitions (:func:`merged`;
docs/protocol.md, the read protocol)."""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import anyio

from app.errors import LlogError
from app.storage.chunks import chunk_index
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.plan_ahead import Lookup
from app.storage.spans import Span

UNLIMITED = 1 << 62


@dataclass(frozen=True)
class ReadRequest:
    tp: TopicPartition
    offset: int
    max_records: int | None = None
    max_bytes: int | None = None


@dataclass(eq=False)
class SpanFetch:
    """Bytes to fetch for one span: its records from ``first_offset`` on."""

    span: Span
    first_offset: int
    chunk_range: tuple[int, int] | None = None  # first and last chunk, for chunked blobs
    records: Sequence[Payload] | None = None  # a RecordBatch for a bytes-batch-v3 slice
    error: LlogError | None = None
    # Each chunk's records, as cached or fetched (chunked blobs; whole once all are in).
    chunks: list[Sequence[Payload] | None] | None = None


@dataclass
class ReadPlan:
    request: ReadRequest
    offset: int
    high_watermark: int
    log_start: int = 1
    units: list[SpanFetch] = field(default_factory=list)
    looked_up_ahead: bool = False
    # The control record and first index page the plan began from, and when they were
    # read: kept for the next read when the answer had no room for this partition.
    lookup: Lookup | None = None
    looked_up_at: float = 0.0


def min_budget(a: int | None, b: int | None) -> int | None:
    """The smaller of two budgets, None meaning no bound."""
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def units_for(spans: list[Span], offset: int, budget: int | None) -> list[SpanFetch]:
    """What to fetch for ``spans`` read from ``offset``: for a chunked compacted blob,
    only the chunks from the one holding the offset until the budget is met."""
    units: list[SpanFetch] = []
    nxt, planned = offset, 0
    for span in spans:
        chunks = span.chunks
        if chunks is None:
            units.append(SpanFetch(span, span.start))
            planned += span.cost_from(nxt)
        else:
            first = last = chunk_index(chunks, max(nxt, span.start) - span.start)
            planned += span.chunks_cost(first, first)
            while last + 1 < len(chunks) and (budget is None or planned < budget):
                last += 1
                planned += span.chunks_cost(last, last)
            units.append(SpanFetch(span, span.start + chunks[first].first_record, (first, last)))
            if last + 1 < len(chunks):
                break  # the budget ends inside this blob
        nxt = span.end + 1
    return units


# Where a unit stands in the order a call's budget is shared (:func:`merged`): units
# other than shared WAL slices first, in request order; then WAL slices by their object
# (its time, then its key), partitions in request order within one object.
MergeKey = tuple[int, int, str, int]


def merge_key(i: int, span: Span) -> MergeKey:
    """The order key of plan ``i``'s unit of ``span``.

    A slice of a shared WAL object (a WAL entry with a byte range) is ordered by its
    object: one answer then takes an object's slices for every partition that wants
    them, and the object is fetched once for all of them (app/storage/wal_objects.py),
    rather than partition after partition, each fetching the objects again once the
    cache has dropped them. Compacted blobs, chunk runs and whole objects belong to one
    partition each: they keep request order, ahead of WAL slices (a partition's
    compacted data precedes its WAL data anyway)."""
    entry = span.entry
    if span.is_wal and entry.is_slice:
        return (1, entry.created_at_ms, entry.data_key, i)
    return (0, 0, "", i)


def merged(plans: Sequence[ReadPlan | LlogError]) -> Iterator[tuple[int, SpanFetch]]:
    """The units of ``plans`` (with their plan's index) in the order a call's budget is
    shared: a k-way merge on each plan's *next* unit by :func:`merge_key`, so each
    plan's units come in its own order and any leading run of the merge holds a prefix
    of every plan. (Not a global sort: WAL objects of several brokers need not be in
    time order within one partition, and a partition never skips a unit.)"""
    heads: list[tuple[MergeKey, int]] = []
    at = [0] * len(plans)
    for i, plan in enumerate(plans):
        if isinstance(plan, ReadPlan) and plan.units:
            heads.append((merge_key(i, plan.units[0].span), i))
    heapq.heapify(heads)
    while heads:
        i = heads[0][1]
        plan = plans[i]
        assert isinstance(plan, ReadPlan)
        yield i, plan.units[at[i]]
        at[i] += 1
        if at[i] < len(plan.units):
            heapq.heapreplace(heads, (merge_key(i, plan.units[at[i]].span), i))
        else:
            heapq.heappop(heads)


class PlannedRoom:
    """Whether a plan of a call has room for another index page in the call's total
    budget: whether the units planned so far that :func:`merged` puts before its next
    one (its own, and the others' below its last) are below the budget. What a plan
    would plan beyond would be trimmed: without this, one behind partitions that fill
    the budget would plan its own budget for nothing, page after page.

    The plans are planned at once, so a plan asking waits until every plan still
    planning that may yet plan units before its own has planned past it or is done.
    Only plans under way are waited for (:meth:`started`: a plan waiting for its turn
    to start holds nothing and plans nothing yet), and the one furthest behind never
    waits, so plans never wait on each other in a circle. Compacted data keeps request
    order: a plan in a compacted blob waits for the plans before it, as one behind
    another's WAL slices waits for those still behind it."""

    def __init__(self, count: int, max_bytes: int | None) -> None:
        self._max = max_bytes
        self._planned: list[_Planned] = [_Planned() for _ in range(count)]
        self._active: set[int] = set()  # started, not done
        self._changed = anyio.Event()

    def started(self, i: int) -> None:
        """Plan ``i`` is under way (others may wait for it from now on)."""
        self._active.add(i)

    async def left(self, i: int, offset: int, spans: Sequence[Span]) -> bool:
        """Whether plan ``i``, having planned ``spans`` from ``offset``, has room for
        another page."""
        if self._max is None:
            return True
        self._planned[i] = _Planned([merge_key(i, span) for span in spans],
                                    [span.cost_from(max(offset, span.start)) for span in spans])
        self._notify()
        mine = self._planned[i].last(i)
        while any(self._planned[j].last(j) < mine for j in self._active if j != i):
            await self._changed.wait()
        before = self._planned[i].total
        for j, planned in enumerate(self._planned):
            if j != i:
                before += planned.bytes_before(mine)
                if before >= self._max:
                    return False
        return before < self._max

    def planned(self, i: int, plan: ReadPlan | LlogError) -> None:
        """Plan ``i`` is done (its units count against the budget of those after it)."""
        self._planned[i] = _Planned() if not isinstance(plan, ReadPlan) else _Planned(
            [merge_key(i, u.span) for u in plan.units], [unit_bytes(u) for u in plan.units])
        self._active.discard(i)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


class _Planned:
    """One plan's units planned so far, as :class:`PlannedRoom` weighs them: their order
    keys and bytes, in the plan's order."""

    def __init__(self, keys: list[MergeKey] | None = None, sizes: list[int] | None = None
                 ) -> None:
        self.keys = keys or []
        self.ends = list(itertools.accumulate(sizes or []))
        self.total = self.ends[-1] if self.ends else 0
        # In key order (a partition's WAL objects usually are): bisected, not summed.
        self._in_order = all(a <= b for a, b in itertools.pairwise(self.keys))
        self._sizes = sizes or []

    def last(self, i: int) -> MergeKey:
        """The key of the last unit planned, or, with none yet, the least the plan
        (``i``) could start with: units before it may still come."""
        return self.keys[-1] if self.keys else (0, 0, "", i)

    def bytes_before(self, key: MergeKey) -> int:
        """The bytes of the units ordered before ``key``."""
        if self._in_order:
            n = bisect.bisect_left(self.keys, key)
            return self.ends[n - 1] if n else 0
        return sum(b for k, b in zip(self.keys, self._sizes, strict=True) if k < key)


def trim_to_total(plans: list[ReadPlan | LlogError], max_bytes: int | None) -> None:
    """Drop the units beyond the call's total budget in the order of :func:`merged`,
    keeping at least one unit overall so that the first record is always served. Each
    plan keeps a prefix of its units."""
    if max_bytes is None:
        return
    kept = [0] * len(plans)
    planned, kept_any = 0, False
    for i, unit in merged(plans):
        if kept_any and planned >= max_bytes:
            break
        kept[i] += 1
        kept_any = True
        planned += unit_bytes(unit)
    for i, plan in enumerate(plans):
        if isinstance(plan, ReadPlan):
            plan.units = plan.units[:kept[i]]


def unit_bytes(unit: SpanFetch) -> int:
    """The stored bytes a unit fetches."""
    chunks = unit.span.chunks
    if unit.chunk_range is not None and chunks is not None:
        return unit.span.chunks_cost(*unit.chunk_range)
    return unit.span.cost_from(unit.first_offset)
