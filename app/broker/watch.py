"""Wakes long-polls when a partition they watch gets new records.

Writes by this process wake waiters at once (the batcher reports each commit). Writes by
other brokers and workers arrive as Oxia change notifications of ``meta/control``: one
notification stream per process (not one poller per partition), consumed by a dedicated
thread and handed to the event loop. Such a change also marks the partition *stale*:
until a reader has seen the new high watermark, the tail cache's "known empty at the
tail" answer cannot be trusted for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.abc

from app.storage.keys import KeyLayout, TopicPartition

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


class PartitionWatch:
    """Waiters per partition, plus the set of partitions changed by other processes."""

    def __init__(self) -> None:
        self._waiters: dict[TopicPartition, set[Waiter]] = {}
        self._stale: set[TopicPartition] = set()
        self.remote_changes = 0

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

    @property
    def watched_partitions(self) -> int:
        return len(self._waiters)

    @property
    def waiters(self) -> int:
        return len({w for ws in self._waiters.values() for w in ws})

    def notify(self, tp: TopicPartition) -> None:
        for waiter in self._waiters.get(tp, ()):
            waiter.wake()

    def notify_remote(self, tp: TopicPartition) -> None:
        self.remote_changes += 1
        self._stale.add(tp)
        self.notify(tp)

    def is_stale(self, tp: TopicPartition) -> bool:
        return tp in self._stale

    def refreshed(self, tp: TopicPartition) -> None:
        self._stale.discard(tp)


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

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        self._loop = asyncio.get_running_loop()
        self._notifications = await anyio.to_thread.run_sync(self._client.get_notifications)
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
            if not key.endswith("/meta/control"):
                continue
            tp = self._layout.parse_control_key(key)
            if tp is None:
                continue
            # Fire and forget: this thread never waits for the event loop, so a burst
            # of writes costs the loop one cheap callback each and nothing more.
            try:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._deliver, tp, n.version_id())
            except RuntimeError:  # the event loop is closed: shutting down
                return

    def _deliver(self, tp: TopicPartition, version: int | None) -> None:
        if version is not None and self._is_own(tp, version):
            return
        self._watch.notify_remote(tp)
