"""Wakes long-polls when a partition they watch gets new records.

Writes by this process wake waiters at once (the batcher reports each commit). Writes by
other brokers and workers arrive as Oxia change notifications of ``meta/control``: one
notification stream per process (not one poller per partition), consumed by a dedicated
thread and handed to the event loop. Such a change also makes the partition *stale*:
until a read that *started after it* has seen the new high watermark, the tail cache's
"known empty at the tail" answer cannot be trusted for it.

Staleness is told by a clock that only moves forward: every remote change takes the next
number of a sequence shared by all partitions, and a stale partition remembers the number
of its latest change. A reader captures the clock before it reads anything
(:meth:`PartitionWatch.generation`) and, once the tail cache knows the high watermark it
read, clears the partition only if its latest change came before the capture
(:meth:`PartitionWatch.refreshed`). A change that lands while a read is in flight
therefore keeps the partition stale, and the next look reads the log again instead of
trusting the cache. The clock never goes back, so a read that began before a change can
never mistake that change for one it saw (a counter per partition, dropped once fresh and
restarted by the next change, could come back to the very value an older read captured).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
import anyio.abc
from cachetools import LRUCache

from app.storage.keys import KeyLayout, TopicPartition
from app.stores.oxia import notifications as oxia_notifications

PARSED_KEYS = 100_000  # control keys whose partition the listener remembers

log = logging.getLogger(__name__)


class Waiter:
    """One long-poll's wake-up signal: re-armed before each look at the data, so a
    write that lands while it looks is never missed."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def arm(self) -> None:
        if self._event.is_set():
            self._event = anyio.Event()

    def wake(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        """Until woken (callers bound it with ``anyio.move_on_after``)."""
        await self._event.wait()


class Generation(NamedTuple):
    """The watch's clock: ``epoch`` moves when every partition is made stale at once,
    ``sequence`` with every remote change. Both only grow, so generations compare in
    the order they were captured."""

    epoch: int
    sequence: int


@dataclass(frozen=True)
class WatchStats:
    watched_partitions: int
    waiters: int
    stale_partitions: int
    remote_changes: int


class PartitionWatch:
    """Waiters per partition, plus the generations of partitions changed by others.

    A partition is stale when another process changed it since this one last read it,
    and until this process has read it once in the current epoch (every partition starts
    stale). At most ``max_stale`` partitions of each kind are remembered; beyond that the
    table is dropped (and for changes a global epoch moves on), which makes those
    partitions stale once more (a few extra reads, never a missed record).
    """

    def __init__(self, max_stale: int = 100_000) -> None:
        self._waiters: dict[TopicPartition, set[Waiter]] = {}
        # Stale partitions -> the sequence number of their latest change.
        self._changes: dict[TopicPartition, int] = {}
        # Every partition starts stale: what a shared cache directory (LLOG_TAIL_CACHE_DIR)
        # holds may lag the log (other hosts' commits, a dropped write-behind, two workers
        # racing), and no notification reports the commits made before this process
        # watched. Nothing cached is trusted until a read of the log confirms it.
        self._epoch = 1
        self._seen_epoch: dict[TopicPartition, int] = {}
        self._max_stale = max_stale
        self.remote_changes = 0  # also the sequence number of the latest change

    @contextlib.contextmanager
    def watching(self, tps: list[TopicPartition]) -> Iterator[Waiter]:
        waiter = Waiter()
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(waiter)
        try:
            yield waiter
        finally:
            for tp in tps:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._waiters[tp]

    def statistics(self) -> WatchStats:
        return WatchStats(len(self._waiters),
                          len({w for ws in self._waiters.values() for w in ws}),
                          len(self._changes), self.remote_changes)

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.wake()

    def notify(self, tp: TopicPartition) -> None:
        for waiter in self._waiters.get(tp, ()):
            waiter.wake()

    def notify_remote(self, tp: TopicPartition) -> None:
        self.remote_changes += 1
        if tp not in self._changes and len(self._changes) >= self._max_stale:
            self._changes.clear()
            self._seen_epoch.clear()
            self._epoch += 1
        self._changes[tp] = self.remote_changes
        self.notify(tp)

    def distrust_all(self) -> None:
        """Every partition is stale until read again, and every long-poll looks again:
        changes by others may have gone unreported (the notification streams were
        down; what they replay on their return is delivered as well)."""
        self._changes.clear()
        self._seen_epoch.clear()
        self._epoch += 1
        self.wake_all()

    def generation(self) -> Generation:
        """Capture before a read looks at the log; hand to :meth:`refreshed` after it."""
        return Generation(self._epoch, self.remote_changes)

    def is_stale(self, tp: TopicPartition) -> bool:
        return tp in self._changes or self._seen_epoch.get(tp, 0) < self._epoch

    def refreshed(self, tp: TopicPartition, generation: Generation) -> None:
        """A read whose every look at the log came after ``generation`` was captured has
        seen ``tp``'s high watermark, and the tail cache knows it: ``tp`` is fresh unless
        a change was reported after the capture (the read may have missed it)."""
        if generation.epoch != self._epoch or self._changes.get(tp, 0) > generation.sequence:
            return
        self._changes.pop(tp, None)
        if len(self._seen_epoch) >= self._max_stale:
            self._seen_epoch.clear()  # all stale once more: a few extra reads
        self._seen_epoch[tp] = self._epoch


class OxiaChangeListener:
    """Feeds Oxia ``meta/control`` change notifications into a :class:`PartitionWatch`."""

    def __init__(
        self,
        client: Any,
        layout: KeyLayout,
        watch: PartitionWatch,
        is_own_version: Callable[[TopicPartition, int], bool],
    ) -> None:
        self._client = client
        self._layout = layout
        self._watch = watch
        self._is_own = is_own_version
        self._notifications: Any = None
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Control keys come back with every commit: parse each once (bounded).
        self._parsed: LRUCache[str, TopicPartition | None] = LRUCache(PARSED_KEYS)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        self._loop = asyncio.get_running_loop()
        self._notifications = await anyio.to_thread.run_sync(functools.partial(
            oxia_notifications.notifications, self._client, on_resumed=self._resumed,
            wanted=_is_control_key))
        task_status.started()
        try:
            await anyio.to_thread.run_sync(self._consume, abandon_on_cancel=True)
        finally:
            self.close()

    def close(self) -> None:
        self._stopping.set()
        notifications, self._notifications = self._notifications, None
        if notifications is not None:
            with contextlib.suppress(Exception):
                notifications.close()

    def _consume(self) -> None:
        notifications = self._notifications
        if notifications is None:
            return
        for n in notifications:
            if self._stopping.is_set():
                return
            key = n.key()
            try:
                tp = self._parsed[key]
            except KeyError:
                tp = self._parsed[key] = self._layout.parse_control_key(key)
            if tp is None:
                continue
            # Fire and forget: this thread never waits for the event loop, so a burst
            # of writes costs the loop one cheap callback each and nothing more.
            try:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._deliver, tp, n.version_id())
            except RuntimeError:  # the event loop is closed: shutting down
                return

    def _resumed(self) -> None:
        """The streams were reopened after a failure or a leader change (their thread)."""
        loop = self._loop
        if loop is not None and not self._stopping.is_set():
            with contextlib.suppress(RuntimeError):  # the event loop is closed
                loop.call_soon_threadsafe(self._watch.distrust_all)

    def _deliver(self, tp: TopicPartition, version: int | None) -> None:
        if version is not None and self._is_own(tp, version):
            return
        self._watch.notify_remote(tp)


def _is_control_key(key: str) -> bool:
    """The keys the listener wants (the others are dropped on the stream's thread)."""
    return key.endswith("/meta/control")
