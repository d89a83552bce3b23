"""The reader: records of partitions from an offset, as the read protocol says.

A read is planned, fetched and assembled:

1. **Plan** (Oxia only): read ``meta/control``, then walk the index from the offset in
   pages (``range_scan`` over windows of offsets, app/storage/index_windows.py),
   skipping strays (WAL entries left inside a compacted range, docs/protocol.md), until
   the byte budget is planned (a partition behind ones that fill the call's total stops
   at its first page); the tail may be the ``pending`` append. Each span becomes a
   *unit* of bytes to fetch: a WAL slice, a run of chunks of a compacted blob (its
   chunk table says where records start), or, for a blob without one, the whole object.
   The budget is planned by bytes, so a catch-up read through compacted data fetches
   about what it returns.
2. **Fetch** (S3 only): at most ``fetch_concurrency`` downloads per call and
   ``max_concurrent_fetches`` per process; a shared WAL blob is read whole once for all
   the partitions that want its slices and kept (app/storage/wal_objects.py), else slices
   of one blob wanted by several partitions share one ranged GET when that is not
   wasteful; whole objects and chunks are kept verified and decoded in a byte-bounded
   :class:`ObjectCache`. After an answer that stopped in the WAL, the objects of the
   next one are read ahead, as the chunks after one that stopped in a compacted blob.
3. **Assemble**: records from the offset within each request's budgets and the call's
   total budget, in request order. The first record of the whole answer is returned
   even if it alone exceeds the budget, so a reader is never stuck.

A partition whose read meets a missing object or a gap is planned once more from fresh
metadata, skipping WAL entries below the compaction cursor (strays whose blob vacuum may
have removed); only then is the error reported. Nothing is ever skipped silently.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from app.errors import CorruptData, LlogError, LogGap, ObjectMissing, OffsetOutOfRange
from app.storage import codec, columnar
from app.storage.batch import RecordBatch
from app.storage.blob_lookups import CONTROL_REUSE_S, BlobLookups, Remembered
from app.storage.chunks import chunk_index, chunk_records
from app.storage.compression import Codec
from app.storage.index_windows import IndexWindows
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.log_record import Payload
from app.storage.object_cache import ObjectCache
from app.storage.oxia_store import OxiaStore, Record
from app.storage.plan_ahead import Lookup, PlanAhead, Taken
from app.storage.read_ahead import ReadAhead
from app.storage.records import CompactionCursor, Control, IndexEntry
from app.storage.runs import Pieces, Run, RunRecords, pieces_of, records_bytes, take
from app.storage.s3 import S3Store
from app.storage.slices import open_slice
from app.storage.spans import ParsedSpans, Span
from app.storage.stored import raw_body
from app.storage.wal_objects import WalObjects

_FIRST_PAGE, _PAGE = 16, 64  # index entries per range_scan: a tail read needs few
MAX_STRAYS_SKIPPED = 10_000  # beyond this, an uncovered offset is reported as a gap
_UNLIMITED = 1 << 62
# Shared WAL objects are at most LLOG_BATCH_MAX_BYTES as written (default 4 MiB).
WAL_OBJECT_MAX_BYTES = 4 * 1024 * 1024
Records = Sequence[Payload]
_Job = tuple[Callable[[], Awaitable[None]], list["_SpanFetch"]]


@dataclass(frozen=True)
class ReadRequest:
    tp: TopicPartition
    offset: int
    max_records: int | None = None
    max_bytes: int | None = None


@dataclass
class ReadResult:
    tp: TopicPartition
    records: Sequence[tuple[int, Payload]]  # RunRecords, read from the log
    high_watermark: int
    next_offset: int
    # The broker's append time of each record, in step with ``records``.
    append_times: list[int] = field(default_factory=list)
    log_start: int = 1
    # Planned from a control record read *ahead* of the read (app/storage/plan_ahead.py),
    # possibly before its caller began: ``high_watermark`` may predate a change the
    # caller had already heard of when it called, so such an answer must not convince
    # the caller that it is up to date (app/broker/consume.py).
    looked_up_ahead: bool = False

    @property
    def size(self) -> int:
        return records_bytes(self.records)


ReadOutcome = ReadResult | LlogError


@dataclass(eq=False)
class _SpanFetch:
    """Bytes to fetch for one span: its records from ``first_offset`` on."""

    span: Span
    first_offset: int
    chunk_range: tuple[int, int] | None = None  # first and last chunk, for chunked blobs
    records: Sequence[Payload] | None = None  # a RecordBatch for a bytes-batch-v3 slice
    error: LlogError | None = None
    # Each chunk's records, as cached or fetched (chunked blobs; whole once all are in).
    chunks: list[Sequence[Payload] | None] | None = None


@dataclass
class _Plan:
    request: ReadRequest
    offset: int
    high_watermark: int
    log_start: int = 1
    units: list[_SpanFetch] = field(default_factory=list)
    looked_up_ahead: bool = False
    # The control record and first index page the plan began from, and when they were
    # read: kept for the next read when the answer had no room for this partition.
    lookup: Lookup | None = None
    looked_up_at: float = 0.0


class LogReader:
    def __init__(self, oxia: OxiaStore, s3: S3Store, layout: KeyLayout, *,
                 object_cache_bytes: int = 256 * 1024 * 1024, fetch_concurrency: int = 32,
                 max_concurrent_fetches: int = 64, read_ahead: int = 0,
                 wal_object_max_bytes: int = WAL_OBJECT_MAX_BYTES) -> None:
        self._oxia = oxia
        self._s3 = s3
        self._layout = layout
        self.objects = ObjectCache(object_cache_bytes)
        # Shared WAL objects up to this size are read whole for all their slices
        # (app/storage/wal_objects.py); 0: each slice is fetched alone.
        self.wal = WalObjects(s3, self.objects, wal_object_max_bytes)
        self._windows = IndexWindows()
        self._spans = ParsedSpans()
        self._fetch_concurrency = fetch_concurrency
        self._process_fetches = anyio.CapacityLimiter(max_concurrent_fetches)
        # Chunks after a read stopped inside a compacted blob (app/storage/read_ahead.py),
        # once given a task group; ``read_ahead`` blobs at most at once.
        self.ahead = ReadAhead(read_ahead)
        # The Oxia reads of a catch-up's next read (app/storage/plan_ahead.py), as many.
        self.plans = PlanAhead(read_ahead)
        # A catch-up inside a compacted blob: its entry and recent control records.
        self._blobs = BlobLookups(layout, self.plans.now)

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
        unit = _SpanFetch(span, span.start, None if chunks is None else (chunk, chunk))
        await self._fetch([unit])
        if unit.error is not None:
            raise unit.error
        assert unit.records is not None
        return list(unit.records)

    async def _read_round(self, requests: Sequence[ReadRequest], max_bytes: int | None, *,
                          skip_strays: bool, oversized_first: bool) -> list[ReadOutcome]:
        plans = await self._plan_all(requests, max_bytes, skip_strays)
        units = [u for p in plans if isinstance(p, _Plan) for u in p.units]
        await self._fetch(units)
        for unit in units:
            self._read_on(unit)
        outcomes = _assemble_all(plans, max_bytes, oversized_first)
        for request, plan, outcome in zip(requests, plans, outcomes, strict=True):
            in_wal = (isinstance(plan, _Plan) and bool(plan.units)
                      and plan.units[-1].span.entry.byte_offset is not None)
            self._plan_on(request.tp, outcome, in_wal,
                          plan if isinstance(plan, _Plan) else None)
        return outcomes

    def _plan_on(self, tp: TopicPartition, outcome: ReadOutcome, in_wal: bool,
                 plan: _Plan | None) -> None:
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
        keys: dict[str, None] = {}
        planned = 0
        for record in page or ():
            span = self._spans.span(self._layout, tp, record.key, record.value,
                                    record.version_id)
            if span is None or span.end < offset:
                continue
            start, length = span.entry.byte_offset, span.entry.byte_length
            if start is None or length is None or planned >= budget:
                break
            key = span.object_key(self._layout)
            if not self.wal.serves(key, start + length):
                break
            if not self.objects.holds_object(key):
                keys[key] = None
            planned += length
        if keys:
            self.ahead.start(f"{tp}@{offset}", functools.partial(self._read_objects,
                                                                 list(keys)))
        return control, page

    async def _read_objects(self, keys: list[str]) -> None:
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)

        async def read(key: str) -> None:
            async with limiter, self._process_fetches:
                await self.wal.read(key, 0)

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(read, key)

    # -- planning (Oxia) ---------------------------------------------------------------

    async def _plan_all(self, requests: Sequence[ReadRequest], max_bytes: int | None,
                        skip_strays: bool) -> list[_Plan | LlogError]:
        plans: list[_Plan | LlogError] = [LogGap("not planned")] * len(requests)
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)
        room = _Room(len(requests), max_bytes)

        async def plan(i: int, request: ReadRequest) -> None:
            budget = _min(request.max_bytes, max_bytes)
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
        _trim_to_total(plans, max_bytes)
        return plans

    async def _plan(self, request: ReadRequest, budget: int | None, skip_strays: bool,
                    room: Callable[[], Awaitable[bool]] | None = None) -> _Plan:
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
        plan = _Plan(request, offset, hw, log_start, looked_up_ahead=ahead is not None)
        if page is not None and offset == request.offset:
            plan.lookup, plan.looked_up_at = (control, page), looked_up_at
        if control is None or offset == hw + 1 or (
                request.max_records is not None and request.max_records <= 0):
            return plan
        stray_floor = await self._cursor(tp) if skip_strays else 1
        spans = await self._resolve(tp, offset, control, budget, request.max_records,
                                    stray_floor, page if offset == request.offset else None,
                                    room)
        plan.units = _units(spans, offset, budget)
        return plan

    async def _cursor(self, tp: TopicPartition) -> int:
        record = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        return 1 if record is None else CompactionCursor.from_json(record.value).offset

    async def _look_up(self, tp: TopicPartition, offset: int
                       ) -> tuple[Control | None, list[Record] | None]:
        """The control record and the first index page from ``offset``, read at once: a
        read of new records costs one Oxia round trip less. The page may predate the
        control record; :meth:`_index_from` reads on where it falls short.

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
                page = await self._index_page(tp, offset, _FIRST_PAGE,
                                              self._window_end(tp, offset, _FIRST_PAGE))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_control)
            tg.start_soon(read_page)
        if failed is not None:
            raise failed
        return control, page

    async def _index_page(self, tp: TopicPartition, start: int, limit: int,
                          stop: int | None) -> list[Record]:
        """Up to ``limit`` entries with keys from ``index/{start}`` below ``index/{stop}``
        (None: to the end of the index). Oxia streams the whole range whatever the
        limit, so the range is what bounds a scan (app/storage/index_windows.py)."""
        end = self._layout.index_scan_end(tp) if stop is None else \
            self._layout.index(tp, stop)
        return await self._oxia.range_scan(self._layout.index(tp, start), end,
                                           tp.partition_key, limit=limit)

    def _window_end(self, tp: TopicPartition, start: int, limit: int,
                    hw: int | None = None) -> int | None:
        """Where a scan for ``limit`` entries from ``start`` stops: about that many
        entries on, or the end of the index once that is beyond ``hw``."""
        stop = start + self._windows.span(tp, limit)
        return None if hw is not None and stop > hw else stop

    async def _resolve(self, tp: TopicPartition, offset: int, control: Control,
                       budget: int | None, max_records: int | None, stray_floor: int,
                       first_page: list[Record] | None = None,
                       room: Callable[[], Awaitable[bool]] | None = None) -> list[Span]:
        """Contiguous spans from ``offset`` until the budgets or the high watermark, or,
        once it has one, until ``room`` says the reads before it in the call have
        planned its total budget (what it would plan beyond would be trimmed).

        WAL spans ending below ``stray_floor`` (the compaction cursor, on a second look)
        are strays and skipped, as is any span that starts beyond the next offset wanted
        (a stray ahead of the compacted entry that covers it, or a hole).
        """
        hw, pending = control.sequence_counter, control.pending
        spans: list[Span] = []
        nxt, cost, skipped = offset, 0, 0
        limit = budget if budget is not None else _UNLIMITED

        def want_more() -> bool:
            return nxt <= hw and cost < limit and (
                max_records is None or nxt - offset < max_records)

        async def more() -> bool:
            return not spans or room is None or await room()

        if pending is None or not pending.covers(nxt):
            async for span in self._index_from(tp, offset, hw, first_page, more):
                if span.end < nxt:
                    continue
                if span.start > nxt or (span.is_wal and span.end < stray_floor):
                    if not span.is_wal or skipped >= MAX_STRAYS_SKIPPED:
                        break  # a compacted entry is never a stray: a hole
                    skipped += 1
                    continue
                spans.append(span)
                if budget is not None:
                    cost += span.cost_from(nxt)
                nxt = span.end + 1
                if not want_more() or (pending is not None and pending.covers(nxt)):
                    break
        if spans:
            self._blobs.ended_in(tp, spans[-1])  # where a catch-up reads on
        if want_more() and pending is not None and pending.covers(nxt):
            spans.append(Span.of_pending(pending))
        if not spans:
            raise LogGap(f"{tp}: no index entry covers offset {offset} (high watermark "
                         f"{hw}; {skipped} stray entries skipped)")
        return spans

    async def _index_from(self, tp: TopicPartition, offset: int, hw: int,
                          first_page: list[Record] | None = None,
                          more: Callable[[], Awaitable[bool]] | None = None
                          ) -> AsyncIterator[Span]:
        """The partition's index entries from key ``index/{offset}`` on, in pages, each
        scan over a window of offsets (:meth:`_window_end`) until one reaches beyond the
        high watermark ``hw`` and ends the index.

        ``first_page``, read from ``offset`` beside the control record, may be older
        than it: when it falls short, the scan goes on from where it ended (the caller
        stops once it reaches the high watermark). ``more`` is asked before each page
        after the first: it ends the walk when it says no."""
        start, limit = offset, _FIRST_PAGE
        first = True
        while True:
            if not first and more is not None and not await more():
                return
            first = False
            prefetched = first_page is not None
            stop = None if prefetched else self._window_end(tp, start, limit, hw)
            records = first_page if first_page is not None else \
                await self._index_page(tp, start, limit, stop)
            first_page = None
            spans = [span for record in records if (span := self._spans.span(
                self._layout, tp, record.key, record.value, record.version_id)) is not None]
            if not isinstance(records, Remembered):  # a scan: what a window holds
                self._windows.learn(tp, spans)
            for span in spans:
                yield span
                start = span.end + 1
            if len(records) >= limit and spans:
                limit = _PAGE
                continue
            if prefetched:
                continue  # read again from where it ended: it may predate the control
            if stop is None:
                return  # the end of the index
            if not spans:
                self._windows.widen(tp)
            # Read after the control record, the window holds every entry up to ``hw``
            # in it: the next one starts where it stopped.
            start = max(start, stop)

    # -- fetching (S3) -----------------------------------------------------------------

    async def _fetch(self, units: list[_SpanFetch]) -> None:
        """Fill every unit's records (or error); a failure only touches its own units."""
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)

        async def run(job: Callable[[], Awaitable[None]], group: list[_SpanFetch]) -> None:
            async with limiter, self._process_fetches:
                try:
                    await job()
                except LlogError as exc:
                    for unit in group:
                        if unit.records is None:
                            unit.error = exc

        async with anyio.create_task_group() as tg:
            for job, group in self._jobs(units):
                tg.start_soon(run, job, group)
        for unit in units:
            parts = unit.chunks
            if parts is not None and unit.error is None and unit.records is None:
                unit.records = Pieces([part for part in parts if part is not None])

    def _jobs(self, units: list[_SpanFetch]) -> list[_Job]:
        slices: dict[str, list[_SpanFetch]] = {}
        wholes: dict[str, list[_SpanFetch]] = {}
        jobs: list[_Job] = []
        for unit in units:
            key = unit.span.object_key(self._layout)
            if unit.span.entry.byte_offset is not None:
                slices.setdefault(key, []).append(unit)
            elif unit.chunk_range is not None:
                jobs.extend(self._chunk_jobs(key, unit))
            else:
                wholes.setdefault(key, []).append(unit)
        for key, group in slices.items():
            if self.wal.serves(key, max(sum(_slice(u)) for u in group)):
                jobs.append((functools.partial(self._fetch_from_object, key, group), group))
            else:
                jobs.extend(self._slice_jobs(key, group))
        for key, group in wholes.items():
            jobs.append((functools.partial(self._fetch_whole, key, group), group))
        return jobs

    def _slice_jobs(self, key: str, group: list[_SpanFetch]) -> list[_Job]:
        """One ranged GET for slices of one blob when their span is at most twice what
        is wanted (several partitions of one flush), else one GET per slice."""
        lo = min(_slice(u)[0] for u in group)
        hi = max(sum(_slice(u)) for u in group)
        wanted = sum(_slice(u)[1] for u in group)
        if len(group) > 1 and hi - lo <= 2 * wanted:
            return [(functools.partial(self._fetch_slices, key, group, lo, hi), group)]
        return [(functools.partial(self._fetch_slices, key, [u], *_bounds(u)), [u])
                for u in group]

    async def _fetch_slices(self, key: str, group: list[_SpanFetch], lo: int, hi: int) -> None:
        data = await self._s3.get_range(key, lo, hi - lo)
        for unit in group:
            start, length = _slice(unit)
            unit.records = await _slice_records(
                memoryview(data)[start - lo:start - lo + length], unit.span.entry)

    async def _fetch_from_object(self, key: str, group: list[_SpanFetch]) -> None:
        """The group's slices from the whole object (kept, or read once for all): each
        verified; a slice that fails is its unit's error alone."""
        data = await self.wal.read(key, len(group))
        view = memoryview(data)
        for unit in group:
            start, length = _slice(unit)
            entry = unit.span.entry
            try:
                if start + length > len(data):
                    raise ObjectMissing(
                        f"s3://{self._s3.bucket}/{key}: holds {len(data)} bytes, the index "
                        f"says a slice ends at {start + length} (object truncated?)")
                unit.records = await _slice_records(view[start:start + length], entry)
            except LlogError as exc:
                unit.error = exc

    def _chunk_jobs(self, key: str, unit: _SpanFetch) -> list[_Job]:
        """A job for the unit's chunks unless the cache holds them all (a previous
        read's last chunk often is cached: its answer ended inside it)."""
        assert unit.chunk_range is not None
        first, last = unit.chunk_range
        unit.chunks = [self.objects.get(key, i) for i in range(first, last + 1)]
        if all(part is not None for part in unit.chunks):
            return []
        return [(functools.partial(self._fetch_chunks, key, unit), [unit])]

    async def _fetch_chunks(self, key: str, unit: _SpanFetch) -> None:
        """The unit's chunks not yet in its parts: those a read-ahead under way brings
        from the cache once it has, the rest with one ranged GET."""
        assert unit.chunks is not None and unit.chunk_range is not None
        await self.ahead.wait(key)
        first = unit.chunk_range[0]
        missing = []
        for i, part in enumerate(unit.chunks, first):
            if part is None:
                unit.chunks[i - first] = self.objects.get(key, i)
                if unit.chunks[i - first] is None:
                    missing.append(i)
        if missing:
            await self._get_chunks(key, unit, missing[0], missing[-1])

    async def _get_chunks(self, key: str, unit: _SpanFetch, first: int, last: int) -> None:
        """Chunks ``first .. last`` of a unit's blob, in one ranged GET, into its parts
        and the object cache."""
        chunks = unit.span.chunks
        assert chunks is not None and unit.chunks is not None and unit.chunk_range is not None
        lo, hi = chunks[first].byte_offset, chunks[last].byte_end
        stored_codec = unit.span.codec
        data = memoryview(await self._s3.get_range(key, lo, hi - lo))
        encoding = unit.span.entry.encoding

        def decode() -> list[Records]:
            out = []
            for c in chunks[first:last + 1]:
                body = data[c.byte_offset - lo:c.byte_end - lo]
                if (encoding in _KEPT_AS_COLUMNS and stored_codec is Codec.NONE
                        and len(body) != len(data)):
                    # A cached chunk must not pin the range (a decompressed one has its own).
                    body = memoryview(bytes(body))
                out.append(chunk_records(body, c, encoding, stored_codec))
            return out

        if stored_codec is Codec.NONE or unit.span.chunks_cost(first, last) <= _INLINE_RAW_BYTES:
            decoded = decode()
        else:  # zstd releases the GIL: many chunks decompress off the event loop
            decoded = await anyio.to_thread.run_sync(decode)
        for i, records in enumerate(decoded, first):
            self.objects.put(key, records, i)
            unit.chunks[i - unit.chunk_range[0]] = records

    def _read_on(self, unit: _SpanFetch) -> None:
        """After a read that stopped inside a compacted blob: fetch as many bytes of the
        chunks that follow in the background, for the next read."""
        chunks = unit.span.chunks
        if chunks is None or unit.chunk_range is None or unit.error is not None:
            return
        first, last = unit.chunk_range
        start = last + 1
        if start >= len(chunks):
            return
        size = chunks[last].byte_end - chunks[first].byte_offset
        end = start
        while end + 1 < len(chunks) and chunks[end].byte_end - chunks[start].byte_offset < size:
            end += 1
        key = unit.span.object_key(self._layout)
        missing = [i for i in range(start, end + 1) if not self.objects.holds(key, i)]
        if not missing:
            return
        ahead = _SpanFetch(unit.span, unit.span.start + chunks[start].first_record, (start, end))
        ahead.chunks = [None] * (end - start + 1)
        self.ahead.start(key, functools.partial(self._get_chunks, key, ahead, missing[0],
                                                missing[-1]))

    async def _fetch_whole(self, key: str, group: list[_SpanFetch]) -> None:
        entry = group[0].span.entry
        records = self.objects.get(key)
        if records is None:
            data = raw_body(await self._s3.get(key), entry)
            records = codec.decode_body(data, entry.encoding, entry.msg_count)
            self.objects.put(key, records)
        for unit in group:
            if len(records) != unit.span.entry.msg_count:
                raise CorruptData(f"{key} holds {len(records)} records, the index says "
                                  f"{unit.span.entry.msg_count}")
            unit.records = records


