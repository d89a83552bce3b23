"""Deleting a topic, in the background, finished by some broker whatever crashes.

``DELETE /topics/{topic}`` marks the catalog record ``deleting``
(:meth:`TopicCatalog.mark_deleting`): from then on no broker produces to the topic, reads
it or gives its name to a new topic (each sees the mark within its topic cache's time to
live), and no writer registers it. Emptying its partitions costs a few milliseconds each
(bench/topic_limits.py: about 65 s for 10,000 written partitions), so it is done here,
outside the request, ``CONCURRENCY`` partitions at once.

The process doing it holds a lease in the record: it renews it every quarter lease (by
compare-and-set, with how far it got: every partition below ``emptied`` is empty), and it
empties no partition once half a lease has passed, by its own monotonic clock, since it
sent its last renewal that landed. Another process takes the work over only after it has
seen the record at one version for a whole lease by its own monotonic clock (so clocks
that disagree on the time of day change nothing), then goes on from ``emptied``. Emptying
a partition twice is emptying it once, so an overlap costs work.

Last, once the mark is ``settle_s`` old (the topic cache's time to live and a second:
every broker has seen it, and an append placed just before it has been flushed), every
partition is read again and any that holds records is emptied again, and the record is
removed by compare-and-set at the version this process last wrote: a process that lost
the lease can neither renew it nor remove the record. docs/protocol.md ("Deleting a
topic") gives the argument and what it leaves.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Counter

from app.errors import LlogError, TopicExists, UnknownTopic, VersionMismatch
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from app.storage.topic_admin import TopicAdmin, each
from app.storage.topic_catalog import Topic

log = logging.getLogger(__name__)

LEASE_MS = 30_000
RESUME_EVERY_S = 15.0
MAX_RUNNING = 2  # deletions one process works on at once (each empties 16 partitions)
Clock = Callable[[], float]  # monotonic seconds


class DeletionMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.deletions = Counter(
            "llog_topic_deletions_total",
            "Topic deletions this process worked on, by how its work ended: deleted (the "
            "topic is gone), lease_lost (it could not renew its lease in time, or another "
            "process took the work over), failed (the store refused; a broker takes it "
            "over once the lease has run out), stopped (the process shut down)",
            ["outcome"], registry=registry)
        self.partitions = Counter(
            "llog_topic_deletion_partitions_total",
            "Partitions of deleted topics this process emptied", registry=registry)


class _LeaseLost(Exception):
    """This process may no longer work on the deletion."""


@dataclass
class DeletionRun:
    """One deletion this process works on: ``done`` is set when its work ends, with
    ``deleted`` true if the topic is gone."""

    topic: str
    done: anyio.Event = field(default_factory=anyio.Event)
    deleted: bool = False


class _Lease:
    """The lease of one deletion as its holder sees it: the record as last written, and
    when the renewal that wrote it was sent."""

    def __init__(self, deleter: TopicDeleter, topic: Topic) -> None:
        self._deleter = deleter
        self.topic = topic
        self._renewed_at = -float("inf")
        self._lock = anyio.Lock()
        self._ended = False

    def check(self) -> None:
        """Raise unless the last renewal was sent less than half a lease ago."""
        d = self._deleter
        if d.monotonic() - self._renewed_at > d.lease_ms / 2000:
            raise _LeaseLost()

    async def renew(self, emptied: int) -> None:
        d = self._deleter
        async with self._lock:
            if self._ended:
                return
            sent = d.monotonic()
            # Shielded: a renewal cut off half-way would leave the version unknown.
            with anyio.CancelScope(shield=True):
                try:
                    self.topic = await d.catalog.hold_deletion(
                        self.topic, d.by, now_ms() + d.lease_ms, emptied)
                except VersionMismatch:
                    raise _LeaseLost() from None
            self._renewed_at = sent

    async def keep(self, emptied: Callable[[], int]) -> None:
        while True:
            await anyio.sleep(self._deleter.lease_ms / 4000)
            await self.renew(emptied())

    async def remove(self) -> None:
        async with self._lock:
            self._ended = True
            self.check()
            with anyio.CancelScope(shield=True):
                try:
                    await self._deleter.catalog.remove(self.topic)
                except UnknownTopic:  # the record changed: another process holds it
                    raise _LeaseLost() from None


class _Progress:
    """Which partitions are empty; ``low`` is the first that may not be."""

    def __init__(self, first: int, count: int) -> None:
        self._done = bytearray(count)
        self.low = first

    def mark(self, partition: int) -> None:
        self._done[partition] = 1
        while self.low < len(self._done) and self._done[self.low]:
            self.low += 1


class TopicDeleter:
    def __init__(self, admin: TopicAdmin, *, by: str, settle_s: float = 6.0,
                 on_deleted: Callable[[Topic], Awaitable[None]] | None = None,
                 registry: CollectorRegistry | None = None, lease_ms: int = LEASE_MS,
                 resume_every_s: float = RESUME_EVERY_S,
                 monotonic: Clock = time.monotonic) -> None:
        self.admin = admin
        self.catalog = admin.catalog
        # Unique per process: two workers of one broker are two holders.
        self.by = f"{by}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.settle_s = settle_s
        self.lease_ms = lease_ms
        self.monotonic = monotonic
        self._on_deleted = on_deleted
        self._metrics = DeletionMetrics(registry)
        self._resume_every_s = resume_every_s
        self._limiter = anyio.CapacityLimiter(MAX_RUNNING)
        self._running: dict[str, DeletionRun] = {}
        # Deletions held elsewhere: the version last seen, and since when (monotonic).
        self._watched: dict[str, tuple[int, float]] = {}
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Host this process's deletions, and take over those whose holder went quiet."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            try:
                while True:  # a deletion is taken over a whole lease after anyway
                    await anyio.sleep(self._resume_every_s)
                    await self.resume_abandoned()
            finally:
                self._tg = None

    async def start(self, name: str) -> tuple[Topic, DeletionRun | None]:
        """Mark ``name`` deleting and start emptying it here; the run is None when the
        topic was being deleted already (by this process or another)."""
        topic = await self.catalog.mark_deleting(name, self.by, now_ms(), self.lease_ms)
        marked_at = self.monotonic()
        assert topic.deleting is not None
        run = self._running.get(name)
        if run is None and topic.deleting.by == self.by:
            run = self._launch(topic, marked_at)
        return topic, run

    async def delete_here(self, name: str) -> Topic:
        """Mark ``name`` deleting and delete it in the caller's task, to the end (tools
        and tests; a broker uses :meth:`start`). Refused if it was being deleted."""
        topic = await self.catalog.mark_deleting(name, self.by, now_ms(), self.lease_ms)
        assert topic.deleting is not None
        if topic.deleting.by != self.by:
            raise TopicExists(f"topic {name!r} is being deleted by {topic.deleting.by}")
        await self._empty_all(topic, self.monotonic())
        return topic

    async def resume_abandoned(self) -> list[DeletionRun]:
        """Take over every deletion whose record has not changed for a whole lease (its
        holder died or hangs); the runs started."""
        try:
            topics = await self.catalog.list()
        except LlogError as exc:
            log.warning("topic deletions: cannot list the catalog: %s", exc)
            return []
        now, runs = self.monotonic(), []
        deleting = {t.name: t for t in topics if t.deleting is not None}
        for name in set(self._watched) - set(deleting):
            del self._watched[name]
        for name, topic in deleting.items():
            seen = self._watched.get(name)
            if seen is None or seen[0] != topic.version:
                self._watched[name] = (topic.version, now)
            elif name not in self._running and now - seen[1] >= self.lease_ms / 1000:
                run = await self._take_over(topic, seen[1])
                if run is not None:
                    runs.append(run)
        return runs

    async def _take_over(self, topic: Topic, seen_since: float) -> DeletionRun | None:
        assert topic.deleting is not None
        try:
            taken = await self.catalog.hold_deletion(topic, self.by, now_ms() + self.lease_ms,
                                                     topic.deleting.emptied)
        except (VersionMismatch, LlogError) as exc:
            log.info("topic %s: deletion not taken over: %s", topic.name, exc)
            return None
        log.info("topic %s: taking its deletion over from %s at partition %d", topic.name,
                 topic.deleting.by, topic.deleting.emptied)
        return self._launch(taken, seen_since)

    def _launch(self, topic: Topic, marked_at: float) -> DeletionRun | None:
        if self._tg is None:  # not running (shutting down): a broker takes it over
            return None
        run = self._running[topic.name] = DeletionRun(topic.name)
        self._tg.start_soon(self._delete, topic, marked_at, run)
        return run

    async def _delete(self, topic: Topic, marked_at: float, run: DeletionRun) -> None:
        outcome = "failed"
        try:
            async with self._limiter:
                await self._empty_all(topic, marked_at)
            outcome, run.deleted = "deleted", True
        except anyio.get_cancelled_exc_class():
            outcome = "stopped"
            raise
        except Exception as exc:  # one error, or the group a partition's task raised
            outcome = _outcome_of(exc)
            log.warning("topic %s: deletion stopped (%s: %r); a broker takes it over once "
                        "its lease has run out", topic.name, outcome, exc)
        finally:
            self._metrics.deletions.labels(outcome).inc()
            self._running.pop(topic.name, None)
            run.done.set()
        if run.deleted and self._on_deleted is not None:
            await self._on_deleted(topic)

    async def _empty_all(self, topic: Topic, marked_at: float) -> None:
        assert topic.deleting is not None
        name, count = topic.name, topic.partitions
        lease = _Lease(self, topic)
        # Renewed first: a run that waited for a slot may have outlived its lease.
        await lease.renew(topic.deleting.emptied)
        progress = _Progress(topic.deleting.emptied, count)

        async def empty(i: int, first: int) -> None:
            lease.check()
            await self.admin.empty(TopicPartition(name, first + i))
            self._metrics.partitions.inc()
            progress.mark(first + i)

        async def again(i: int) -> None:  # an append placed before the mark, flushed late
            lease.check()
            if await self.admin.holds_records(TopicPartition(name, i)):
                await self.admin.empty(TopicPartition(name, i))

        async with anyio.create_task_group() as tg:
            tg.start_soon(lease.keep, lambda: progress.low)
            first = progress.low
            await each(count - first, lambda i: empty(i, first))
            await anyio.sleep(max(0.0, marked_at + self.settle_s - self.monotonic()))
            await each(count, again)
            await lease.remove()
            tg.cancel_scope.cancel()


def _outcome_of(exc: BaseException) -> str:
    """``lease_lost`` if any part of ``exc`` is a lost lease, else ``failed``."""
    if isinstance(exc, BaseExceptionGroup):
        return ("lease_lost" if exc.subgroup(_LeaseLost) is not None else "failed")
    return "lease_lost" if isinstance(exc, _LeaseLost) else "failed"
