"""Tail cache in a directory shared by the worker processes of one host.

Layout (app/tailcache/segment_files.py):
``{directory}/{store_id}/v1/{topic}/{partition}/`` holds immutable segment files named
``{start:020d}-{end:020d}.seg`` (one per put) and a ``hw`` file; temporary files start
with ``.tmp-``. Topic names are ``[A-Za-z0-9._-]`` and never ``.``/``..``, so they are
safe path components as they are (and every file also names its topic-partition inside,
see :mod:`app.tailcache.segment`).

The store id names the store (the Oxia and S3 data) whose records the files hold. An
offset means something only within one store: after the store is reset, or with two
deployments on one host, the same topic-partition and offset name other records. Each
store therefore has its own subtree, and a cache never reads, counts or evicts another
store's files. Store ids are ``[A-Za-z0-9._-]``, 1 to 128 characters, never ``.``/``..``;
:func:`store_id_of` derives one from any strings that name a store.

Why this is safe with several writers and readers and no locks:

* A file is written whole under a unique temporary name in the same directory and then
  ``os.replace``-d into place (atomic on POSIX), so nobody ever opens a half-written
  file under a final name. The rename is not fsynced: after a machine crash a file may be
  torn, which the CRC catches.
* Segments are immutable and self-verifying: readers check magic, version,
  topic-partition, offsets (against the name) and the CRC, and treat any failure or a
  vanished file (evicted by another process) as a miss.
* A record is only returned from a verified segment, and segments are only written from
  acknowledged records, so any record returned is the committed one.
* The high watermark only ever goes up in intent (read, compare, replace), but two racing
  writers can lose an update and leave it *lower* than it was. That is harmless: the hw
  is used for two things only. (1) ``known empty`` is answered only for ``offset == hw +
  1`` and only when no segment is indexed at that offset; with a stale lower hw the
  offset asked for is at most the true hw + 1, so the answer is either right or "wait for
  records that already exist" -- a delayed answer (the caller's watch wakes it, or it
  falls back), never a wrong record. (2) The hw reported with records is at least the
  last returned offset; a lower value only makes a consumer think it is nearer the tail.
  The next put or note raises it again.

Budget (app/tailcache/segment_budget.py): the segment bytes of the store's subtree are
kept near ``max_bytes``. Each process counts what it wrote since its last full scan;
when that estimate passes the budget it deletes the oldest segments it wrote itself (it
remembers them, so nothing is listed) until the estimate is at most 3/4 of the budget.
When that is not enough (the other processes' files) or the last full scan is older than
:data:`FULL_SCAN_INTERVAL_NS`, it lists every partition of its store and deletes the
oldest segments of anyone (by mtime, then start offset) down to 3/4 of the budget. With
N writing processes the total can overshoot by up to about N x max_bytes/4 between
scans; a single process stays within ``max_bytes``. (Listing thousands of segment files
at every quarter of the budget cost more CPU than writing them.)

Index (app/tailcache/partition_index.py): each process keeps a bounded in-memory index
of what it has seen of the store's subtree, for the partitions it used most recently
(``max_partitions``), each with its newest :data:`MAX_SEGMENTS_PER_PARTITION` segments.
Files vanish under it as other processes evict or supersede them; an entry is forgotten
when a read finds its file gone and at every full scan, so beyond what is on disk the
index holds at most the segments this process wrote since its last scan.

All calls do blocking file I/O on small files; put the directory on a tmpfs
(e.g. ``/dev/shm``) to keep it to memory copies.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from app.storage import columnar
from app.storage.batch import RecordBatch, partition_body, records_size
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload, payload_size
from app.tailcache.base import (
    CacheHit,
    Counters,
    TailCacheStats,
    suffix_within,
    within_budget,
)
from app.tailcache.partition_index import (
    MAX_SEGMENTS_PER_PARTITION,
    PartitionIndex,
    PartitionIndexes,
)
from app.tailcache.segment import (
    decode_high_watermark,
    decode_segment,
    encode_high_watermark,
    segment_name,
    segment_overhead,
    segment_parts,
)
from app.tailcache.segment_budget import MAX_WRITTEN_REMEMBERED, SegmentBudget
from app.tailcache.segment_files import (
    STALE_TMP_NS,
    TMP_PREFIX,
    FoundSegment,
    list_segment_files,
    partition_dir,
    read_file,
    write_atomic,
)

__all__ = [
    "FORMAT_DIR",
    "FULL_SCAN_INTERVAL_NS",
    "HW_FILE",
    "MAX_SEGMENTS_PER_PARTITION",
    "MAX_WRITTEN_REMEMBERED",
    "STALE_TMP_NS",
    "TMP_PREFIX",
    "FileTailCache",
    "PendingPut",
    "check_store_id",
    "store_id_of",
]

log = logging.getLogger(__name__)

FORMAT_DIR = "v1"
_STORE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
HW_FILE = "hw"
# A process evicts the segments it wrote itself, oldest first, without listing the
# directory; it lists everything (other processes' files, stale temporary files) when
# that does not bring the directory within budget, or at most this often otherwise.
FULL_SCAN_INTERVAL_NS = 30 * 1_000_000_000
_HW_ATTEMPTS = 3


def _coalesced(puts: Sequence[PendingPut]) -> list[PendingPut]:
    """``puts`` with each run of contiguous puts of one partition and one append time
    joined into one (one segment file instead of one per request: a file costs far more
    than the bytes in it). Bodies are joined as the writer joins a flush's slices."""
    out: list[PendingPut] = []
    run: list[PendingPut] = []

    def close_run() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            parts, encoding, count = partition_body([p.records for p in run],
                                                    columnar.ENCODING_V3)
            body = b"".join(parts)
            size = sum(records_size(p.records) for p in run)
            first = run[0]
            out.append(first._replace(records=RecordBatch(body, encoding, count, size),
                                      nbytes=size))
        run.clear()

    by_partition: dict[TopicPartition, list[PendingPut]] = {}
    for put in puts:
        if put.records:
            by_partition.setdefault(put.tp, []).append(put)
    for partition_puts in by_partition.values():
        for put in partition_puts:
            if run and not (put.append_time_ms == run[-1].append_time_ms and
                            put.start_offset == run[-1].start_offset + len(run[-1].records)):
                close_run()
            run.append(put)
        close_run()
    return out


