"""The walk of a partition's sparse index in Oxia: pages of ``range_scan`` over windows
of offsets (app/storage/index_windows.py) parsed into spans (app/storage/spans.py), and
the contiguous spans a read from an offset needs, strays skipped (docs/protocol.md).
It holds what it learns across reads: how many offsets a window of entries covers, and
the entries already parsed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from app.errors import LogGap
from app.storage.blob_lookups import BlobLookups, Remembered
from app.storage.index_windows import IndexWindows
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import CompactionCursor, Control
from app.storage.read_plan import UNLIMITED
from app.storage.spans import ParsedSpans, Span
from app.stores.oxia.store import OxiaStore, Record

FIRST_PAGE, PAGE = 16, 64  # index entries per range_scan: a tail read needs few
MAX_STRAYS_SKIPPED = 10_000  # beyond this, an uncovered offset is reported as a gap

More = Callable[[], Awaitable[bool]]


class IndexWalk:
    """Reads of one store's index: pages, the spans from an offset, the compaction
    cursor. ``blobs`` is told where each walk ended (where a catch-up reads on)."""

    def __init__(self, oxia: OxiaStore, layout: KeyLayout, blobs: BlobLookups) -> None:
        self._oxia = oxia
        self._layout = layout
        self._blobs = blobs
        self._windows = IndexWindows()
        self._spans = ParsedSpans()

    def span_of(self, tp: TopicPartition, record: Record) -> Span | None:
        """The span of one index record (None: not an entry of ``tp``)."""
        return self._spans.span(self._layout, tp, record.key, record.value,
                                record.version_id)

    async def cursor(self, tp: TopicPartition) -> int:
        """The compaction cursor: WAL entries ending below it are strays."""
        record = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        return 1 if record is None else CompactionCursor.from_json(record.value).offset

    async def page(self, tp: TopicPartition, start: int, limit: int,
                   stop: int | None) -> list[Record]:
        """Up to ``limit`` entries with keys from ``index/{start}`` below ``index/{stop}``
        (None: to the end of the index). Oxia streams the whole range whatever the
        limit, so the range is what bounds a scan (app/storage/index_windows.py)."""
        end = self._layout.index_scan_end(tp) if stop is None else \
            self._layout.index(tp, stop)
        return await self._oxia.range_scan(self._layout.index(tp, start), end,
                                           tp.partition_key, limit=limit)

    def window_end(self, tp: TopicPartition, start: int, limit: int,
                   hw: int | None = None) -> int | None:
        """Where a scan for ``limit`` entries from ``start`` stops: about that many
        entries on, or the end of the index once that is beyond ``hw``."""
        stop = start + self._windows.span(tp, limit)
        return None if hw is not None and stop > hw else stop

    async def resolve(self, tp: TopicPartition, offset: int, control: Control,
                      budget: int | None, max_records: int | None, stray_floor: int,
                      first_page: list[Record] | None = None,
                      room: More | None = None) -> list[Span]:
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
        limit = budget if budget is not None else UNLIMITED

        def want_more() -> bool:
            return nxt <= hw and cost < limit and (
                max_records is None or nxt - offset < max_records)

        async def more() -> bool:
            return not spans or room is None or await room()

        if pending is None or not pending.covers(nxt):
            async for span in self.spans_from(tp, offset, hw, first_page, more):
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

    async def spans_from(self, tp: TopicPartition, offset: int, hw: int,
                         first_page: list[Record] | None = None,
                         more: More | None = None) -> AsyncIterator[Span]:
        """The partition's index entries from key ``index/{offset}`` on, in pages, each
        scan over a window of offsets (:meth:`window_end`) until one reaches beyond the
        high watermark ``hw`` and ends the index.

        ``first_page``, read from ``offset`` beside the control record, may be older
        than it: when it falls short, the scan goes on from where it ended (the caller
        stops once it reaches the high watermark). ``more`` is asked before each page
        after the first: it ends the walk when it says no."""
        start, limit = offset, FIRST_PAGE
        first = True
        while True:
            if not first and more is not None and not await more():
                return
            first = False
            prefetched = first_page is not None
            stop = None if prefetched else self.window_end(tp, start, limit, hw)
            records = first_page if first_page is not None else \
                await self.page(tp, start, limit, stop)
            first_page = None
            spans = [span for record in records
                     if (span := self.span_of(tp, record)) is not None]
            if not isinstance(records, Remembered):  # a scan: what a window holds
                self._windows.learn(tp, spans)
            for span in spans:
                yield span
                start = span.end + 1
            if len(records) >= limit and spans:
                limit = PAGE
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
