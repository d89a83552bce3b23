"""Which partition to compact next: seeds, discovery, claims and a bounded pool.

The scheduler knows the seed targets of the settings plus every partition that periodic
discovery finds (``meta/control`` keys). Each pass visits the known partitions in a fresh
random order, so compactors in many processes spread over the partitions instead of all
queueing on the same one, with at most ``compaction_concurrency`` visits at once and
never two of the same partition. A visit takes the partition's ephemeral claim, runs
``compact_once`` until there is nothing more to do (bounded), lets go of the claim, and
records the partition's lag. A busy claim means another compactor is on it: move on.

With a throttle (LLOG_COMPACTION_MAX_BYTES_PER_S, app/compaction/throttle.py) each
finished run is paid for with its WAL bytes; a visit that leaves the throttle in debt
lets go of its partition instead of running another round, and the next visit waits
until the debt is paid off *before* it claims a partition, so no claim is ever held
while waiting. A pass whose visits the throttle cut short is followed by the next one
at once (the throttle paces it), not after ``compaction_interval_s``. Retention and
trimming write little and pay nothing.

``run`` is meant for a task group (``await tg.start(scheduler.run)``), so the broker's
lifespan and the standalone service host it the same way. ``stop()`` is graceful: no new
visit starts and the running ones finish; cancelling is also safe, because every
compaction step is idempotent and the claim is released from a shielded scope.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from app.compaction.claims import Claims
from app.compaction.compactor import CompactionOutcome, Compactor
from app.compaction.metrics import CompactionMetrics, PartitionLag
from app.compaction.throttle import Throttle
from app.errors import InvalidRequest, LlogError
from app.settings import CompactionSettings, OxiaSettings, S3Settings
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import CompactionCursor, Control, now_ms
from app.storage.partition_discovery import discover_partitions
from app.storage.reader import LogReader
from app.storage.retention import apply_retention
from app.storage.topic_catalog import Topic, TopicCatalog
from app.stores.oxia.store import OxiaStore

log = logging.getLogger(__name__)
MAX_ROUNDS_PER_VISIT = 16


@dataclass
class Visit:
    """One visit of a partition: what each compact_once did, or why none ran."""

    tp: TopicPartition
    outcomes: list[CompactionOutcome] = field(default_factory=list)
    busy: bool = False
    error: str | None = None
    lag: PartitionLag | None = None
    throttled: bool = False  # let go early: the throttle was in debt


def parse_targets(targets: Iterable[str]) -> list[TopicPartition]:
    """``topic:partition`` strings (LLOG_COMPACTION_SEED_TARGETS); bad ones are logged."""
    out: list[TopicPartition] = []
    for target in targets:
        topic, _, partition = target.rpartition(":")
        try:
            out.append(TopicPartition(topic, int(partition)))
        except (InvalidRequest, ValueError):
            log.warning("ignoring compaction seed target %r", target)
    return out


def visit_timeout_s(s3: S3Settings, oxia: OxiaSettings) -> float:
    """How long one visit may run: a stuck request must not hold a pool slot (and a
    claim) for ever. Each S3/Oxia call has its own deadline; this bounds their sum."""
    return max(120.0, 4 * s3.s3_request_timeout_s + 8 * oxia.oxia_request_timeout_s)


DEFAULT_VISIT_TIMEOUT_S = visit_timeout_s(S3Settings(), OxiaSettings())


class CompactionScheduler:
    def __init__(
        self,
        compactor: Compactor,
        oxia: OxiaStore,
        layout: KeyLayout,
        compaction: CompactionSettings,
        *,
        compactor_id: str,
        metrics: CompactionMetrics | None = None,
        on_visit: Callable[[Visit], None] | None = None,
        task_timeout_s: float | None = None,
        rng: random.Random | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        self._compactor = compactor
        self._oxia = oxia
        self._layout = layout
        self._settings = compaction
        self._metrics = metrics
        # Called after every visit (tests, and hosts that want to log or export visits).
        self.listeners: list[Callable[[Visit], None]] = [on_visit] if on_visit else []
        self._rng = rng or random.Random()
        # One per scheduler, so one per compactor process, shared by its visits.
        self.throttle = throttle or Throttle(compaction.compaction_max_bytes_per_s)
        self.claims = Claims(oxia, layout, compactor_id, metrics=metrics)
        self._known: set[TopicPartition] = set(parse_targets(compaction.compaction_seed_targets))
        self._catalog = TopicCatalog(oxia, layout)
        self._topics: dict[str, Topic] = {}
        self._bootstrapped = False
        self._retention_due: dict[TopicPartition, float] = {}
        # Retention lookups read index entries and at most one chunk: no object cache.
        self._reader = LogReader(oxia, compactor.s3, layout, object_cache_bytes=0)
        self._running: set[TopicPartition] = set()
        self._stopped = False
        self._wakeup: anyio.Event | None = None  # created in run(), inside the event loop
        # A visit is bounded: a stuck request must not hold a pool slot (and a claim) for
        # ever (visit_timeout_s; by default, that of the default request deadlines).
        self._task_timeout_s = task_timeout_s or DEFAULT_VISIT_TIMEOUT_S
        self._update_known_gauge()

    @property
    def compactor_id(self) -> str:
        return self.claims.compactor_id

    @property
    def known(self) -> frozenset[TopicPartition]:
        return frozenset(self._known)

    def add(self, tps: Iterable[TopicPartition]) -> None:
        self._known.update(tps)
        self._update_known_gauge()

    def stop(self) -> None:
        """Start no new visit; ``run`` returns once the running ones are done."""
        self._stopped = True
        self.throttle.close()  # a visit waiting for the budget starts nothing
        if self._wakeup is not None:
            self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopped

    async def discover(self) -> int:
        """Add every partition of the topic catalog; returns how many are new.

        The first discovery also lists the partitions that have a ``meta/control`` key
        and registers their topics in the catalog: stores written before it existed.
        """
        try:
            if not self._bootstrapped:
                await self._register_listed_topics()
                self._bootstrapped = True
            # A topic being deleted is emptied by its deleter: nothing to compact.
            topics = [t for t in await self._catalog.list() if t.deleting is None]
        except LlogError:
            self._count_discovery("error")
            raise
        self._count_discovery("ok")
        self._topics = {t.name: t for t in topics}
        found = {TopicPartition(t.name, p) for t in topics for p in range(t.partitions)}
        new = found - self._known
        self.add(found)
        return len(new)

    async def _register_listed_topics(self) -> None:
        """Put topics that have partitions in storage but no catalog record (written
        before the catalog existed) into the catalog. A topic whose partitions hold no
        records is not registered: that is what a deleted topic leaves behind."""
        listed = await discover_partitions(self._oxia, self._layout)
        listed_topics = await self._catalog.list()
        catalogued = {t.name for t in listed_topics}
        deleting = {t.name for t in listed_topics if t.deleting is not None}
        counts: dict[str, int] = {}
        with_data: set[str] = set()
        for tp in listed:
            counts[tp.topic] = max(counts.get(tp.topic, 0), tp.partition + 1)
            if tp.topic not in catalogued and tp.topic not in with_data \
                    and await self._holds_records(tp):
                with_data.add(tp.topic)
        for topic, partitions in counts.items():
            if (topic not in catalogued and topic not in with_data) or topic in deleting:
                continue
            try:
                await self._catalog.ensure(topic, partitions)
                await self._catalog.update(topic, min_partitions=partitions)
            except InvalidRequest as exc:  # beyond the catalog's partition limit
                log.warning("topic %s is not registered in the catalog: %s", topic, exc)

    async def _holds_records(self, tp: TopicPartition) -> bool:
        control = await self._reader.read_control(tp)
        if control is None:
            return False
        return (control.log_start_offset or 1) <= control.sequence_counter

    async def _apply_retention(self, tp: TopicPartition) -> None:
        """Move the partition's log start as its topic's retention asks, at most every
        ``retention_check_interval_s``."""
        topic = self._topics.get(tp.topic)
        if topic is None or (topic.config.retention_ms is None
                             and topic.config.retention_bytes is None):
            return
        due = self._retention_due.get(tp, 0.0)
        if time.monotonic() < due:
            return
        await apply_retention(self._reader, self._oxia, self._layout, tp, topic.config,
                              now_ms())
        self._retention_due[tp] = (time.monotonic()
                                   + self._settings.retention_check_interval_s)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Discover and pass over the partitions until stopped (or cancelled)."""
        s = self._settings
        next_discovery = 0.0
        self._wakeup = anyio.Event()
        if self._stopped:
            self._wakeup.set()
        task_status.started()
        while not self._stopped:
            if time.monotonic() >= next_discovery:
                try:
                    await self.discover()
                except LlogError as exc:
                    log.warning("partition discovery failed: %s", exc)
                next_discovery = time.monotonic() + s.compaction_discovery_interval_s
            visits = await self.run_pass()
            if any(v.throttled for v in visits):
                continue  # a backlog: the throttle, not the interval, paces the next pass
            with anyio.move_on_after(s.compaction_interval_s):
                await self._wakeup.wait()

    async def run_pass(self) -> list[Visit]:
        """Visit every known partition once, in random order, within the pool."""
        order = sorted(self._known)
        self._rng.shuffle(order)
        visits: list[Visit] = []
        slots = anyio.Semaphore(self._settings.compaction_concurrency)

        async def visit(tp: TopicPartition) -> None:
            try:
                visits.append(await self.visit(tp))
            finally:
                self._running.discard(tp)
                slots.release()

        async with anyio.create_task_group() as tg:
            for tp in order:
                if tp in self._running:
                    continue  # a visit from an overlapping pass is still on it
                await slots.acquire()
                # Out of debt before the claim is taken, never while holding one.
                if not self._stopped:
                    await self._wait_for_budget()
                if self._stopped:
                    slots.release()
                    break
                self._running.add(tp)
                tg.start_soon(visit, tp)
        if self._metrics is not None:
            self._metrics.passes.inc()
        return visits

    async def visit(self, tp: TopicPartition) -> Visit:
        """Claim ``tp``, compact it until done (bounded), release, record its lag.

        Never raises for a failed compaction: the error is logged, counted and reported
        in the visit, and the partition is tried again on a later pass.
        """
        result = Visit(tp)
        self._active(+1)
        try:
            with anyio.fail_after(self._task_timeout_s):
                async with self.claims.held(tp) as mine:
                    if not mine:
                        result.busy = True
                    else:
                        await self._apply_retention(tp)
                        for _ in range(MAX_ROUNDS_PER_VISIT):
                            outcome = await self._compactor.compact_once(tp)
                            result.outcomes.append(outcome)
                            self._pay(outcome)
                            if not outcome.did_work or self._stopped:
                                break
                            if self.throttle.in_debt:  # the claim goes; back next pass
                                result.throttled = True
                                if self._metrics is not None:
                                    self._metrics.throttle_visits_ended.inc()
                                break
                result.lag = await self._observe_lag(tp)
        except LlogError as exc:
            result.error = f"{exc.error_type}: {exc}"
            log.warning("%s: compaction failed: %s", tp, result.error)
        except TimeoutError:
            result.error = f"Timeout: the visit took longer than {self._task_timeout_s} s"
            log.warning("%s: %s", tp, result.error)
            if self._metrics is not None:
                self._metrics.failures.labels("Timeout").inc()
        except Exception as exc:  # a bug must not stop compaction of every partition
            result.error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: compaction crashed", tp)
        finally:
            self._active(-1)
        for listener in self.listeners:
            listener(result)
        return result

    async def _observe_lag(self, tp: TopicPartition) -> PartitionLag:
        control_rec = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        cursor_rec = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        control = Control.from_json(control_rec.value) if control_rec else Control()
        cursor = CompactionCursor.from_json(cursor_rec.value) if cursor_rec else CompactionCursor()
        lag = PartitionLag(control.sequence_counter, cursor.offset, control.pending is not None,
                           now_ms())
        if self._metrics is not None:
            self._metrics.observe_lag(tp, lag)
        return lag

    async def _wait_for_budget(self) -> None:
        """Wait until the throttle is out of debt (or the scheduler stops)."""
        if not self.throttle.in_debt:
            return
        # Only the pass's loop waits (one visit at a time), so the difference is this
        # wait's alone.
        before = self.throttle.statistics().seconds_waited
        try:
            await self.throttle.wait()
        finally:
            if self._metrics is not None:
                self._metrics.throttle_wait_seconds.inc(
                    self.throttle.statistics().seconds_waited - before)

    def _pay(self, outcome: CompactionOutcome) -> None:
        if outcome.wal_bytes:
            self.throttle.pay(outcome.wal_bytes)
            if self._metrics is not None:
                self._metrics.throttle_paid_bytes.inc(outcome.wal_bytes)

    def _active(self, delta: int) -> None:
        if self._metrics is not None:
            self._metrics.active_tasks += delta

    def _update_known_gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.known_partitions = len(self._known)

    def _count_discovery(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.discoveries.labels(outcome).inc()
