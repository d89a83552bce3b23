"""The reader: records of partitions from an offset, as the read protocol says.

A read is planned, fetched and assembled:

1. **Plan** (Oxia only; app/storage/index_walk.py, app/storage/read_plan.py): read
   ``meta/control``, then walk the index from the offset in pages (``range_scan`` over
   windows of offsets, app/storage/index_windows.py), skipping strays (WAL entries left
   inside a compacted range, docs/protocol.md), until the byte budget is planned (a
   partition behind ones that fill the call's total stops at its first page); the tail
   may be the ``pending`` append. Each span becomes a *unit* of bytes to fetch: a WAL
   slice, a run of chunks of a compacted blob (its chunk table says where records
   start), or, for a blob without one, the whole object. The budget is planned by bytes,
   so a catch-up read through compacted data fetches about what it returns.
2. **Fetch** (S3 only; app/storage/span_fetch.py): at most ``fetch_concurrency``
   downloads per call and ``max_concurrent_fetches`` per process; a shared WAL blob is
   read whole once for all the partitions that want its slices and kept
   (app/storage/wal_objects.py), else slices of one blob wanted by several partitions
   share one ranged GET when that is not wasteful; whole objects and chunks are kept
   verified and decoded in a byte-bounded :class:`ObjectCache`. After an answer that
   stopped in the WAL, the objects of the next one are read ahead, as the chunks after
   one that stopped in a compacted blob.
3. **Assemble** (app/storage/read_assembly.py): records from the offset within each
   request's budgets and the call's total budget, in request order. The first record of
   the whole answer is returned even if it alone exceeds the budget, so a reader is
   never stuck.

A partition whose read meets a missing object or a gap is planned once more from fresh
metadata, skipping WAL entries below the compaction cursor (strays whose blob vacuum may
have removed); only then is the error reported. Nothing is ever skipped silently.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio

from app.errors import LlogError, LogGap, ObjectMissing, OffsetOutOfRange
from app.storage.blob_lookups import CONTROL_REUSE_S, BlobLookups
from app.storage.index_walk import FIRST_PAGE, IndexWalk
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.log_record import Payload
from app.storage.metadata import Control
from app.storage.object_cache import ObjectCache
from app.storage.plan_ahead import PlanAhead, Taken
from app.storage.read_ahead import Admit, ReadAhead
from app.storage.read_assembly import ReadOutcome, ReadResult, assemble_all
from app.storage.read_plan import (
    PlannedRoom,
    ReadPlan,
    ReadRequest,
    SpanFetch,
    bytes_to_fetch,
    min_budget,
    trim_to_total,
    units_for,
)
from app.storage.span_fetch import SpanFetcher
from app.storage.spans import Span
from app.storage.wal_objects import WalObjects
from app.stores.oxia.store import OxiaStore, Record
from app.stores.s3.store import S3Store

__all__ = ["WAL_OBJECT_MAX_BYTES", "LogReader", "ReadOutcome", "ReadRequest", "ReadResult"]

# Shared WAL objects are at most LLOG_BATCH_MAX_BYTES as written (default 4 MiB).
WAL_OBJECT_MAX_BYTES = 4 * 1024 * 1024


class LogReader:
    """A read's rounds: plan (:class:`IndexWalk`), fetch (:class:`SpanFetcher`),
    assemble (app/storage/read_assembly.py), and what is looked up and read ahead for
    the next read. The steps are methods so that a model of the reader can stand in for
    its round trips (tests/test_wakeup_interleavings.py)."""

    def __init__(self, oxia: OxiaStore, s3: S3Store, layout: KeyLayout, *,
                 object_cache_bytes: int = 256 * 1024 * 1024, fetch_concurrency: int = 32,
                 max_concurrent_fetches: int = 64, read_ahead: int = 0,
                 wal_object_max_bytes: int = WAL_OBJECT_MAX_BYTES,
                 admit: Admit | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._oxia = oxia
        self._layout = layout
        self.objects = ObjectCache(object_cache_bytes)
        # Shared WAL objects up to this size are read whole for all their slices
        # (app/storage/wal_objects.py); 0: each slice is fetched alone.
        self.wal = WalObjects(s3, self.objects, wal_object_max_bytes)
        self._fetch_concurrency = fetch_concurrency
        # Chunks after a read stopped inside a compacted blob (app/storage/read_ahead.py),
        # once given a task group; ``read_ahead`` blobs at most at once, each holding its
        # bytes in the budget ``admit`` takes them from (None: a reader of its own).
        self.ahead = ReadAhead(read_ahead, admit)
        # The Oxia reads of a catch-up's next read (app/storage/plan_ahead.py), as many.
        # ``clock`` (seconds) dates every lookup, here and in the blob lookups below.
        self.plans = PlanAhead(read_ahead, clock=clock)
        # A catch-up inside a compacted blob: its entry and recent control records.
        self._blobs = BlobLookups(layout, self.plans.now)
        # The sparse index in Oxia, as this reader walks it (app/storage/index_walk.py).
        self.index = IndexWalk(oxia, layout, self._blobs)
        self._fetcher = SpanFetcher(s3, layout, self.objects, self.wal, self.ahead,
                                    fetch_concurrency=fetch_concurrency,
                                    max_concurrent_fetches=max_concurrent_fetches)

    def run_ahead_in(self, group: anyio.abc.TaskGroup) -> None:
        """Read and plan ahead (chunks, lookups) in ``group`` from now on."""
        self.ahead.run_in(group)
        self.plans.run_in(group)

    async def read_control(self, tp: TopicPartition) -> Control | None:
        record = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        return None if record is None else Control.from_json(record.value)

    async def high_watermark(self, tp: TopicPartition) -> int:
        control = await self.read_control(tp)
        return 0 if control is None else control.sequence_counter

    async def read(self, tp: TopicPartition, offset: int, *, max_records: int | None = None,
                   max_bytes: int | None = None) -> ReadResult:
        """Records from ``offset`` (0 means the first) within the budgets."""
        (result,) = await self.read_many([ReadRequest(tp, offset, max_records, max_bytes)])
        if isinstance(result, LlogError):
            raise result
        return result

    async def read_many(self, requests: Sequence[ReadRequest], *,
                        max_bytes: int | None = None, oversized_first: bool = True
                        ) -> list[ReadOutcome]:
        """Read several partitions; ``max_bytes`` bounds the whole answer (request order).

        ``oversized_first``: the first record of the answer is returned even if it alone
        exceeds the budgets (False when the caller already has records for its answer).
        Each partition's failure is its own entry in the result list.
        """
        outcomes = await self._read_round(requests, max_bytes, skip_strays=False,
                                          oversized_first=oversized_first)
        again = [i for i, o in enumerate(outcomes) if isinstance(o, ObjectMissing | LogGap)]
        for i in again:  # planned again from fresh metadata: the index is read again
            self._blobs.forget(requests[i].tp)
        if again:
            used = sum(o.size for o in outcomes if isinstance(o, ReadResult))
            budget = None if max_bytes is None else max(0, max_bytes - used)
            retried = await self._read_round(
                [requests[i] for i in again], budget, skip_strays=True,
                oversized_first=oversized_first and not any(
                    isinstance(o, ReadResult) and o.records for o in outcomes))
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i] = outcome
        return outcomes

    async def span_at(self, tp: TopicPartition, offset: int, control: Control) -> Span:
        """The span covering ``offset`` (at or below the high watermark)."""
        return (await self._resolve(tp, offset, control, None, 1, 1))[0]

    async def chunk_records(self, span: Span, chunk: int) -> list[Payload]:
        """The records of one chunk of a compacted span, as decoded (append times
        kept); the whole object's for a span without a chunk table."""
        chunks = span.chunks
        unit = SpanFetch(span, span.start, None if chunks is None else (chunk, chunk))
        await self._fetch([unit])
        if unit.error is not None:
            raise unit.error
        assert unit.records is not None
        return list(unit.records)

    async def _read_round(self, requests: Sequence[ReadRequest], max_bytes: int | None, *,
                          skip_strays: bool, oversized_first: bool) -> list[ReadOutcome]:
        plans = await self._plan_all(requests, max_bytes, skip_strays)
        units = [u for p in plans if isinstance(p, ReadPlan) for u in p.units]
        await self._fetch(units)
        for unit in units:
            self._fetcher.read_on(unit)
        outcomes = assemble_all(plans, max_bytes, oversized_first)
        for request, plan, outcome in zip(requests, plans, outcomes, strict=True):
            in_wal = (isinstance(plan, ReadPlan) and bool(plan.units)
                      and plan.units[-1].span.entry.byte_offset is not None)
            self._plan_on(request.tp, outcome, in_wal,
                          plan if isinstance(plan, ReadPlan) else None)
        return outcomes

    def _plan_on(self, tp: TopicPartition, outcome: ReadOutcome, in_wal: bool,
                 plan: ReadPlan | None) -> None:
        """After an answer that stopped below the high watermark: look up its next offset
        in the background, for the consumer's next read; when it stopped in the WAL
        (``in_wal``), read the WAL objects of that lookup's index page ahead too. A
        partition the answer had no room for keeps the lookup it made: the consumer asks
        again from the same offset, most likely while others fill its answers."""
        if (isinstance(outcome, ReadResult) and not outcome.records and plan is not None
                and plan.lookup is not None and outcome.next_offset <= outcome.high_watermark):
            self.plans.keep(tp, outcome.next_offset, plan.lookup, plan.looked_up_at)
            return
        if (isinstance(outcome, ReadResult) and outcome.records
                and outcome.next_offset <= outcome.high_watermark):
            nxt = outcome.next_offset
            if self._blobs.in_blob(tp, nxt, CONTROL_REUSE_S / 2) is not None:
                return  # the next read takes the newest lookup (refreshed before it ages)
            look_up = functools.partial(self._look_up, tp, nxt)
            if in_wal and self.wal.max_bytes > 0:
                look_up = functools.partial(self._look_up_wal_ahead, tp, nxt,
                                            max(outcome.size, 1))
            self.plans.start(tp, nxt, look_up)

    async def _look_up_wal_ahead(self, tp: TopicPartition, offset: int, budget: int
                                 ) -> tuple[Control | None, list[Record] | None]:
        """:meth:`_look_up`, then the WAL objects of the page's slices from ``offset``
        (about ``budget`` bytes) read whole into the object cache in the background.
        Only a warm-up: the read that needs them plans from its control record as
        always, so an entry seen here (a stray, one compacted since) costs at most a
        download; that read waits for an object under way rather than fetch it again."""
        control, page = await self._look_up(tp, offset)
        spans = [span for record in page or ()
                 if (span := self.index.span_of(tp, record)) is not None]
        keys = self._fetcher.wal_objects_from(spans, offset, budget)
        if keys:
            self._fetcher.read_objects_ahead(f"{tp}@{offset}", keys)
        return control, page

    # -- planning (Oxia: app/storage/index_walk.py) --------------------------------------

    async def _plan_all(self, requests: Sequence[ReadRequest], max_bytes: int | None,
                        skip_strays: bool) -> list[ReadPlan | LlogError]:
        plans: list[ReadPlan | LlogError] = [LogGap("not planned")] * len(requests)
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)
        room = PlannedRoom(len(requests), max_bytes, self._bytes_to_fetch)

        async def plan(i: int, request: ReadRequest) -> None:
            budget = min_budget(request.max_bytes, max_bytes)
            async with limiter:
                try:
                    plans[i] = await self._plan(request, budget, skip_strays,
                                                functools.partial(room.left, i))
                except LlogError as exc:
                    plans[i] = exc
                finally:
                    room.planned(i, plans[i])

        async with anyio.create_task_group() as tg:
            for i, request in enumerate(requests):
                tg.start_soon(plan, i, request)
        trim_to_total(plans, max_bytes, self._bytes_to_fetch)
        return plans

    def _bytes_to_fetch(self, unit: SpanFetch) -> int:
        return bytes_to_fetch(unit, self._holds_chunk)

    def _holds_chunk(self, unit: SpanFetch, chunk: int) -> bool:
        key = unit.span.object_key(self._layout)
        if chunk >= 0:
            return self.objects.holds(key, chunk)
        # A WAL slice is served from its whole object when the cache keeps that.
        return unit.span.entry.byte_offset is not None and self.objects.holds_object(key)

    async def _plan(self, request: ReadRequest, budget: int | None, skip_strays: bool,
                    room: Callable[[], Awaitable[bool]] | None = None) -> ReadPlan:
        tp = request.tp
        page: list[Record] | None = None
        ahead: Taken | None = None
        if request.offset >= 1 and (request.max_records is None or request.max_records > 0):
            # The control record and the first index page from the offset: looked up
            # ahead of this read (:meth:`_plan_on`), or now.
            looked_up_at = self.plans.now()
            ahead = self._blobs.in_blob(tp, request.offset) or await self.plans.take(
                tp, request.offset)
            if ahead is not None:
                looked_up_at = ahead.started
            control, page = ahead.result if ahead is not None else \
                await self._look_up(tp, request.offset)
        else:
            control = await self.read_control(tp)
        hw = 0 if control is None else control.sequence_counter
        log_start = 1 if control is None else control.log_start
        offset = request.offset if request.offset >= 1 else log_start  # 0: the log start
        if offset > hw + 1 or offset < log_start:
            where = ("beyond the high watermark" if offset > hw + 1 else
                     "below the log start (retention removed what precedes it)")
            raise OffsetOutOfRange(
                f"{tp}: offset {offset} is {where}; the log holds {log_start}..{hw}",
                log_start=log_start, high_watermark=hw)
        plan = ReadPlan(request, offset, hw, log_start, looked_up_ahead=ahead is not None)
        if page is not None and offset == request.offset:
            plan.lookup, plan.looked_up_at = (control, page), looked_up_at
        if control is None or offset == hw + 1 or (
                request.max_records is not None and request.max_records <= 0):
            return plan
        stray_floor = await self.index.cursor(tp) if skip_strays else 1
        spans = await self._resolve(tp, offset, control, budget, request.max_records,
                                    stray_floor, page if offset == request.offset else None,
                                    room)
        plan.units = units_for(spans, offset, budget)
        return plan

    async def _look_up(self, tp: TopicPartition, offset: int
                       ) -> tuple[Control | None, list[Record] | None]:
        """The control record and the first index page from ``offset``, read at once: a
        read of new records costs one Oxia round trip less. The page may predate the
        control record; :meth:`IndexWalk.spans_from` reads on where it falls short.

        When the partition's last compacted entry covers ``offset``, it is the page and
        only the control record is read: a compacted entry is immutable, retention that
        removes it moves the log start past ``offset`` (the control record says so), and
        a read that then meets a missing object plans again with the entry forgotten."""
        started = self.plans.now()
        page: list[Record] | None = self._blobs.covering(tp, offset)
        if page is not None:
            return self._blobs.seen(tp, started, await self.read_control(tp)), page
        control: Control | None = None
        failed: LlogError | None = None

        async def read_control() -> None:
            nonlocal control, failed
            try:
                control = self._blobs.seen(tp, started, await self.read_control(tp))
            except LlogError as exc:  # the read fails as a sequential one would
                failed = exc
                tg.cancel_scope.cancel()

        async def read_page() -> None:
            nonlocal page
            with contextlib.suppress(LlogError):  # the walk reads it again
                page = await self.index.page(tp, offset, FIRST_PAGE,
                                              self.index.window_end(tp, offset, FIRST_PAGE))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_control)
            tg.start_soon(read_page)
        if failed is not None:
            raise failed
        return control, page

    async def _resolve(self, tp: TopicPartition, offset: int, control: Control,
                       budget: int | None, max_records: int | None, stray_floor: int,
                       first_page: list[Record] | None = None,
                       room: Callable[[], Awaitable[bool]] | None = None) -> list[Span]:
        """Contiguous spans from ``offset`` (:meth:`IndexWalk.resolve`)."""
        return await self.index.resolve(tp, offset, control, budget, max_records,
                                         stray_floor, first_page, room)

    # -- fetching (S3: app/storage/span_fetch.py) ----------------------------------------

    async def _fetch(self, units: list[SpanFetch]) -> None:
        """Fill every unit's records (or error); a failure only touches its own units."""
        await self._fetcher.fetch(units)
