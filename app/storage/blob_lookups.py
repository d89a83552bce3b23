"""What a reader remembers of a catch-up inside a compacted blob, so that its next
answers need no index scan and few control-record reads.

A consumer catching up through compacted data reads one blob (64 MiB by default) over
many answers, and each answer used to start with an index scan that found the same
entry, and a control-record read (a round trip the answer waited on: 15 ms on average in
a busy broker, docs/performance.md). Per partition, this keeps:

- the compacted entry the last walk of the index ended in. A compacted entry is
  immutable; retention that removes it moves the log start past its offsets (every read
  checks the control record's log start), and a read that meets a missing object forgets
  the entry and plans again from a fresh scan;
- the newest control record a lookup read, and when that lookup began. A read inside
  the remembered blob, below that record's high watermark, may take it while it is at
  most ``CONTROL_REUSE_S`` old: the same freshness a lookup made ahead of a read has
  (app/storage/plan_ahead.py allows one up to a second old), and never at the tail,
  where a long-poll must see new commits.

Bounded: ``max_partitions`` of each, least recently used out first (an entry costs its
stored bytes, about 2 KiB for a 64 MiB blob of 1 MiB chunks, and its parsed chunk table).
"""

from __future__ import annotations

from collections.abc import Callable

from cachetools import LRUCache

from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control
from app.storage.plan_ahead import MAX_AGE_S, Taken
from app.storage.spans import Span
from app.stores.oxia.store import Record

CONTROL_REUSE_S = MAX_AGE_S / 2  # half of what a lookup made ahead may be: 0.5 s


class Remembered(list[Record]):
    """A first page remembered rather than scanned: one large compacted entry says
    nothing of how many offsets the entries after it hold, so index windows
    (app/storage/index_windows.py) do not learn from it."""


class BlobLookups:
    def __init__(self, layout: KeyLayout, clock: Callable[[], float], *,
                 max_partitions: int = 1024) -> None:
        self._layout = layout
        self._clock = clock
        self._entries: LRUCache[TopicPartition, Span] = LRUCache(max_partitions)
        self._controls: LRUCache[TopicPartition, tuple[float, Control]] = LRUCache(
            max_partitions)

    def ended_in(self, tp: TopicPartition, span: Span) -> None:
        """A walk of ``tp``'s index ended in ``span`` (kept if a compacted entry as read)."""
        if not span.is_wal and span.raw is not None and span.version is not None:
            self._entries[tp] = span

    def forget(self, tp: TopicPartition) -> None:
        """A read of ``tp`` met a missing object or a gap: scan its index again."""
        self._entries.pop(tp, None)

    def seen(self, tp: TopicPartition, started: float, control: Control | None
             ) -> Control | None:
        """Note ``control``, read by a lookup that began at ``started``; returns it."""
        if control is not None:
            kept = self._controls.get(tp)
            if kept is None or kept[0] <= started:
                self._controls[tp] = (started, control)
        return control

    def covering(self, tp: TopicPartition, offset: int) -> Remembered | None:
        """The remembered compacted entry of ``tp``, as a first page, if it covers
        ``offset``."""
        span = self._entries.get(tp)
        if span is None or not span.covers(offset):
            return None
        assert span.raw is not None and span.version is not None  # as ended_in keeps them
        return Remembered([Record(self._layout.index(tp, span.end), span.raw, span.version)])

    def in_blob(self, tp: TopicPartition, offset: int, max_age: float = CONTROL_REUSE_S
                ) -> Taken | None:
        """A lookup for a read of ``tp`` at ``offset`` that needs no Oxia: the
        remembered entry covers it and the newest control record, at most ``max_age``
        old, shows records there."""
        kept = self._controls.get(tp)
        if kept is None or self._clock() - kept[0] > max_age:
            return None
        started, control = kept
        if control.sequence_counter < offset or offset < control.log_start:
            return None
        page = self.covering(tp, offset)
        return None if page is None else Taken((control, page), started)