def check_store_id(store_id: str) -> str:
    """``store_id`` if it is a valid store id (see the module docstring), else ValueError."""
    if not _STORE_ID.fullmatch(store_id) or store_id in (".", ".."):
        raise ValueError(f"a tail cache store id is 1 to 128 characters of [A-Za-z0-9._-] "
                         f"and not . or .., got {store_id!r}")
    return store_id


def store_id_of(*names: str) -> str:
    """A store id naming the store that ``names`` (bucket, prefix, ...) identify."""
    digest = hashlib.sha256("\0".join(names).encode()).hexdigest()
    return f"s-{digest[:32]}"


class PendingPut(NamedTuple):
    """Committed records to store: ``records`` at ``start_offset`` onwards."""

    tp: TopicPartition
    start_offset: int
    records: Sequence[Payload]
    append_time_ms: int = 0
    nbytes: int = 0  # their size, for a queue that bounds what waits


class FileTailCache:
    """See the module docstring. Safe to share one directory between processes.

    Only the files of ``store_id`` are seen. At most ``max_partitions`` partitions are
    indexed at once; the least recently used index goes first (its files stay, and are
    listed again when the partition is used).
    """

    reads_block = True
    writes_block = True

    def __init__(self, directory: Path, max_bytes: int, *, store_id: str,
                 max_partitions: int = 10_000) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {max_partitions}")
        self._root = Path(directory) / check_store_id(store_id) / FORMAT_DIR
        self._root.mkdir(parents=True, exist_ok=True)
        self._root_str = str(self._root)
        self._max_bytes = max_bytes
        self._lock = threading.RLock()
        self._index = PartitionIndexes(self._root_str, max_partitions)
        self._budget = SegmentBudget(max_bytes, FULL_SCAN_INTERVAL_NS)
        self._counters = Counters()
        self._closed = False
        self._warned = False
        self._scan_and_evict(protect=None)

    # -- files (app/tailcache/segment_files.py) -------------------------------------------

    def _dir(self, tp: TopicPartition) -> str:
        return partition_dir(self._root_str, tp)

    def _write_atomic(self, directory: str, name: str,
                      data: bytes | Sequence[bytes | memoryview]) -> None:
        """Every file this cache writes, written whole (:func:`write_atomic`)."""
        write_atomic(directory, name, data)

    def _list_segments(self) -> list[FoundSegment]:
        """Every segment file of the store's subtree (a full scan)."""
        return list_segment_files(self._root)

    # -- high watermark -------------------------------------------------------------------

    def _load_hw(self, tp: TopicPartition, idx: PartitionIndex) -> int | None:
        data = read_file(f"{self._dir(tp)}/{HW_FILE}")
        stored = None if data is None else decode_high_watermark(data, tp)
        if stored is not None:
            idx.raise_hw(stored)
        return idx.high_watermark

    def _raise_hw(self, tp: TopicPartition, idx: PartitionIndex, high_watermark: int) -> None:
        """Raise the shared hw file to ``high_watermark`` (read, compare, replace).

        Re-reads after replacing and tries again if a racing writer put a lower value
        over ours; a race can still lose, which the module docstring shows is harmless.
        """
        if not idx.raise_hw(high_watermark):
            return  # this process already knows (and wrote or read) something as high
        directory = self._dir(tp)
        for _ in range(_HW_ATTEMPTS):
            data = read_file(f"{directory}/{HW_FILE}")
            stored = None if data is None else decode_high_watermark(data, tp)
            if stored is not None and stored >= high_watermark:
                idx.raise_hw(stored)
                return
            self._write_atomic(directory, HW_FILE, encode_high_watermark(tp, high_watermark))

    # -- writes ---------------------------------------------------------------------------

    def put(self, tp: TopicPartition, start_offset: int, records: Sequence[Payload],
            append_time_ms: int = 0) -> None:
        if start_offset < 1:
            raise ValueError(f"{tp}: offsets start at 1, got {start_offset}")
        if records:
            self.put_many([PendingPut(tp, start_offset, records, append_time_ms)], {})

    def put_many(self, puts: Sequence[PendingPut], notes: Mapping[TopicPartition, int]
                 ) -> None:
        """Several puts and high watermarks at once: each partition's hw file is
        raised once, to the highest of them (a put per request would rewrite it per
        request)."""
        highest = dict(notes)
        with self._lock:
            if self._closed:
                return
            for put in _coalesced(puts):
                if not put.records:
                    continue
                end = put.start_offset + len(put.records) - 1
                highest[put.tp] = max(highest.get(put.tp, -1), end)
                try:
                    self._put_records(put, end)
                except OSError as exc:
                    self._warn("put", put.tp, exc)
            for tp, high_watermark in highest.items():
                try:
                    self._raise_hw(tp, self._index(tp), high_watermark)
                except OSError as exc:
                    self._warn("put", tp, exc)

    def _put_records(self, put: PendingPut, end: int) -> None:
        tp, start_offset, records = put.tp, put.start_offset, put.records
        idx = self._index(tp)
        first = suffix_within(records, self._max_bytes, 4, segment_overhead(tp))
        kept = (start_offset + first, end) if first < len(records) else None
        if kept is not None:
            self._write_segment(tp, idx, kept, records[first:] if first else records,
                                put.append_time_ms)
        self._drop_overlapping(tp, idx, start_offset, end, keep=kept)

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        if high_watermark < 0:
            raise ValueError(f"{tp}: high watermark must be >= 0, got {high_watermark}")
        with self._lock:
            if self._closed:
                return
            idx = self._index.held(tp)
            if idx is not None and idx.high_watermark is not None and (
                    high_watermark <= idx.high_watermark):
                return
            try:
                self._raise_hw(tp, self._index(tp), high_watermark)
            except OSError as exc:
                self._warn("note_high_watermark", tp, exc)

    def note_log_start(self, tp: TopicPartition, log_start: int) -> None:
        with self._lock:
            if not self._closed:
                idx = self._index(tp)
                idx.log_start = max(idx.log_start, log_start)

    def _write_segment(self, tp: TopicPartition, idx: PartitionIndex, seg: tuple[int, int],
                       records: Sequence[Payload], append_time_ms: int) -> None:
        parts = segment_parts(tp, seg[0], records, append_time_ms)
        size = sum(len(part) for part in parts)
        name = segment_name(*seg)
        directory = self._dir(tp)
        path = f"{directory}/{name}"
        self._write_atomic(directory, name, parts)
        idx.add(seg)
        self._budget.wrote(path, tp, seg, size)
        if self._budget.over:
            self._evict_for(protect=path)

    def _evict_for(self, protect: str) -> None:
        """Back within the budget: first by deleting this process's own oldest
        segments, which it remembers, without listing anything; with a full scan when
        that is not enough (other processes' files) or the last one is old."""
        if not self._budget.scan_due:
            kept = 0
            for old in self._budget.own_oldest():
                try:
                    os.unlink(old.path)
                except FileNotFoundError:
                    pass  # gone already: superseded or evicted by another
                except OSError as exc:
                    # Still on disk, yet off the estimate already: only a full scan
                    # (below) makes the estimate true again.
                    log.warning("tail cache: could not delete %s: %s", old.path, exc)
                    kept += 1
                    continue
                self._counters.evictions += old.seg[1] - old.seg[0] + 1
                idx = self._index.held(old.tp)
                if idx is not None:
                    idx.discard(old.seg)
            if not self._budget.over and not kept:
                return
        self._scan_and_evict(protect=protect)


    def _drop_overlapping(self, tp: TopicPartition, idx: PartitionIndex, start: int, end: int,
                          keep: tuple[int, int] | None) -> None:
        """Delete the indexed segments sharing an offset with a put of ``start..end``.

        They hold the same committed records -- or, if the log was recreated, records
        that are no longer true; either way the put supersedes them. The whole put
        range counts even when only its newest records were kept.
        """
        directory = self._dir(tp)
        for seg in idx.overlapping(start, end):
            if seg != keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{directory}/{segment_name(*seg)}")
                idx.discard(seg)

    def _scan_and_evict(self, protect: str | None) -> None:
        """List the whole directory, delete the oldest segments down to 3/4 of the
        budget (never ``protect``, the segment just written) and stale temporary files,
        and forget indexed segments whose files are gone (another process evicted or
        superseded them)."""
        found = self._list_segments()
        total = sum(f.size for f in found)
        found.sort(key=lambda f: (f.mtime_ns, f.seg[0]))
        present: dict[TopicPartition | None, set[tuple[int, int]]] = {}
        for f in found:
            if total > self._budget.target and f.path != protect and self._evict(f):
                total -= f.size
            else:
                present.setdefault(f.tp, set()).add(f.seg)
        for tp, idx in self._index.items():
            idx.keep_only(present.get(tp, set()))
        self._budget.scanned(total, present)

    def _evict(self, f: FoundSegment) -> bool:
        """Delete one segment file; False if it could not be deleted."""
        try:
            os.unlink(f.path)
        except FileNotFoundError:
            pass  # another process evicted it first
        except OSError:
            return False
        self._counters.evictions += f.seg[1] - f.seg[0] + 1
        return True

    def _warn(self, what: str, tp: TopicPartition, exc: OSError) -> None:
        # The cache is optional: a failing disk must not fail produce or consume.
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "tail cache %s for %s failed (ignored): %s", what, tp, exc)

    # -- reads ----------------------------------------------------------------------------

    def get(self, tp: TopicPartition, offset: int, max_records: int | None,
            max_bytes: int | None) -> CacheHit | None:
        with self._lock:
            try:
                hit = self._lookup(tp, offset, max_records, max_bytes)
            except OSError:
                hit = None
            return self._counters.count(hit)

    def _lookup(self, tp: TopicPartition, offset: int, max_records: int | None,
                max_bytes: int | None) -> CacheHit | None:
        if self._closed or offset < 1 or (max_records is not None and max_records < 1):
            return None
        idx = self._index(tp)
        if offset < idx.log_start:
            return None
        seg = idx.find(offset)
        relisted = False
        if seg is None:
            hw = self._fresh_hw(tp, idx, offset)
            if hw is None or offset > hw + 1:
                return None
            if offset == hw + 1:
                return CacheHit([], hw, offset, log_start=idx.log_start)
            relisted = True
            seg = idx.find(offset) if self._index.relist_if_changed(tp, idx, offset) else None
        out: list[tuple[int, Payload]] = []
        times: list[int] = []
        size = 0
        at = offset
        while seg is not None:
            found = self._read_segment(tp, idx, seg)
            if found is None:
                break
            values, appended = found
            start, end = seg
            for j in range(at - start, len(values)):
                value = values[j]
                value_size = payload_size(value)
                if not within_budget(len(out), size, value_size, max_records, max_bytes):
                    return self._hit(tp, idx, out, at, times)
                out.append((at, value))
                times.append(appended)
                size += value_size
                at += 1
            seg = idx.find(end + 1)
            if seg is None and not relisted:
                # The index ends here; another worker may have written what follows.
                relisted = True
                hw = self._fresh_hw(tp, idx, at)
                if hw is not None and at <= hw and self._index.relist_if_changed(tp, idx, at):
                    seg = idx.find(at)
        return self._hit(tp, idx, out, at, times) if out else None

    def _fresh_hw(self, tp: TopicPartition, idx: PartitionIndex, offset: int) -> int | None:
        """The hw, re-read from the shared file only if ``offset`` is beyond what this
        process knows (at the tail, where another worker may have moved it)."""
        hw = idx.high_watermark
        if hw is None or offset > hw:
            hw = self._load_hw(tp, idx)
        return hw

    def _hit(self, tp: TopicPartition, idx: PartitionIndex, out: list[tuple[int, Payload]],
             next_offset: int, times: list[int]) -> CacheHit:
        # Records another worker wrote can be newer than the hw this process knows.
        self._fresh_hw(tp, idx, next_offset - 1)
        idx.raise_hw(next_offset - 1)
        assert idx.high_watermark is not None
        return CacheHit(out, idx.high_watermark, next_offset, times, idx.log_start)

    def _read_segment(self, tp: TopicPartition, idx: PartitionIndex,
                      seg: tuple[int, int]) -> tuple[list[Payload], int] | None:
        path = f"{self._dir(tp)}/{segment_name(*seg)}"
        data = read_file(path)
        values = None if data is None else decode_segment(data, tp, *seg)
        if values is None:
            idx.discard(seg)
            if data is not None:
                # Complete files are never rewritten in place: this one is torn or
                # damaged for good. Remove it so that nobody pays for it again.
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return values

    def high_watermark(self, tp: TopicPartition) -> int | None:
        with self._lock:
            if self._closed:
                return None
            idx = self._index(tp)
            try:
                return self._load_hw(tp, idx)
            except OSError:
                return idx.high_watermark

    def statistics(self) -> TailCacheStats:
        with self._lock:
            indexes = [idx for _, idx in self._index.items()]
            return self._counters.stats(
                partitions=sum(1 for i in indexes if i.segments),
                segments=sum(len(i.segments) for i in indexes),
                records=sum(i.records() for i in indexes), nbytes=self._budget.estimate)

    def drop(self, tp: TopicPartition) -> None:
        with self._lock:
            self._index.forget(tp)
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir(tp))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._index.clear()
