"""In-process tail cache: the default when no shared directory is configured."""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import count

from app.storage.batch import RecordBatch, records_size
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.storage.runs import Run, RunRecords, take
from app.tailcache.base import (
    CacheHit,
    Counters,
    TailCacheStats,
    suffix_within,
)


@dataclass
class _Chunk:
    """The records of one put (or the part of it that was kept)."""

    key: int  # global age: chunks with smaller keys were cached earlier
    start: int
    records: Sequence[Payload]  # a RecordBatch stays encoded until read
    nbytes: int
    append_time_ms: int = 0

    @property
    def end(self) -> int:
        """One past the last offset."""
        return self.start + len(self.records)


@dataclass
class _Partition:
    """Invariant: ``chunks`` are sorted and *contiguous* (each starts where the previous
    ends). Keeping one gap-free run per partition is what makes an answer safe: nothing
    is ever stitched together across offsets we did not see."""

    chunks: list[_Chunk] = field(default_factory=list)
    high_watermark: int | None = None
    log_start: int = 1  # no offset below it is answered (kept with the partition)

    @property
    def start(self) -> int:
        return self.chunks[0].start

    @property
    def end(self) -> int:
        return self.chunks[-1].end

    def find(self, offset: int) -> int | None:
        """Index of the chunk holding ``offset``, if any."""
        i = bisect.bisect_right(self.chunks, offset, key=lambda c: c.start) - 1
        if i >= 0 and offset < self.chunks[i].end:
            return i
        return None

    def value_at(self, offset: int) -> Payload:
        i = self.find(offset)
        assert i is not None
        chunk = self.chunks[i]
        return chunk.records[offset - chunk.start]


