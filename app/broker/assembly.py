"""The running broker, assembled in one place by the app's lifespan.

:func:`assemble` opens the store clients, builds each part of the broker with what it
needs (constructor arguments: no attribute is patched on a part once it is built) and
starts the background loops, each watched (a crash fails the broker's status,
app/service_health.py, rather than dying unseen): first what every broker has (tail
cache, partition watch, topic directory, log writer), then the write role's batcher,
the read side (app/broker/read_side.py), cluster membership (app/broker/cluster_side.py)
and the remaining loops. What it yields, a :class:`Broker`, holds every part; a role the broker
lacks is a stand-in that refuses when used (app/broker/roles.py), so requests receive
their dependencies whole (:class:`~app.broker.produce_call.Producing`,
:class:`~app.broker.consume_call.Consuming`, :class:`~app.broker.event_stream.Streaming`,
:class:`~app.broker.positions.Positions`) and look nothing up.

On exit (:func:`_stop`) it stops taking produce, flushes what is buffered, answers every
waiter and every forwarded frame, and closes everything.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc

from app.batching.batcher import Batcher
from app.batching.metrics import BatcherMetrics
from app.broker import roles
from app.broker.appends import Appends
from app.broker.cluster_side import ClusterSide, Members, Solo, join_cluster
from app.broker.consume import ConsumeService
from app.broker.consume_call import Consuming
from app.broker.event_stream import Streaming
from app.broker.forget_topic import ForgetTopic
from app.broker.loop_watchdog import LoopWatchdog, end_the_process, install_test_blocker
from app.broker.positions import Positions
from app.broker.process import BrokerProcess
from app.broker.produce_call import Producing
from app.broker.read_side import ReadSide, start_read_side
from app.broker.topic_view import TopicDirectory, default_topic_config
from app.broker.watch import PartitionWatch
from app.compaction.service import run_in_broker
from app.errors import LlogError
from app.groups.service import GroupService
from app.observability import S3Usage
from app.service_health import ServiceHealth
from app.settings import Settings, TopicSettings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.identity import store_identity
from app.storage.keys import KeyLayout
from app.storage.reader import LogReader
from app.storage.topic_admin import TopicAdmin
from app.storage.topic_catalog import TopicCatalog
from app.storage.topic_deletion import TopicDeleter
from app.storage.writer import LogWriter
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from app.tailcache import SharedTailCache, TailCache, open_tail_cache, run_cache_write, store_id_of
from app.tailcache.flush_puts import flush_puts, join_max_bytes

log = logging.getLogger(__name__)

DrainStep = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Broker:
    """Every part of the running broker. A role's services on a broker without the role
    are stand-ins that refuse (app/broker/roles.py): no field is ever missing."""

    settings: Settings
    health: ServiceHealth
    # What every broker has, whatever its roles.
    topics: TopicDirectory
    cache: TailCache
    watch: PartitionWatch
    writer: LogWriter
    forget_topic: ForgetTopic  # after a topic changed here
    members: Members  # the cluster as this broker sees it (none outside one)
    # The services of the roles.
    batcher: Batcher  # write
    reader: LogReader  # read
    consume: ConsumeService  # read
    admin: TopicAdmin  # read (admin's refusal)
    deleter: TopicDeleter  # read (admin's refusal)
    groups: GroupService  # read (groups' refusal)
    # What each kind of request is handed.
    positions: Positions  # POST /offsets
    producing: Producing  # POST /produce
    consuming: Consuming  # POST /consume
    streaming: Streaming  # the event stream
    # What a drain does once the broker is not ready, in order.
    on_drain: tuple[DrainStep, ...]

    async def drain(self) -> None:
        """Not ready from now on; answer parked long-polls, leave the cluster; keep
        serving for the drain period while load balancers notice (app/drain.py)."""
        self.health.not_ready()
        for step in self.on_drain:
            await step()
        await anyio.sleep(self.settings.drain_s)


@contextlib.asynccontextmanager
async def assemble(process: BrokerProcess) -> AsyncIterator[Broker]:
    """Build and start the broker (see the module); on exit stop it, in order."""
    s = process.settings
    layout = KeyLayout(s.root_prefix, s.s3_bucket)
    async with contextlib.AsyncExitStack() as stack:
        oxia = await stack.enter_async_context(
            OxiaStore(s.oxia, process.store_metrics, identity=s.broker_id))
        s3 = await stack.enter_async_context(S3Store(s.s3, process.store_metrics))
        cache = await _open_cache(s, oxia, layout, stack)
        watch = PartitionWatch()
        topics = _topic_directory(s.topic_rules, oxia, layout)
        # A change seen while this process's own write of it is in flight is decided when
        # that write returns; a foreign one then wakes the partition's waiters.
        writer = LogWriter.from_settings(oxia, s3, layout, process.store_metrics, s.writer,
                                         on_foreign=watch.notify_remote)
        forget = ForgetTopic(topics, cache, watch)
        async with anyio.create_task_group() as writers:
            batcher = (await _start_batcher(process, writer, cache, watch, writers)
                       if s.has_role("write") else None)
            # Loops that shutdown simply cancels; the batcher above is drained instead.
            async with anyio.create_task_group() as background:
                read = ReadSide.disabled()
                if s.has_role("read"):
                    read = await start_read_side(
                        process, oxia, s3, layout, background, stack, topics=topics,
                        cache=cache, watch=watch, writer=writer, forget=forget)
                cluster = (await join_cluster(process, oxia, layout, batcher, topics,
                                              background, stack)
                           if s.affinity != "off" and batcher is not None else None)
                await _start_loops(process, oxia, s3, cache, background)
                appends = None if batcher is None else Appends(
                    batcher, None if cluster is None else cluster.router)
                broker = compose(process, topics, cache, watch, writer, forget,
                                 batcher, appends, read, cluster)
                process.running = broker  # its figures, from now on
                process.health.serving()
                try:
                    yield broker
                finally:
                    await _stop(process.health, batcher, appends, cluster)
                    background.cancel_scope.cancel()


async def _stop(health: ServiceHealth, batcher: Batcher | None, appends: Appends | None,
                cluster: ClusterSide | None) -> None:
    """The shutdown, in order: the router's lanes hand over what they hold while the
    batcher still takes it; the forward listener refuses new frames; the batcher
    flushes what is buffered and answers every waiter (drained, not cancelled); the
    frames forwarded here are answered. The caller then cancels the other loops."""
    health.stopping()
    if appends is not None:
        await appends.stop_routing()
    if cluster is not None:
        cluster.server.close()
    if batcher is not None:
        batcher.close()
    if cluster is not None and batcher is not None:
        await cluster.answer_forwarded(batcher)


def compose(process: BrokerProcess, topics: TopicDirectory, cache: TailCache,
            watch: PartitionWatch, writer: LogWriter, forget: ForgetTopic,
            batcher: Batcher | None, appends: Appends | None, read: ReadSide,
            cluster: ClusterSide | None) -> Broker:
    """The broker of the parts built, with a stand-in for each role it lacks, and what
    each kind of request is handed."""
    s = process.settings
    positions = Positions(read.reader, read.answers, topics, s.max_partitions_per_request)
    writing = batcher is not None and appends is not None
    producing = Producing(
        s.limits, topics if writing else roles.disabled(TopicDirectory, roles.WRITE),
        appends if appends is not None else roles.disabled(Appends, roles.WRITE),
        process.produce_metrics)
    return Broker(
        settings=s, health=process.health, topics=topics, cache=cache, watch=watch,
        writer=writer, forget_topic=forget,
        members=Solo() if cluster is None else cluster,
        batcher=batcher if batcher is not None else roles.disabled(Batcher, roles.WRITE),
        reader=read.reader, consume=read.consume, admin=read.admin, deleter=read.deleter,
        groups=read.groups, positions=positions, producing=producing,
        consuming=Consuming(s.limits, s.answer_encodings, read.consume, positions,
                            read.groups, topics, process.consume_metrics),
        streaming=Streaming(s.limits, process.health, read.consume, positions, topics,
                            process.consume_metrics),
        on_drain=_drain_steps(read, cluster))


def _drain_steps(read: ReadSide, cluster: ClusterSide | None) -> tuple[DrainStep, ...]:
    steps: list[DrainStep] = []
    if roles.refusal_of(read.consume) is None:
        consume = read.consume

        async def release() -> None:  # parked long-polls answer at once
            consume.release()

        steps.append(release)
    if cluster is not None:  # peers move our partitions while we drain
        steps.append(cluster.leave)
    return tuple(steps)


async def _open_cache(s: Settings, oxia: OxiaStore, layout: KeyLayout,
                      stack: contextlib.AsyncExitStack) -> TailCache:
    """The tail cache, of this store (a shared directory may hold another's), closed
    with ``stack``."""
    store_id = store_id_of(s.s3_bucket, s.root_prefix, await store_identity(oxia, layout))
    tc = s.tail_cache
    cache = open_tail_cache(tc.tail_cache_dir, tc.tail_cache_max_bytes, store_id=store_id,
                            max_partitions=tc.tail_cache_max_partitions)
    stack.callback(cache.close)
    return cache


def _topic_directory(rules: TopicSettings, oxia: OxiaStore, layout: KeyLayout
                     ) -> TopicDirectory:
    return TopicDirectory(
        TopicCatalog(oxia, layout), auto_create=rules.auto_create_topics,
        auto_partitions=rules.auto_create_partitions, ttl_s=rules.topic_cache_ttl_s,
        max_partitions=rules.max_topic_partitions,
        default_config=default_topic_config(rules.topic_default_compression))


async def _start_batcher(process: BrokerProcess, writer: LogWriter, cache: TailCache,
                         watch: PartitionWatch, tg: anyio.abc.TaskGroup) -> Batcher:
    """The write role's batcher, flushing through ``writer``; what it commits goes into
    the tail cache and wakes the partition's waiters."""
    join_bytes = join_max_bytes(process.settings.tail_cache.tail_cache_max_bytes)

    def cache_put(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
        # A partition's small groups committed in a row: one put (app/tailcache/flush_puts.py).
        for tp, start_offset, records, append_time_ms in flush_puts(committed, join_bytes):
            cache.put(tp, start_offset, records, append_time_ms)

    async def on_committed(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
        await run_cache_write(cache, cache_put, committed)
        for group, _ in committed:
            watch.notify(group.tp)

    b = process.settings.batching
    batcher = Batcher(
        writer.append_shared, max_bytes=b.batch_max_bytes,
        max_delay_s=b.batch_max_delay_ms / 1000, buffer_max_bytes=b.batch_buffer_max_bytes,
        max_inflight_flushes=b.batch_max_inflight,
        eager_flushes=min(b.batch_eager_flushes, b.batch_max_inflight),
        metrics=BatcherMetrics(process.registry),
        on_committed=on_committed)
    await tg.start(process.health.watched, batcher.run)
    return batcher


async def _start_loops(process: BrokerProcess, oxia: OxiaStore, s3: S3Store,
                       cache: TailCache, tg: anyio.abc.TaskGroup) -> None:
    """The loops every broker runs beside its roles' (compaction with that role)."""
    s, watched = process.settings, process.health.watched
    if s.has_role("compact"):
        await tg.start(watched, functools.partial(
            run_in_broker, s, oxia, s3, process.registry))
    install_test_blocker()  # only with LLOG_TEST_LOOP_BLOCKER=1
    if s.loop_stall_s > 0:  # membership follows the loop, not Oxia's threads
        await tg.start(LoopWatchdog(s.loop_stall_s, end_the_process(oxia.client.close)).run)
    tg.start_soon(_scan_s3_usage, process, s3, s.s3_usage_scan_interval_s)
    if isinstance(cache, SharedTailCache):  # off the produce path
        await tg.start(watched, cache.write_behind)
    if process.registry.shared_dir is not None:  # for the other workers' scrapes
        tg.start_soon(process.registry.refresh_every, s.metrics_refresh_interval_s)


async def _scan_s3_usage(process: BrokerProcess, s3: S3Store, interval_s: float) -> None:
    """Refresh stored bytes/objects under the root prefix, rate-limited."""
    prefix = process.settings.root_prefix + "/"
    while True:
        try:
            total = count = 0
            async for obj in s3.list(prefix):
                total += obj.size
                count += 1
            process.s3_usage = S3Usage(total, count, int(time.time() * 1000))
        except LlogError as exc:
            log.warning("S3 usage scan failed: %s", exc)
        await anyio.sleep(interval_s)
