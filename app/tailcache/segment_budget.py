"""The file tail cache's byte budget as one process keeps it: an estimate of the
segment bytes of the store's subtree (exact after each full scan, then what this process
wrote since), and the segments it wrote itself, oldest first, so that it can evict them
without listing anything. When that is not enough (other processes' files) or the last
full scan is old, the cache lists everything (app/tailcache/files.py)."""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import NamedTuple

from app.storage.keys import TopicPartition

MAX_WRITTEN_REMEMBERED = 100_000


class WrittenSegment(NamedTuple):
    """A segment file this process wrote."""

    path: str
    tp: TopicPartition
    seg: tuple[int, int]
    size: int
    write: int  # which write of this process (a name can be written again)


class SegmentBudget:
    """``max_bytes`` of segments, brought back to 3/4 of it when passed; a full scan is
    due every ``full_scan_interval_ns`` at least."""

    def __init__(self, max_bytes: int, full_scan_interval_ns: int) -> None:
        self.max_bytes = max_bytes
        self.target = max_bytes * 3 // 4
        self._full_scan_interval_ns = full_scan_interval_ns
        self.estimate = 0
        # The segments this process wrote, oldest first, to evict without listing.
        self._written: deque[WrittenSegment] = deque()
        self._newest: dict[str, int] = {}  # path -> its newest write in ``_written``
        self._writes = itertools.count()
        self._scanned_at_ns = 0

    def wrote(self, path: str, tp: TopicPartition, seg: tuple[int, int], size: int) -> None:
        """This process wrote ``size`` bytes as segment ``seg`` of ``tp`` at ``path``."""
        self.estimate += size
        self._remember(WrittenSegment(path, tp, seg, size, next(self._writes)))
        if len(self._written) > MAX_WRITTEN_REMEMBERED:
            self._forget_oldest()  # still on disk: the next full scan sees it

    @property
    def over(self) -> bool:
        return self.estimate > self.max_bytes

    @property
    def scan_due(self) -> bool:
        return time.monotonic_ns() - self._scanned_at_ns >= self._full_scan_interval_ns

    def own_oldest(self) -> list[WrittenSegment]:
        """The oldest segments this process wrote, forgotten and taken off the estimate
        until it is at most the target (the newest write is kept): the files to
        delete. A name written again since is left out: its newer copy stays."""
        out: list[WrittenSegment] = []
        while self.estimate > self.target and len(self._written) > 1:
            old, newest = self._forget_oldest()
            self.estimate -= old.size
            if newest:
                out.append(old)
        return out

    def scanned(self, total: int, present: dict[TopicPartition | None, set[tuple[int, int]]]
                ) -> None:
        """A full scan left ``total`` bytes, segments ``present``: the estimate is
        exact again, and the writes remembered are those still on disk."""
        self.estimate = total
        kept = [w for w in self._written if w.seg in present.get(w.tp, ())
                and self._newest.get(w.path) == w.write]
        self._written, self._newest = deque(), {}
        for written in kept:
            self._remember(written)
        self._scanned_at_ns = time.monotonic_ns()

    def _remember(self, written: WrittenSegment) -> None:
        self._written.append(written)
        self._newest[written.path] = written.write

    def _forget_oldest(self) -> tuple[WrittenSegment, bool]:
        """The oldest remembered write, and whether it is its file's newest."""
        old = self._written.popleft()
        newest = self._newest.get(old.path) == old.write
        if newest:
            del self._newest[old.path]
        return old, newest