class MemoryTailCache:
    """Bounded by the total bytes of cached records, evicting the oldest puts globally.

    Every put becomes a chunk with a global age; when the total exceeds ``max_bytes``
    the oldest chunk goes, together with anything before it in its partition (so the
    remaining run stays contiguous). Calls normally come from the event loop thread only;
    a lock keeps the structure consistent if that ever changes.

    ``store_id`` is accepted for the same signature as :class:`FileTailCache` and
    ignored: the cache lives and dies with one process, which serves one store.
    """

    reads_block = False
    writes_block = False

    def __init__(self, max_bytes: int, *, store_id: str | None = None) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._age: OrderedDict[int, TopicPartition] = OrderedDict()  # chunk key -> tp
        self._keys = count()
        self._bytes = 0
        self._records = 0
        self._counters = Counters()
        self._closed = False

    # -- writes ------------------------------------------------------------------------

    def put(self, tp: TopicPartition, start_offset: int, records: Sequence[Payload],
            append_time_ms: int = 0) -> None:
        if start_offset < 1:
            raise ValueError(f"{tp}: offsets start at 1, got {start_offset}")
        if not records:
            return
        with self._lock:
            if self._closed:
                return
            part = self._partitions.setdefault(tp, _Partition())
            self._raise_hw(part, start_offset + len(records) - 1)
            # Own the bytes: a caller's bytearray or memoryview could change under us
            # (a batch is kept encoded: its records are decoded when first read).
            owned: Sequence[Payload] = (
                records.detached() if isinstance(records, RecordBatch) else
                [r if type(r) is bytes or isinstance(r, LogRecord) else bytes(r)
                 for r in records])
            self._merge(tp, part, start_offset, owned, append_time_ms)
            self._evict()

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        if high_watermark < 0:
            raise ValueError(f"{tp}: high watermark must be >= 0, got {high_watermark}")
        with self._lock:
            if not self._closed:
                self._raise_hw(self._partitions.setdefault(tp, _Partition()), high_watermark)

    def note_log_start(self, tp: TopicPartition, log_start: int) -> None:
        with self._lock:
            if self._closed:
                return
            part = self._partitions.setdefault(tp, _Partition())
            if log_start <= part.log_start:
                return
            part.log_start = log_start
            # Whole chunks below it go (the run stays contiguous: they are its front).
            gone = 0
            while gone < len(part.chunks) and part.chunks[gone].end <= log_start:
                chunk = part.chunks[gone]
                self._forget(chunk)
                del self._age[chunk.key]
                gone += 1
            del part.chunks[:gone]

    def log_start(self, tp: TopicPartition) -> int:
        with self._lock:
            part = self._partitions.get(tp)
            return 1 if part is None else part.log_start

    @staticmethod
    def _raise_hw(part: _Partition, high_watermark: int) -> None:
        if part.high_watermark is None or high_watermark > part.high_watermark:
            part.high_watermark = high_watermark

    def _merge(self, tp: TopicPartition, part: _Partition, start: int,
               records: Sequence[Payload], append_time_ms: int) -> None:
        """Add a put to the partition keeping the contiguity invariant.

        A put that overlaps the cached run with different bytes means the cached run is
        not the log we are being told about (never happens unless the log was
        recreated): the older records go, whatever part of the put is kept. Then the
        kept part -- all of it, or its newest records when it alone exceeds the budget --
        joins the run if it touches or overlaps it (append, prepend, or nothing new) and
        replaces it if there is a gap: nothing is ever stitched across a gap.
        """
        end = start + len(records)
        if part.chunks:
            lo, hi = max(start, part.start), min(end, part.end)
            if any(part.value_at(o) != records[o - start] for o in range(lo, hi)):
                self._drop_all(part)
        first = start + suffix_within(records, self._max_bytes)
        if first == end:
            return  # not even the newest record fits; what is cached stays valid
        kept = records if first == start else list(records[first - start:])
        if not part.chunks:
            self._add(tp, part, first, kept, append_time_ms, at_front=False)
        elif first > part.end or end < part.start:
            self._drop_all(part)
            self._add(tp, part, first, kept, append_time_ms, at_front=False)
        else:  # touches or overlaps, and any overlap was checked equal above
            cur_start, cur_end = part.start, part.end
            if first < cur_start:
                self._add(tp, part, first, kept[: cur_start - first], append_time_ms,
                          at_front=True)
            if end > cur_end:
                at = max(first, cur_end)
                # The common case, a put right after the cached run, keeps a batch whole
                # (slicing one would decode it).
                self._add(tp, part, at, kept if at == first else kept[at - first:],
                          append_time_ms, at_front=False)

    def _add(self, tp: TopicPartition, part: _Partition, start: int,
             records: Sequence[Payload],
             append_time_ms: int, *, at_front: bool) -> None:
        chunk = _Chunk(next(self._keys), start, records, records_size(records),
                       append_time_ms)
        if at_front:
            part.chunks.insert(0, chunk)
        else:
            part.chunks.append(chunk)
        self._age[chunk.key] = tp
        self._bytes += chunk.nbytes
        self._records += len(records)

    def _drop_all(self, part: _Partition) -> None:
        for chunk in part.chunks:
            self._forget(chunk)
            del self._age[chunk.key]
        part.chunks.clear()

    def _forget(self, chunk: _Chunk) -> None:
        self._bytes -= chunk.nbytes
        self._records -= len(chunk.records)

    def _evict(self) -> None:
        while self._bytes > self._max_bytes and self._age:
            key, tp = self._age.popitem(last=False)
            part = self._partitions[tp]
            # Drop the oldest chunk and whatever precedes it: the rest stays one run.
            i = next(i for i, c in enumerate(part.chunks) if c.key == key)
            for chunk in part.chunks[: i + 1]:
                self._forget(chunk)
                self._counters.evictions += len(chunk.records)
                if chunk.key != key:
                    del self._age[chunk.key]
            del part.chunks[: i + 1]

    # -- reads -------------------------------------------------------------------------

    def get(self, tp: TopicPartition, offset: int, max_records: int | None,
            max_bytes: int | None) -> CacheHit | None:
        with self._lock:
            return self._counters.count(self._lookup(tp, offset, max_records, max_bytes))

    def _lookup(self, tp: TopicPartition, offset: int, max_records: int | None,
                max_bytes: int | None) -> CacheHit | None:
        part = self._partitions.get(tp)
        if (self._closed or part is None or part.high_watermark is None
                or offset < max(1, part.log_start)
                or (max_records is not None and max_records < 1)):
            return None
        hw = part.high_watermark
        i = part.find(offset)
        if i is None:
            # Records are only ever cached at offsets <= hw, so hw + 1 is never cached.
            return CacheHit([], hw, offset, log_start=part.log_start) if offset == hw + 1 else None
        runs: list[Run] = []
        size, taken, at = 0, 0, offset
        for chunk in part.chunks[i:]:
            run, used = take(chunk.records, at - chunk.start, at, chunk.append_time_ms,
                             budget=None if max_bytes is None else max_bytes - size,
                             max_records=None if max_records is None else max_records - taken,
                             may_exceed=taken == 0)
            runs.append(run)
            size, taken, at = size + used, taken + len(run), at + len(run)
            if run.stop < len(chunk.records):
                break  # a budget is spent
        records = RunRecords(runs, size)
        return CacheHit(records, hw, at, records.times(), part.log_start)

    def high_watermark(self, tp: TopicPartition) -> int | None:
        with self._lock:
            part = self._partitions.get(tp)
            return None if part is None else part.high_watermark

    def statistics(self) -> TailCacheStats:
        with self._lock:
            return self._counters.stats(
                partitions=sum(1 for p in self._partitions.values() if p.chunks),
                segments=len(self._age), records=self._records, nbytes=self._bytes)

    def drop(self, tp: TopicPartition) -> None:
        """Drop the partition's records; what it learned of the log (its start and high
        watermark) stays, so a late put of records a delete removed is never answered."""
        with self._lock:
            part = self._partitions.get(tp)
            if part is not None:
                self._drop_all(part)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._partitions.clear()
            self._age.clear()
            self._bytes = self._records = 0