# Compressed chunks of fewer raw bytes are decompressed in place (well under a
# millisecond); more go to a worker thread.
_INLINE_RAW_BYTES = 64 * 1024
# Chunks whose records stay views of their bytes (the others are decoded into copies).
_KEPT_AS_COLUMNS = (columnar.ENCODING_V3, codec.ENCODING_V3_CHUNKED)


async def _slice_records(stored: memoryview, entry: IndexEntry) -> Sequence[Payload]:
    """The records of a WAL slice's stored bytes: verified, decompressed if it is."""
    body = await open_slice(stored, entry)
    return _batch(memoryview(body), entry.encoding, entry.msg_count)


def _batch(body: memoryview, encoding: str, count: int) -> Sequence[Payload]:
    """A checked body's records: a bytes-batch-v3 body stays in its columns (an answer
    takes runs of them as they are, app/storage/runs.py), others are decoded."""
    if encoding != columnar.ENCODING_V3:
        return codec.decode_body(body, encoding, count)
    return RecordBatch.of_columns(body, columnar.read_counted(body, count))


def _min(a: int | None, b: int | None) -> int | None:
    values = [v for v in (a, b) if v is not None]
    return min(values) if values else None


def _slice(unit: _SpanFetch) -> tuple[int, int]:
    e = unit.span.entry
    assert e.byte_offset is not None and e.byte_length is not None
    return e.byte_offset, e.byte_length


