"""Which versions of each partition's control record this process wrote.

Oxia notifies every change of a control record, this process's own commits included. A
change of its own needs no reaction (the tail cache already holds the records); any
other change means another process appended or moved the log start, and readers must
look at storage again. Two races make the answer more than a lookup:

- a notification may arrive before the write that caused it has returned here (the
  notification and the write's answer come back on different threads), so a version
  this process has not recorded yet may still be its own: while a write to the
  partition is in flight, an unknown version is held, and decided when the write ends;
- commits follow each other quickly, so a notification may arrive after a newer own
  write: the last few own versions are remembered, not only the last.

A version is only ever called foreign late, never wrongly called own: it is own only
if this process's write returned exactly that version.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator

from cachetools import LRUCache

from app.storage.keys import TopicPartition

REMEMBERED_VERSIONS = 16  # own versions kept per partition


Foreign = Callable[[TopicPartition], None]


class OwnWrites:
    def __init__(self, max_partitions: int, *, on_foreign: Foreign | None = None) -> None:
        self._versions: LRUCache[TopicPartition, collections.deque[int]] = LRUCache(
            max_partitions)
        self._in_flight: dict[TopicPartition, int] = {}
        self._held: dict[TopicPartition, list[int]] = {}
        # Told of each partition with a foreign version that was held (the broker wakes
        # the partition's waiters); None: nobody listens for changes.
        self._on_foreign = on_foreign

    def wrote(self, tp: TopicPartition, version: int) -> None:
        versions = self._versions.get(tp)
        if versions is None:
            versions = self._versions[tp] = collections.deque(maxlen=REMEMBERED_VERSIONS)
        versions.append(version)

    def owns(self, tp: TopicPartition, version: int) -> bool:
        versions = self._versions.get(tp)
        return versions is not None and version in versions

    def claims(self, tp: TopicPartition, version: int) -> bool:
        """True if ``version`` is this process's own, or is held until the write in
        flight to the partition ends (then ``on_foreign`` hears of it unless that
        write returned it); False: a foreign change, to be acted on now."""
        if self.owns(tp, version):
            return True
        if self._in_flight.get(tp):
            self._held.setdefault(tp, []).append(version)
            return True
        return False

    @contextlib.contextmanager
    def writing(self, tp: TopicPartition) -> Iterator[None]:
        """Around a write of the partition's control record, up to :meth:`wrote`."""
        self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
        try:
            yield
        finally:
            left = self._in_flight[tp] - 1
            if left:
                self._in_flight[tp] = left
            else:
                del self._in_flight[tp]
                held = self._held.pop(tp, ())
                if any(not self.owns(tp, v) for v in held) and self._on_foreign is not None:
                    self._on_foreign(tp)
