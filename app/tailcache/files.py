"""Tail cache in a directory shared by the worker processes of one host.

Layout: ``{directory}/{store_id}/v1/{topic}/{partition}/`` holds immutable segment files
named ``{start:020d}-{end:020d}.seg`` (one per put) and a ``hw`` file; temporary files
start with ``.tmp-``. Topic names are ``[A-Za-z0-9._-]`` and never ``.``/``..``, so they
are safe path components as they are (and every file also names its topic-partition
inside, see :mod:`app.tailcache.segment`).

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

Budget: the segment bytes of the store's subtree are kept near ``max_bytes``. Each
process counts what it wrote since its last full scan; when that estimate passes the
budget it lists every partition of its store and deletes the oldest segments (by mtime,
then start offset) until the total is at most 3/4 of the budget. With N writing processes
the total can overshoot by up to about N x max_bytes/4 between scans; a single process
stays within ``max_bytes``.

Index: each process keeps a bounded in-memory index of what it has seen of the store's
subtree, for the partitions it used most recently (``max_partitions``), each with its
newest :data:`MAX_SEGMENTS_PER_PARTITION` segments. Files vanish under it as other
processes evict or supersede them; an entry is forgotten when a read finds its file gone
and at every full scan, so beyond what is on disk the index holds at most the segments
this process wrote since its last scan.

All calls do blocking file I/O on small files; put the directory on a tmpfs
(e.g. ``/dev/shm``) to keep it to memory copies.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from app.errors import InvalidRequest
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload, payload_size
from app.tailcache.base import (
    CacheHit,
    Counters,
    TailCacheStats,
    suffix_within,
    within_budget,
)
from app.tailcache.segment import (
    decode_high_watermark,
    decode_segment,
    encode_high_watermark,
    encode_segment,
    parse_segment_name,
    segment_name,
    segment_overhead,
)

log = logging.getLogger(__name__)

FORMAT_DIR = "v1"
_STORE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
HW_FILE = "hw"
TMP_PREFIX = ".tmp-"
# A listing that started this long after the directory's last change surely saw it
# (directory mtimes come from a coarse clock, so a listing in the same tick may not have).
SETTLED_NS = 1_000_000_000
# A miss below everything indexed re-lists at most this often: new segments appear at the
# tail, so the offset was most likely evicted, and listing on every request would be waste.
RELIST_BELOW_INTERVAL_NS = 1_000_000_000
# Temporary files older than this belong to a crashed writer.
STALE_TMP_NS = 600 * 1_000_000_000
# Index entries kept per partition: the newest ones, since consumers read at the tail. A
# segment left out of the index is still on disk and counted by the budget; reading it is
# a miss, which the cache may always answer.
MAX_SEGMENTS_PER_PARTITION = 1024
_HW_ATTEMPTS = 3
_MAX_BACKTRACK = 8  # overlapping segments are rare: look back this far for a covering one


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


@dataclass
class _Index:
    """What this process knows of one partition directory (a cache of a listing)."""

    segments: list[tuple[int, int]] = field(default_factory=list)  # (start, end) sorted
    high_watermark: int | None = None
    listed_mtime_ns: int | None = None
    listed_at_ns: int = 0

    def find(self, offset: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self.segments, (offset, float("inf"))) - 1
        for j in range(i, max(i - _MAX_BACKTRACK, -1), -1):
            start, end = self.segments[j]
            if start <= offset <= end:
                return start, end
        return None

    def add(self, seg: tuple[int, int]) -> None:
        i = bisect.bisect_left(self.segments, seg)
        if i == len(self.segments) or self.segments[i] != seg:
            self.segments.insert(i, seg)
            if len(self.segments) > MAX_SEGMENTS_PER_PARTITION:
                del self.segments[0]

    def replace(self, segments: list[tuple[int, int]]) -> None:
        """Index exactly the newest of ``segments`` (sorted)."""
        self.segments = segments[-MAX_SEGMENTS_PER_PARTITION:]

    def discard(self, seg: tuple[int, int]) -> None:
        with contextlib.suppress(ValueError):
            self.segments.remove(seg)

    def keep_only(self, present: set[tuple[int, int]]) -> None:
        """Forget the segments whose files are not in ``present``."""
        self.segments = [seg for seg in self.segments if seg in present]

    def records(self) -> int:
        return sum(end - start + 1 for start, end in self.segments)

    def overlapping(self, start: int, end: int) -> list[tuple[int, int]]:
        """Indexed segments sharing an offset with ``start..end`` (a bounded search)."""
        out: list[tuple[int, int]] = []
        misses = 0
        j = bisect.bisect_right(self.segments, (end, float("inf"))) - 1
        while j >= 0 and misses <= _MAX_BACKTRACK:
            seg = self.segments[j]
            if seg[1] >= start:
                out.append(seg)
            else:
                misses += 1
            j -= 1
        return out

    def raise_hw(self, high_watermark: int) -> bool:
        if self.high_watermark is None or high_watermark > self.high_watermark:
            self.high_watermark = high_watermark
            return True
        return False


class _Found(NamedTuple):
    """A segment file seen by a full scan."""

    mtime_ns: int
    path: Path
    tp: TopicPartition | None  # None: a directory whose name is no topic-partition
    seg: tuple[int, int]
    size: int


class FileTailCache:
    """See the module docstring. Safe to share one directory between processes.

    Only the files of ``store_id`` are seen. At most ``max_partitions`` partitions are
    indexed at once; the least recently used index goes first (its files stay, and are
    listed again when the partition is used).
    """

    def __init__(self, directory: Path, max_bytes: int, *, store_id: str,
                 max_partitions: int = 10_000) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if max_partitions < 1:
            raise ValueError(f"max_partitions must be >= 1, got {max_partitions}")
        self._root = Path(directory) / check_store_id(store_id) / FORMAT_DIR
        self._root.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        self._max_partitions = max_partitions
        self._lock = threading.RLock()
        # Least recently used first.
        self._indexes: OrderedDict[TopicPartition, _Index] = OrderedDict()
        self._counters = Counters()
        self._closed = False
        self._warned = False
        self._estimate = 0
        self._scan_and_evict(protect=None)

    # -- paths and small files -------------------------------------------------------------

    def _dir(self, tp: TopicPartition) -> Path:
        return self._root / tp.topic / str(tp.partition)

    def _write_atomic(self, directory: Path, name: str, data: bytes) -> None:
        """Write ``data`` as ``directory/name`` so that nobody sees a partial file."""
        tmp = directory / f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:  # vanished (evicted), unreadable, a directory...: a miss
            return None

    # -- index ----------------------------------------------------------------------------

    def _index(self, tp: TopicPartition) -> _Index:
        idx = self._indexes.get(tp)
        if idx is not None:
            self._indexes.move_to_end(tp)
            return idx
        idx = self._indexes[tp] = _Index()
        if len(self._indexes) > self._max_partitions:
            self._indexes.popitem(last=False)
        self._list(tp, idx)
        return idx

    def _list(self, tp: TopicPartition, idx: _Index) -> None:
        """Rebuild the index of one partition from its directory."""
        directory = self._dir(tp)
        listed_at = time.time_ns()
        try:
            mtime = os.stat(directory).st_mtime_ns
            names = os.listdir(directory)
        except OSError:
            idx.replace([])
            idx.listed_mtime_ns = None
            idx.listed_at_ns = listed_at
            return
        idx.replace(sorted(s for s in map(parse_segment_name, names) if s is not None))
        idx.listed_mtime_ns = mtime
        idx.listed_at_ns = listed_at

    def _relist_if_changed(self, tp: TopicPartition, idx: _Index, offset: int) -> bool:
        """Re-list when the directory may hold segments the index does not (another
        worker wrote them). Cheap when nothing changed: one ``stat``."""
        try:
            mtime = os.stat(self._dir(tp)).st_mtime_ns
        except OSError:
            return False
        now = time.time_ns()
        if mtime == idx.listed_mtime_ns and idx.listed_at_ns - mtime > SETTLED_NS:
            return False
        below_everything = bool(idx.segments) and offset < idx.segments[0][0]
        if below_everything and now - idx.listed_at_ns < RELIST_BELOW_INTERVAL_NS:
            return False
        self._list(tp, idx)
        return True

    # -- high watermark -------------------------------------------------------------------

    def _load_hw(self, tp: TopicPartition, idx: _Index) -> int | None:
        data = self._read(self._dir(tp) / HW_FILE)
        stored = None if data is None else decode_high_watermark(data, tp)
        if stored is not None:
            idx.raise_hw(stored)
        return idx.high_watermark

    def _raise_hw(self, tp: TopicPartition, idx: _Index, high_watermark: int) -> None:
        """Raise the shared hw file to ``high_watermark`` (read, compare, replace).

        Re-reads after replacing and tries again if a racing writer put a lower value
        over ours; a race can still lose, which the module docstring shows is harmless.
        """
        if not idx.raise_hw(high_watermark):
            return  # this process already knows (and wrote or read) something as high
        directory = self._dir(tp)
        for _ in range(_HW_ATTEMPTS):
            data = self._read(directory / HW_FILE)
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
        if not records:
            return
        end = start_offset + len(records) - 1
        with self._lock:
            if self._closed:
                return
            try:
                idx = self._index(tp)
                first = suffix_within(records, self._max_bytes, 4, segment_overhead(tp))
                kept = (start_offset + first, end) if first < len(records) else None
                if kept is not None:
                    self._write_segment(tp, idx, kept,
                                        records[first:] if first else records,
                                        append_time_ms)
                self._drop_overlapping(tp, idx, start_offset, end, keep=kept)
                self._raise_hw(tp, idx, end)
            except OSError as exc:
                self._warn("put", tp, exc)

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        if high_watermark < 0:
            raise ValueError(f"{tp}: high watermark must be >= 0, got {high_watermark}")
        with self._lock:
            if self._closed:
                return
            idx = self._indexes.get(tp)
            if idx is not None and idx.high_watermark is not None and (
                    high_watermark <= idx.high_watermark):
                return
            try:
                self._raise_hw(tp, self._index(tp), high_watermark)
            except OSError as exc:
                self._warn("note_high_watermark", tp, exc)

    def _write_segment(self, tp: TopicPartition, idx: _Index, seg: tuple[int, int],
                       records: Sequence[Payload], append_time_ms: int) -> None:
        data = encode_segment(tp, seg[0], records, append_time_ms)
        name = segment_name(*seg)
        directory = self._dir(tp)
        self._write_atomic(directory, name, data)
        idx.add(seg)
        self._estimate += len(data)
        if self._estimate > self._max_bytes:
            self._scan_and_evict(protect=directory / name)

    def _drop_overlapping(self, tp: TopicPartition, idx: _Index, start: int, end: int,
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
                    os.unlink(directory / segment_name(*seg))
                idx.discard(seg)

    def _scan_and_evict(self, protect: Path | None) -> None:
        """List the whole directory, delete the oldest segments down to 3/4 of the
        budget (never ``protect``, the segment just written) and stale temporary files,
        and forget indexed segments whose files are gone (another process evicted or
        superseded them)."""
        found = self._list_segments()
        total = sum(f.size for f in found)
        found.sort(key=lambda f: (f.mtime_ns, f.seg[0]))
        target = self._max_bytes * 3 // 4
        present: dict[TopicPartition | None, set[tuple[int, int]]] = {}
        for f in found:
            if total > target and f.path != protect and self._evict(f):
                total -= f.size
            else:
                present.setdefault(f.tp, set()).add(f.seg)
        for tp, idx in self._indexes.items():
            idx.keep_only(present.get(tp, set()))
        self._estimate = total

    def _evict(self, f: _Found) -> bool:
        """Delete one segment file; False if it could not be deleted."""
        try:
            os.unlink(f.path)
        except FileNotFoundError:
            pass  # another process evicted it first
        except OSError:
            return False
        self._counters.evictions += f.seg[1] - f.seg[0] + 1
        return True

    def _list_segments(self) -> list[_Found]:
        """Every segment file of the directory; deletes stale temporary files on the way."""
        found: list[_Found] = []
        now = time.time_ns()
        for part_dir, tp in self._partition_dirs():
            try:
                entries = list(os.scandir(part_dir))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.name.startswith(TMP_PREFIX):
                        if now - entry.stat().st_mtime_ns > STALE_TMP_NS:
                            os.unlink(entry.path)
                        continue
                    seg = parse_segment_name(entry.name)
                    if seg is None:
                        continue
                    st = entry.stat()
                except OSError:
                    continue
                found.append(_Found(st.st_mtime_ns, Path(entry.path), tp, seg, st.st_size))
        return found

    def _partition_dirs(self) -> list[tuple[Path, TopicPartition | None]]:
        out: list[tuple[Path, TopicPartition | None]] = []
        try:
            topics = list(os.scandir(self._root))
        except OSError:
            return out
        for topic in topics:
            if not topic.is_dir(follow_symlinks=False):
                continue
            try:
                partitions = list(os.scandir(topic.path))
            except OSError:
                continue
            for part in partitions:
                if not part.is_dir(follow_symlinks=False):
                    continue
                tp: TopicPartition | None = None
                if part.name.isdigit() and str(int(part.name)) == part.name:
                    with contextlib.suppress(InvalidRequest):
                        tp = TopicPartition(topic.name, int(part.name))
                out.append((Path(part.path), tp))
        return out

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
        seg = idx.find(offset)
        relisted = False
        if seg is None:
            hw = self._fresh_hw(tp, idx, offset)
            if hw is None or offset > hw + 1:
                return None
            if offset == hw + 1:
                return CacheHit([], hw, offset)
            relisted = True
            seg = idx.find(offset) if self._relist_if_changed(tp, idx, offset) else None
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
                if hw is not None and at <= hw and self._relist_if_changed(tp, idx, at):
                    seg = idx.find(at)
        return self._hit(tp, idx, out, at, times) if out else None

    def _fresh_hw(self, tp: TopicPartition, idx: _Index, offset: int) -> int | None:
        """The hw, re-read from the shared file only if ``offset`` is beyond what this
        process knows (at the tail, where another worker may have moved it)."""
        hw = idx.high_watermark
        if hw is None or offset > hw:
            hw = self._load_hw(tp, idx)
        return hw

    def _hit(self, tp: TopicPartition, idx: _Index, out: list[tuple[int, Payload]],
             next_offset: int, times: list[int]) -> CacheHit:
        # Records another worker wrote can be newer than the hw this process knows.
        self._fresh_hw(tp, idx, next_offset - 1)
        idx.raise_hw(next_offset - 1)
        assert idx.high_watermark is not None
        return CacheHit(out, idx.high_watermark, next_offset, times)

    def _read_segment(self, tp: TopicPartition, idx: _Index,
                      seg: tuple[int, int]) -> tuple[list[Payload], int] | None:
        path = self._dir(tp) / segment_name(*seg)
        data = self._read(path)
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
            indexes = self._indexes.values()
            return self._counters.stats(
                partitions=sum(1 for i in indexes if i.segments),
                segments=sum(len(i.segments) for i in indexes),
                records=sum(i.records() for i in indexes), nbytes=self._estimate)

    def drop(self, tp: TopicPartition) -> None:
        with self._lock:
            self._indexes.pop(tp, None)
            with contextlib.suppress(OSError):
                shutil.rmtree(self._dir(tp))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._indexes.clear()