def _bounds(unit: _SpanFetch) -> tuple[int, int]:
    start, length = _slice(unit)
    return start, start + length


def _units(spans: list[Span], offset: int, budget: int | None) -> list[_SpanFetch]:
    """What to fetch for ``spans`` read from ``offset``: for a chunked compacted blob,
    only the chunks from the one holding the offset until the budget is met."""
    units: list[_SpanFetch] = []
    nxt, planned = offset, 0
    for span in spans:
        chunks = span.chunks
        if chunks is None:
            units.append(_SpanFetch(span, span.start))
            planned += span.cost_from(nxt)
        else:
            first = last = chunk_index(chunks, max(nxt, span.start) - span.start)
            planned += span.chunks_cost(first, first)
            while last + 1 < len(chunks) and (budget is None or planned < budget):
                last += 1
                planned += span.chunks_cost(last, last)
            units.append(_SpanFetch(span, span.start + chunks[first].first_record, (first, last)))
            if last + 1 < len(chunks):
                break  # the budget ends inside this blob
        nxt = span.end + 1
    return units


class _Room:
    """Whether the plans before one in a call leave room in its total budget: a plan
    reads index pages beyond its first only while they do. (They are planned at once;
    one behind a partition that fills the budget would plan its own budget for nothing,
    page after page.)"""

    def __init__(self, count: int, max_bytes: int | None) -> None:
        self._done = [anyio.Event() for _ in range(count)]
        self._bytes = [0] * count
        self._max = max_bytes

    async def left(self, i: int) -> bool:
        if self._max is None:
            return True
        for done in self._done[:i]:  # earlier plans never wait on later ones
            await done.wait()
        return sum(self._bytes[:i]) < self._max

    def planned(self, i: int, plan: _Plan | LlogError) -> None:
        if isinstance(plan, _Plan):
            self._bytes[i] = sum(_unit_bytes(u) for u in plan.units)
        self._done[i].set()


