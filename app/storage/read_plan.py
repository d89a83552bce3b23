"""A read's plan: per partition, the offset it starts from and the units of bytes to
fetch (a WAL slice, a run of chunks of a compacted blob, a whole object), and how the
units of one call are kept within its total byte budget (docs/protocol.md, the read
protocol)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


class PlannedRoom:
    """Whether the plans before one in a call leave room in its total budget: a plan
    reads index pages beyond its first only while they do. (They are planned at once;
    one behind a partition that fills the budget would plan its own budget for nothing,
    page after page.)"""

    def __init__(self, count: int, max_bytes: int | None,
                 cost: Callable[[SpanFetch], int] | None = None) -> None:
        self._done = [anyio.Event() for _ in range(count)]
        self._bytes = [0] * count
        self._max = max_bytes
        self._cost = cost or unit_bytes

    async def left(self, i: int) -> bool:
        """Whether plans ``0 .. i-1`` (once done) planned less than the total budget."""
        if self._max is None:
            return True
        for done in self._done[:i]:  # earlier plans never wait on later ones
            await done.wait()
        return sum(self._bytes[:i]) < self._max

    def planned(self, i: int, plan: ReadPlan | LlogError) -> None:
        """Plan ``i`` is done (its bytes count against the budget of those after it)."""
        if isinstance(plan, ReadPlan):
            self._bytes[i] = plan_charge(plan, plan.units, self._cost)
        self._done[i].set()


def trim_to_total(plans: list[ReadPlan | LlogError], max_bytes: int | None,
                  cost: Callable[[SpanFetch], int] | None = None) -> None:
    """Drop the units beyond the call's total budget (in request order), each plan
    counted as :func:`plan_charge` says (``cost``: what a unit would fetch, by default
    all its bytes), keeping at least one unit overall so that the first record is always
    served."""
    if max_bytes is None:
        return
    cost = cost or unit_bytes
    planned, kept_any = 0, False
    for plan in plans:
        if not isinstance(plan, ReadPlan):
            continue
        keep: list[SpanFetch] = []
        whole = fetch = charge = 0  # plan_charge(plan, keep, cost), kept as it grows
        for unit in plan.units:
            if kept_any and planned + charge >= max_bytes:
                break
            keep.append(unit)
            kept_any = True
            whole += unit_bytes(unit)
            fetch += cost(unit)
            charge = _charge(whole, fetch, plan.request.max_bytes)
        planned += charge
        plan.units = keep


def plan_charge(plan: ReadPlan, units: Sequence[SpanFetch],
                cost: Callable[[SpanFetch], int]) -> int:
    """What ``units`` of ``plan`` take of the answer's budget: the records they can
    answer (their bytes, up to the partition's own budget), or what they would fetch
    (``cost``) when that is more. So a partition with a budget of its own leaves the
    rest to those after it even where its units span more (the chunk its last answer
    ended in), and many small budgets cannot fetch many times the answer's."""
    return _charge(sum(unit_bytes(u) for u in units), sum(cost(u) for u in units),
                   plan.request.max_bytes)


def _charge(whole: int, fetch: int, budget: int | None) -> int:
    return max(whole if budget is None else min(whole, budget), fetch)


def unit_bytes(unit: SpanFetch) -> int:
    """The stored bytes a unit fetches."""
    chunks = unit.span.chunks
    if unit.chunk_range is not None and chunks is not None:
        return unit.span.chunks_cost(*unit.chunk_range)
    return unit.span.cost_from(unit.first_offset)


def bytes_to_fetch(unit: SpanFetch, held: Callable[[SpanFetch, int], bool]) -> int:
    """:func:`unit_bytes` but for what ``held`` says is kept already (a chunk by its
    index, a WAL slice's whole object as -1): a consumer reading several partitions
    with a budget each resumes every one inside the chunk or the WAL object its
    previous answer ended in, kept from that read. Counted whole, those filled the
    call's budget before its last partitions were planned (so they got no records
    while the first ones had any left), though they cost no fetch."""
    chunks = unit.span.chunks
    if unit.chunk_range is None or chunks is None:
        return 0 if held(unit, -1) else unit_bytes(unit)
    first, last = unit.chunk_range
    return sum(unit.span.chunks_cost(i, i) for i in range(first, last + 1)
               if not held(unit, i))
