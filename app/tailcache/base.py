"""The tail cache contract shared by the in-memory and the file-backed implementations.

The tail cache is *opportunistic*: it holds recent records of partitions that this
process (or another worker of this host) wrote itself, so that consumers reading at the
hot tail are answered without Oxia or S3 round trips. Any doubt is a miss -- ``None`` --
and the caller falls back to the real :class:`~app.storage.reader.LogReader`. The one
hard rule is that an answer is never *wrong*: every returned record is exactly the record
committed at that offset, and offsets are contiguous from the requested one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload, payload_size


@dataclass(frozen=True)
class CacheHit:
    """An answer from the cache.

    ``records`` holds contiguous ``(offset, value)`` pairs starting at the requested
    offset. It is empty only for "known empty at the cached tail": the requested offset
    is ``high_watermark + 1``, so there is nothing to read yet (as far as this cache
    knows; a caller that learned of a remote write must not trust it).
    """

    records: Sequence[tuple[int, Payload]]  # RunRecords from the memory cache
    high_watermark: int
    next_offset: int
    # In step with ``records``; left out of equality (tests compare records).
    append_times: list[int] = field(default_factory=list, compare=False)
    # The log start as far as this cache knows (the highest it was told): the answer's
    # log_start_offset, which may trail a move this process has not read yet. Every
    # cache gives it; left out of equality as the append times are.
    log_start: int = field(default=1, compare=False)


@dataclass(frozen=True)
class TailCacheStats:
    """A snapshot of the counters, for metrics and tests.

    ``partitions``, ``segments`` and ``records`` describe what is cached: partitions
    holding records, the stored pieces (a segment per put for the file cache, a chunk
    for the memory cache) and the records in them. For the file cache they count this
    process's index of the shared directory, which is bounded and never holds entries
    whose files it found gone; ``bytes`` is its estimate of the whole directory (exact
    after each full scan). ``hits`` counts answers (including "known empty"),
    ``misses`` counts ``None``, and ``evictions`` counts records dropped to stay within
    the byte budget.
    """

    partitions: int
    segments: int
    records: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    # A worker's writes to a shared directory wait in a bounded queue (app/tailcache/
    # shared.py): how many wait, and how many were dropped because it was full.
    pending_writes: int = 0
    dropped_writes: int = 0


class TailCache(Protocol):
    """Recent committed records per partition; see the module docstring."""

    # Whether lookups, and puts and notes, do blocking I/O (the caller then runs them
    # in a worker thread: app.tailcache.run_cache_read / run_cache_write).
    reads_block: bool
    writes_block: bool

    def put(self, tp: TopicPartition, start_offset: int, records: Sequence[Payload],
            append_time_ms: int = 0) -> None:
        """Records committed at ``start_offset .. start_offset + len(records) - 1``, at
        ``append_time_ms``.

        Raises the known high watermark to the last of them. Never fails the caller for
        a cache problem: the write is already acknowledged.
        """
        ...

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        """Raise the known high watermark without records (a write seen elsewhere)."""
        ...

    def note_log_start(self, tp: TopicPartition, log_start: int) -> None:
        """The log starts at ``log_start`` (retention, a truncation or a deleted topic
        moved it): no offset below it is answered from now on, and records below it
        go. Every read of the log tells the cache its log start before the partition is
        trusted again (app/broker/consume.py), as it tells it the high watermark."""
        ...

    def get(
        self,
        tp: TopicPartition,
        offset: int,
        max_records: int | None,
        max_bytes: int | None,
    ) -> CacheHit | None:
        """Records from ``offset`` while contiguous in the cache, within the budgets.

        The first record is returned even if it alone exceeds ``max_bytes`` (so no
        consumer is ever stuck). ``offset == high_watermark + 1`` answers
        ``CacheHit([], hw, offset)``. ``None`` whenever the cache cannot answer: the
        offset is not cached (evicted, gap, unknown partition), ``offset < 1`` or
        ``max_records < 1``.
        """
        ...

    def high_watermark(self, tp: TopicPartition) -> int | None:
        """The highest offset the cache knows is committed, or None if it knows none."""
        ...

    def statistics(self) -> TailCacheStats: ...

    def drop(self, tp: TopicPartition) -> None:
        """Forget every record of ``tp`` (its log start moved past them: a topic was
        deleted or trimmed by this process)."""
        ...

    def close(self) -> None:
        """Release resources; afterwards puts are ignored and gets miss."""
        ...


@dataclass
class Counters:
    """The answer and eviction counters both implementations keep."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def count(self, hit: CacheHit | None) -> CacheHit | None:
        """Count ``hit`` as a hit or (None) a miss, and pass it on."""
        if hit is None:
            self.misses += 1
        else:
            self.hits += 1
        return hit

    def stats(self, *, partitions: int, segments: int, records: int,
              nbytes: int) -> TailCacheStats:
        return TailCacheStats(partitions=partitions, segments=segments, records=records,
                              bytes=nbytes, hits=self.hits, misses=self.misses,
                              evictions=self.evictions)


def within_budget(count: int, size: int, value_len: int,
                  max_records: int | None, max_bytes: int | None) -> bool:
    """May one more record of ``value_len`` bytes join ``count`` records of ``size`` bytes?

    The same rule as :meth:`LogReader.read`: the first record always goes, so a record
    larger than the byte budget cannot block a consumer forever.
    """
    if count == 0:
        return True
    if max_records is not None and count >= max_records:
        return False
    return max_bytes is None or size + value_len <= max_bytes


def suffix_within(records: Sequence[Payload], budget: int, overhead_per_record: int = 0,
                  fixed_overhead: int = 0) -> int:
    """Index of the first record of the longest suffix that fits in ``budget`` bytes.

    A put larger than the whole cache keeps its newest records: the tail is what
    consumers want, and a suffix of a committed range is itself a valid contiguous range.
    Returns ``len(records)`` when not even the last record fits.
    """
    total = fixed_overhead
    i = len(records)
    if isinstance(records, RecordBatch) and (
            total + records.size + overhead_per_record * i <= budget):
        return 0  # all of it fits: no need to look at each record
    while i > 0:
        cost = payload_size(records[i - 1]) + overhead_per_record
        if total + cost > budget:
            break
        total += cost
        i -= 1
    return i