def _trim_to_total(plans: list[_Plan | LlogError], max_bytes: int | None) -> None:
    """Drop the units beyond the call's total budget (in request order), keeping at
    least one unit overall so that the first record is always served."""
    if max_bytes is None:
        return
    planned, kept_any = 0, False
    for plan in plans:
        if not isinstance(plan, _Plan):
            continue
        keep: list[_SpanFetch] = []
        for unit in plan.units:
            if kept_any and planned >= max_bytes:
                break
            keep.append(unit)
            kept_any = True
            planned += _unit_bytes(unit)
        plan.units = keep


def _unit_bytes(unit: _SpanFetch) -> int:
    chunks = unit.span.chunks
    if unit.chunk_range is not None and chunks is not None:
        return unit.span.chunks_cost(*unit.chunk_range)
    return unit.span.cost_from(unit.first_offset)


def _assemble_all(plans: list[_Plan | LlogError], max_bytes: int | None,
                  oversized_first: bool) -> list[ReadOutcome]:
    remaining = [max_bytes if max_bytes is not None else _UNLIMITED]
    out: list[ReadOutcome] = []
    for plan in plans:
        if isinstance(plan, LlogError):
            out.append(plan)
            continue
        try:
            out.append(_assemble(plan, remaining, first_of_answer=oversized_first and not any(
                isinstance(o, ReadResult) and o.records for o in out)))
        except LlogError as exc:
            out.append(exc)
    return out


