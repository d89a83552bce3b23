"""What one process knows of the segment files of a store's partitions (a cache of
directory listings): per partition, the sorted segments and the high watermark seen,
for the partitions used most recently. Files vanish under it as other processes evict
or supersede them; a partition is listed again when its directory may hold segments
the index does not (app/tailcache/files.py says why this is safe)."""

from __future__ import annotations

import bisect
import contextlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from app.storage.keys import TopicPartition
from app.tailcache.segment import parse_segment_name
from app.tailcache.segment_files import partition_dir

# A listing that started this long after the directory's last change surely saw it
# (directory mtimes come from a coarse clock, so a listing in the same tick may not have).
SETTLED_NS = 1_000_000_000
# A miss below everything indexed re-lists at most this often: new segments appear at the
# tail, so the offset was most likely evicted, and listing on every request would be waste.
RELIST_BELOW_INTERVAL_NS = 1_000_000_000
# Index entries kept per partition: the newest ones, since consumers read at the tail. A
# segment left out of the index is still on disk and counted by the budget; reading it is
# a miss, which the cache may always answer.
MAX_SEGMENTS_PER_PARTITION = 1024
_MAX_BACKTRACK = 8  # overlapping segments are rare: look back this far for a covering one

Segment = tuple[int, int]  # first and last offset


@dataclass
class PartitionIndex:
    """What this process knows of one partition directory (a cache of a listing)."""

    segments: list[Segment] = field(default_factory=list)  # (start, end) sorted
    high_watermark: int | None = None
    # Learned by this process; an evicted index forgets it. A shared cache decides by
    # its memory layer's, which keeps it for every partition it saw, dropped ones too.
    log_start: int = 1
    listed_mtime_ns: int | None = None
    listed_at_ns: int = 0

    def find(self, offset: int) -> Segment | None:
        """An indexed segment holding ``offset`` (a bounded search back)."""
        i = bisect.bisect_right(self.segments, (offset, float("inf"))) - 1
        for j in range(i, max(i - _MAX_BACKTRACK, -1), -1):
            start, end = self.segments[j]
            if start <= offset <= end:
                return start, end
        return None

    def add(self, seg: Segment) -> None:
        i = bisect.bisect_left(self.segments, seg)
        if i == len(self.segments) or self.segments[i] != seg:
            self.segments.insert(i, seg)
            if len(self.segments) > MAX_SEGMENTS_PER_PARTITION:
                del self.segments[0]

    def replace(self, segments: list[Segment]) -> None:
        """Index exactly the newest of ``segments`` (sorted)."""
        self.segments = segments[-MAX_SEGMENTS_PER_PARTITION:]

    def discard(self, seg: Segment) -> None:
        with contextlib.suppress(ValueError):
            self.segments.remove(seg)

    def keep_only(self, present: set[Segment]) -> None:
        """Forget the segments whose files are not in ``present``."""
        self.segments = [seg for seg in self.segments if seg in present]

    def records(self) -> int:
        return sum(end - start + 1 for start, end in self.segments)

    def overlapping(self, start: int, end: int) -> list[Segment]:
        """Indexed segments sharing an offset with ``start..end`` (a bounded search)."""
        out: list[Segment] = []
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
        """Whether ``high_watermark`` is news (then it is kept)."""
        if self.high_watermark is None or high_watermark > self.high_watermark:
            self.high_watermark = high_watermark
            return True
        return False


class PartitionIndexes:
    """The indexes of at most ``max_partitions`` partitions of the store's subtree
    ``root``, the least recently used forgotten first (its files stay, and are listed
    again when the partition is used)."""

    def __init__(self, root: str, max_partitions: int) -> None:
        self._root = root
        self._max_partitions = max_partitions
        # Least recently used first.
        self._indexes: OrderedDict[TopicPartition, PartitionIndex] = OrderedDict()

    def __call__(self, tp: TopicPartition) -> PartitionIndex:
        """``tp``'s index (listed from its directory when not held)."""
        idx = self._indexes.get(tp)
        if idx is not None:
            self._indexes.move_to_end(tp)
            return idx
        idx = self._indexes[tp] = PartitionIndex()
        if len(self._indexes) > self._max_partitions:
            self._indexes.popitem(last=False)
        self.list(tp, idx)
        return idx

    def held(self, tp: TopicPartition) -> PartitionIndex | None:
        """``tp``'s index if held (nothing listed, the order of use unchanged)."""
        return self._indexes.get(tp)

    def items(self) -> list[tuple[TopicPartition, PartitionIndex]]:
        return list(self._indexes.items())

    def forget(self, tp: TopicPartition) -> None:
        self._indexes.pop(tp, None)

    def clear(self) -> None:
        self._indexes.clear()

    def list(self, tp: TopicPartition, idx: PartitionIndex) -> None:
        """Rebuild the index of one partition from its directory."""
        directory = partition_dir(self._root, tp)
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

    def relist_if_changed(self, tp: TopicPartition, idx: PartitionIndex, offset: int) -> bool:
        """Re-list when the directory may hold segments the index does not (another
        worker wrote them). Cheap when nothing changed: one ``stat``."""
        try:
            mtime = os.stat(partition_dir(self._root, tp)).st_mtime_ns
        except OSError:
            return False
        now = time.time_ns()
        if mtime == idx.listed_mtime_ns and idx.listed_at_ns - mtime > SETTLED_NS:
            return False
        below_everything = bool(idx.segments) and offset < idx.segments[0][0]
        if below_everything and now - idx.listed_at_ns < RELIST_BELOW_INTERVAL_NS:
            return False
        self.list(tp, idx)
        return True