def _assemble(plan: _Plan, remaining: list[int], *, first_of_answer: bool) -> ReadResult:
    """Records from the plan's offset within the request's budgets and ``remaining``
    (the call's total budget left, shared across plans), as runs of the fetched bodies."""
    request = plan.request
    taken: list[Run] = []
    size, count, nxt = 0, 0, plan.offset
    budget = min(request.max_bytes or _UNLIMITED, remaining[0])
    for unit in plan.units:
        if unit.error is not None:
            if taken:
                break  # serve what precedes it; the next read reports the error
            raise unit.error
        assert unit.records is not None
        if unit.first_offset > nxt:
            break  # a hole after what we have: the next read reports it
        at = unit.first_offset
        spent = False
        for piece in pieces_of(unit.records):  # the chunks of a compacted blob
            if at + len(piece) > nxt:
                run, used = take(piece, nxt - at, nxt, unit.span.entry.created_at_ms,
                                 budget=budget - size,
                                 max_records=None if request.max_records is None
                                 else request.max_records - count,
                                 may_exceed=first_of_answer and count == 0)
                taken.append(run)
                size, count, nxt = size + used, count + len(run), nxt + len(run)
                spent = run.stop < len(piece)
                if spent:
                    break
            at += len(piece)
        if spent:
            break  # a budget is spent
    remaining[0] -= size
    records = RunRecords(taken, size)
    return ReadResult(request.tp, records, plan.high_watermark, nxt, records.times(),
                      plan.log_start, plan.looked_up_ahead)
