"""Everything one broker process holds while it runs, built by the app's lifespan.

:func:`run_broker` opens the store clients, then starts the writer side (the batcher),
the reader side (consume service, change listener) and the background loops
(compaction, S3 usage) in task groups; on exit it stops taking produce requests, flushes
what is buffered, answers every waiter and closes everything. A background loop that
crashes takes the broker's status to ``failed`` (``/health`` answers 503) instead of
dying unseen.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from app.batching.batcher import Batcher
from app.batching.metrics import BatcherMetrics
from app.broker import roles
from app.broker.answer_budget import AnswerBudget
from app.broker.answering import READ_FACTOR
from app.broker.consume import ConsumeService
from app.broker.loop_watchdog import LoopWatchdog, end_the_process, install_test_blocker
from app.broker.metrics import (
    ANSWER_FIGURES,
    BATCHER_FIGURES,
    CONSUME_FIGURES,
    PLAN_AHEAD_FIGURES,
    READ_AHEAD_FIGURES,
    READ_OBJECT_CACHE_FIGURES,
    WATCH_FIGURES,
    BrokerInfoCollector,
    ConsumeMetrics,
    ProduceMetrics,
    tail_cache_figures,
)
from app.broker.topic_view import TopicDirectory, default_topic_config
from app.broker.watch import OxiaChangeListener, PartitionWatch
from app.cluster.fences import Fence, FenceMetrics, ForwardFences, claim_budget_for
from app.cluster.forward import ForwardClient, ForwardMetrics, ForwardServer
from app.cluster.members import BrokerMember
from app.cluster.membership import ClusterMembership
from app.cluster.router import AffinityRouter, RouterMetrics
from app.cluster.slots import member_id, take_slot
from app.compaction.service import run_in_broker
from app.errors import InvalidRequest, LlogError
from app.groups.service import GroupService
from app.observability import (
    READY,
    S3_REQUEST_COST,
    S3_USAGE,
    S3Usage,
    readiness,
    request_counts,
    s3_cost_estimate,
    stored_totals,
)
from app.service_health import ServiceHealth
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.identity import store_identity
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.reader import LogReader
from app.storage.topic_admin import TopicAdmin
from app.storage.topic_catalog import Topic, TopicCatalog
from app.storage.topic_deletion import TopicDeleter
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from app.tailcache import (
    SharedTailCache,
    TailCache,
    open_tail_cache,
    run_cache_write,
    store_id_of,
)
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import SnapshotMetrics

log = logging.getLogger(__name__)

# A peer whose forward listener could not be reached is passed over for this long.
FORWARD_SUSPECT_S = 2.0
# At shutdown, how long the lanes may take to hand what they hold to their peers, and
# the forward listener to send its last answers once the batcher has committed them.
FORWARD_DRAIN_S = 10.0


@dataclass
class BrokerState:
    settings: Settings
    registry: ServiceRegistry
    store_metrics: StoreMetrics
    produce_metrics: ProduceMetrics
    consume_metrics: ConsumeMetrics
    health: ServiceHealth = field(default_factory=ServiceHealth)
    batcher: Batcher | None = None
    consume: ConsumeService | None = None
    writer: LogWriter | None = None
    reader: LogReader | None = None
    cache: TailCache | None = None
    topics: TopicDirectory | None = None
    admin: TopicAdmin | None = None
    deleter: TopicDeleter | None = None
    groups: GroupService | None = None
    watch: PartitionWatch = field(default_factory=PartitionWatch)
    s3_usage: S3Usage = field(default_factory=S3Usage)
    # With LLOG_AFFINITY on and the write role: this worker as a cluster member.
    membership: ClusterMembership | None = None
    # "host:port" of this worker's forward listener once it listens ("": none); the
    # member record announces it (set it with set_forward_address).
    forward_address: str = ""
    forward_server: ForwardServer | None = None  # with affinity on and the write role
    # With LLOG_AFFINITY=forward: sends each produce group to its partition's preferred
    # member (app/cluster/router.py); produce appends through :meth:`append`.
    router: AffinityRouter | None = None

    @classmethod
    def create(cls, settings: Settings) -> BrokerState:
        registry = ServiceRegistry.for_this_process()
        state = cls(settings, registry, StoreMetrics(registry), ProduceMetrics(registry),
                    ConsumeMetrics(registry))
        state._register_collectors()
        return state

    async def drain(self) -> None:
        """Not ready from now on; answer parked long-polls; keep serving for the drain
        period while load balancers notice (app/drain.py)."""
        self.health.not_ready()
        if self.consume is not None:
            self.consume.release()
        if self.membership is not None:  # peers move our partitions while we drain
            try:
                await self.membership.leave()
            except (LlogError, TimeoutError) as exc:
                log.warning("could not leave the cluster (the member record goes with "
                            "the Oxia session): %r", exc)
        await anyio.sleep(self.settings.drain_s)

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """Append a produce request's groups: through the router when this worker is a
        cluster member, else into this worker's batcher."""
        if self.router is not None:
            return await self.router.submit(groups)
        return await roles.required(self.batcher, roles.WRITE).submit(groups)

    # The services of the roles: each raises RoleDisabled on a broker without its role
    # (app/broker/roles.py), so a handler never checks for one that is missing.

    def consume_service(self) -> ConsumeService:
        return roles.required(self.consume, roles.READ)

    def log_reader(self) -> LogReader:
        return roles.required(self.reader, roles.READ)

    def group_service(self) -> GroupService:
        return roles.required(self.groups, roles.GROUPS)

    def topic_admin(self) -> TopicAdmin:
        return roles.required(self.admin, roles.ADMIN)

    def topic_deleter(self) -> TopicDeleter:
        return roles.required(self.deleter, roles.ADMIN)

    def write_topics(self) -> TopicDirectory:
        """The topics produce places its entries in; RoleDisabled without the write
        role (a batcher to append through)."""
        roles.required(self.batcher, roles.WRITE)
        return roles.required(self.topics, roles.WRITE)

    async def forget_topic(self, topic: str, partitions: int = 0) -> None:
        """Forget what this process caches of a topic that changed: its entry in the
        topic directory, and the tail cache of its first ``partitions`` partitions (a
        deleted topic's)."""
        if self.topics is not None:
            self.topics.forget(topic)
        if self.cache is not None and partitions:
            # Dropping a partition may remove files (a shared cache): in a worker thread.
            await anyio.to_thread.run_sync(_drop_cached, self.cache, topic, partitions)
            # And nothing cached of them is trusted again before a read of the log.
            for p in range(partitions):
                self.watch.notify_remote(TopicPartition(topic, p))

    def set_forward_address(self, address: str) -> None:
        """This worker's forward listener listens at ``address`` ("host:port"): the
        member record announces it from now on."""
        self.forward_address = address
        if self.membership is not None:
            self.membership.update_me(address)

    def identity(self) -> dict[str, Any]:
        s = self.settings
        return {"broker_id": s.broker_id, "host": s.host, "port": s.port}

    def metrics_header(self) -> dict[str, Any]:
        s = self.settings
        return {
            "broker_id": s.broker_id, "roles": list(s.roles), "status": self.health.status,
            "started_at_ms": self.health.started_at_ms,
            "batch": {"max_bytes": s.batch_max_bytes, "max_delay_ms": s.batch_max_delay_ms,
                      "buffer_max_bytes": s.batch_buffer_max_bytes},
            "s3_prices_note": "S3 cost figures are estimates at S3 Standard us-east-1 "
                              "list prices",
        }

    def _register_collectors(self) -> None:
        s = self.settings
        info = {"broker_id": s.broker_id, "roles": ",".join(s.roles),
                "batch_max_bytes": str(s.batch_max_bytes),
                "batch_max_delay_ms": str(s.batch_max_delay_ms),
                "root_prefix": s.root_prefix, "bucket": s.s3_bucket}
        scenario = json.loads(s.loadtest_scenario) if s.loadtest_scenario else None
        self.registry.register(BrokerInfoCollector(info, scenario))
        for prefix, source, figures in (
            ("llog_broker", lambda: readiness(self.health), (READY,)),
            ("llog_batcher", lambda: self.batcher.statistics() if self.batcher else None,
             BATCHER_FIGURES),
            ("llog_consume", lambda: self.consume.statistics() if self.consume else None,
             CONSUME_FIGURES),
            ("llog_answer",
             lambda: self.consume.answers.statistics() if self.consume else None,
             ANSWER_FIGURES),
            ("llog_watch", self.watch.statistics, WATCH_FIGURES),
            ("llog_tail_cache", lambda: self.cache.statistics() if self.cache else None,
             tail_cache_figures(s.tail_cache_dir is not None)),
            ("llog_read_object_cache",
             lambda: self.reader.objects.statistics() if self.reader else None,
             READ_OBJECT_CACHE_FIGURES),
            ("llog_read_ahead",
             lambda: self.reader.ahead.statistics() if self.reader else None,
             READ_AHEAD_FIGURES),
            ("llog_plan_ahead",
             lambda: self.reader.plans.statistics() if self.reader else None,
             PLAN_AHEAD_FIGURES),
            ("llog_s3", lambda: s3_cost_estimate(
                request_counts(self.store_metrics.s3_requests), self.s3_usage,
                stored_totals(self.store_metrics.stored_raw_bytes,
                              self.store_metrics.stored_bytes)),
             (S3_REQUEST_COST, *S3_USAGE)),
        ):
            self.registry.register(SnapshotMetrics(prefix, source, figures))


def _drop_cached(cache: TailCache, topic: str, partitions: int) -> None:
    for p in range(partitions):
        cache.drop(TopicPartition(topic, p))


@contextlib.asynccontextmanager
async def run_broker(state: BrokerState) -> AsyncIterator[BrokerState]:
    """Start clients and background loops; on exit flush, answer every waiter, close."""
    s = state.settings
    layout = KeyLayout(s.root_prefix, s.s3_bucket)
    async with contextlib.AsyncExitStack() as stack:
        oxia = await stack.enter_async_context(
            OxiaStore(s.oxia, state.store_metrics, identity=s.broker_id))
        s3 = await stack.enter_async_context(S3Store(s.s3, state.store_metrics))
        store_id = store_id_of(s.s3_bucket, s.root_prefix, await store_identity(oxia, layout))
        tc = s.tail_cache
        state.cache = open_tail_cache(tc.tail_cache_dir, tc.tail_cache_max_bytes,
                                      store_id=store_id,
                                      max_partitions=tc.tail_cache_max_partitions)
        stack.callback(state.cache.close)
        rules = s.topic_rules
        state.topics = TopicDirectory(
            TopicCatalog(oxia, layout), auto_create=rules.auto_create_topics,
            auto_partitions=rules.auto_create_partitions, ttl_s=rules.topic_cache_ttl_s,
            max_partitions=rules.max_topic_partitions,
            default_config=default_topic_config(rules.topic_default_compression))
        # A change seen while this process's own write of it is in flight is decided when
        # that write returns; a foreign one then wakes the partition's waiters.
        state.writer = LogWriter.from_settings(oxia, s3, layout, state.store_metrics, s.writer,
                                               on_foreign=state.watch.notify_remote)
        async with anyio.create_task_group() as writers:
            if s.has_role("write"):
                await _start_batcher(state, writers)
            # Loops that shutdown simply cancels; the batcher above is drained instead.
            async with anyio.create_task_group() as background:
                if s.has_role("read"):
                    await _start_reader(state, oxia, s3, layout, background, stack)
                if s.affinity != "off" and s.has_role("write"):
                    await _start_cluster(state, oxia, layout, background, stack)
                if s.has_role("compact"):
                    await background.start(state.health.watched, functools.partial(
                        run_in_broker, s, oxia, s3, state.registry))
                install_test_blocker()  # only with LLOG_TEST_LOOP_BLOCKER=1
                if s.loop_stall_s > 0:  # membership follows the loop, not Oxia's threads
                    await background.start(LoopWatchdog(
                        s.loop_stall_s, end_the_process(oxia.client.close)).run)
                background.start_soon(_scan_s3_usage, state, s3, s.s3_usage_scan_interval_s)
                if isinstance(state.cache, SharedTailCache):  # off the produce path
                    await background.start(state.health.watched, state.cache.write_behind)
                if state.registry.shared_dir is not None:  # for the other workers' scrapes
                    background.start_soon(state.registry.refresh_every,
                                          s.metrics_refresh_interval_s)
                state.health.serving()
                try:
                    yield state
                finally:
                    state.health.stopping()
                    await _stop_cluster(state)
                    forwarded = state.forward_server
                    if forwarded is not None:  # refuses new frames from here on
                        forwarded.close()
                    if state.batcher is not None:
                        state.batcher.close()  # flush what is buffered, answer every waiter
                    if forwarded is not None:
                        await _answer_forwarded(forwarded, state.batcher)
                    background.cancel_scope.cancel()


async def _start_batcher(state: BrokerState, tg: anyio.abc.TaskGroup) -> None:
    assert state.writer is not None and state.cache is not None
    cache, watch = state.cache, state.watch

    def cache_put(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
        for group, result in committed:
            cache.put(group.tp, result.start_offset, group.records, result.append_time_ms)

    async def on_committed(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
        await run_cache_write(cache, cache_put, committed)
        for group, _ in committed:
            watch.notify(group.tp)

    b = state.settings.batching
    state.batcher = Batcher(
        state.writer.append_shared, max_bytes=b.batch_max_bytes,
        max_delay_s=b.batch_max_delay_ms / 1000, buffer_max_bytes=b.batch_buffer_max_bytes,
        max_inflight_flushes=b.batch_max_inflight,
        eager_flushes=min(b.batch_eager_flushes, b.batch_max_inflight),
        metrics=BatcherMetrics(state.registry),
        on_committed=on_committed)
    await tg.start(state.health.watched, state.batcher.run)


async def _start_reader(state: BrokerState, oxia: OxiaStore, s3: S3Store, layout: KeyLayout,
                        tg: anyio.abc.TaskGroup, stack: contextlib.AsyncExitStack) -> None:
    s = state.settings
    assert state.writer is not None
    r, limits = s.read_path, s.limits
    answers = AnswerBudget(limits.max_answer_bytes_in_flight,
                           max_wait_s=limits.answer_bytes_wait_ms / 1000)
    state.reader = LogReader(
        oxia, s3, layout, object_cache_bytes=r.read_object_cache_bytes,
        fetch_concurrency=r.read_fetch_concurrency,
        max_concurrent_fetches=r.read_max_concurrent_fetches,
        read_ahead=r.read_ahead_max_inflight,
        wal_object_max_bytes=r.read_wal_object_max_bytes,
        # Reading ahead holds its bytes in the answers' budget, and only when they fit
        # at once.
        admit=lambda n: answers.try_hold(math.ceil(n * READ_FACTOR)))
    state.reader.run_ahead_in(tg)
    assert state.topics is not None
    state.admin = TopicAdmin(oxia, layout, state.reader, state.topics.catalog)

    async def forget_deleted(topic: Topic) -> None:
        await state.forget_topic(topic.name, topic.partitions)

    # The records go once every broker has seen the mark: its topic cache's time to
    # live, and a second for an append placed just before it to be flushed.
    state.deleter = TopicDeleter(state.admin, by=s.broker_id, on_deleted=forget_deleted,
                                 settle_s=s.topic_rules.topic_cache_ttl_s + 1,
                                 registry=state.registry)
    await tg.start(state.health.watched, state.deleter.run)
    topics = state.topics

    async def partitions_of(topic: str) -> int:
        found = await topics.topic(topic)
        return 0 if found is None or found.deleting is not None else found.partitions

    state.groups = GroupService(oxia, layout, state.reader, s.consumer_groups, partitions_of,
                                broker_id=s.broker_id, registry=state.registry)
    state.consume = ConsumeService(
        state.reader, state.cache, state.watch, state.consume_metrics,
        max_long_polls=limits.max_concurrent_long_polls,
        max_streams=limits.max_concurrent_streams, answers=answers)
    listener = OxiaChangeListener(oxia.client, layout, state.watch, state.writer.own.claims)
    stack.callback(listener.close)
    with anyio.fail_after(30):
        await tg.start(state.health.watched, listener.run)


async def _start_cluster(state: BrokerState, oxia: OxiaStore, layout: KeyLayout,
                         tg: anyio.abc.TaskGroup, stack: contextlib.AsyncExitStack) -> None:
    """Take this worker's slot, listen for forwarded appends, register as a member with
    a first view of the cluster, and route produce through the affinity router; all of
    it before the broker reports ready."""
    s, c = state.settings, state.settings.cluster
    assert state.batcher is not None
    batcher = state.batcher
    slot = await anyio.to_thread.run_sync(take_slot, state.registry.shared_dir)
    stack.callback(slot.release)
    if c.forward_advertised_address and slot.index > 0:
        # Every worker would announce the one address, and all forwards reach one of them.
        raise ValueError("LLOG_FORWARD_ADVERTISED_ADDRESS names one listener: run one "
                         "worker per process with it")
    try:
        me_id = member_id(s.broker_id, slot.index)
    except InvalidRequest:
        raise ValueError(f"LLOG_BROKER_ID {s.broker_id!r} cannot name a cluster member "
                         "(LLOG_AFFINITY): up to 60 characters of [A-Za-z0-9._-]") from None
    secret = None if c.cluster_secret is None else c.cluster_secret.get_secret_value()
    forward_metrics = ForwardMetrics(state.registry, member=me_id)

    claim_budget_s = claim_budget_for(s.oxia_request_timeout_s)
    fences = ForwardFences(oxia, layout, FenceMetrics(state.registry, member=me_id),
                           claim_budget_s=claim_budget_s)
    server = await _serve_forwarded(state, fences, secret, forward_metrics, tg, stack)
    state.forward_address = c.forward_advertised_address or server.address
    me = BrokerMember(me_id, s.broker_id, s.broker_url, state.forward_address, tuple(s.roles),
                uuid.uuid4().hex)
    state.membership = ClusterMembership(oxia, layout, me, refresh_s=c.membership_refresh_s,
                                  registry=state.registry,
                                  call_timeout_s=s.oxia_request_timeout_s * 2 + 5)
    with anyio.fail_after(30):
        await tg.start(state.health.watched, state.membership.run)

    with anyio.fail_after(30):
        await tg.start(state.health.watched, fences.run)

    def client(peer: BrokerMember) -> ForwardClient:
        # Fence tokens name this member and the client: each client counts frames anew.
        return ForwardClient(peer.forward, secret=secret,
                             deadline_s=c.forward_deadline_ms / 1000,
                             answer_timeout_s=c.forward_answer_timeout_ms / 1000,
                             metrics=forward_metrics,
                             fence_prefix=f"{me_id}.{uuid.uuid4().hex}",
                             claim_budget_s=claim_budget_s)

    state.router = AffinityRouter(
        batcher.submit, state.membership, client, lane_buffer_bytes=s.batch_buffer_max_bytes,
        lane_max_bytes=s.batch_max_bytes, suspect_s=FORWARD_SUSPECT_S,
        # A peer that hung keeps its Oxia session this long at most, then leaves the view.
        unanswered_suspect_s=s.oxia_session_timeout_ms / 1000 + c.membership_refresh_s,
        metrics=RouterMetrics(state.registry, member=me_id), fences=fences)
    await tg.start(state.health.watched, state.router.run)
    # The members split the partitions, so they split the batcher's eager flushes too:
    # together they flush about as often as one broker would at the same load.
    state.membership.on_change(lambda view: batcher.pace(view.writer_count))


async def _serve_forwarded(state: BrokerState, fences: ForwardFences, secret: str | None,
                           metrics: ForwardMetrics, tg: anyio.abc.TaskGroup,
                           stack: contextlib.AsyncExitStack) -> ForwardServer:
    """Listen for the appends other brokers forward here (until the stack closes)."""
    c, batcher = state.settings.cluster, state.batcher
    assert batcher is not None

    async def forwarded(groups: list[AppendGroup], take_by: float, fence: Fence,
                        window_s: float) -> list[AppendOutcome]:
        # Appended here, never forwarded again: views that disagree cannot bounce records.
        # Stored as this broker's cached view of each topic says (a frame carries none).
        # A flush writes them only once it has taken their fence, and commits them only
        # with a control version it read within the frame's window (app/cluster/fences.py).
        assert state.topics is not None
        stored = await state.topics.stored_as(groups)
        return await batcher.enqueue(stored, take_by=take_by,
                                     claim=functools.partial(fences.take, fence),
                                     commit_within_s=window_s)

    server = ForwardServer(forwarded, host=c.forward_host, port=c.forward_port,
                           secret=secret, metrics=metrics)
    with anyio.fail_after(30):
        await tg.start(state.health.watched, server.run)
    stack.callback(server.close)
    state.forward_server = server  # closed first at shutdown, and its frames answered
    return server


async def _stop_cluster(state: BrokerState) -> None:
    """Before the batcher closes: new groups are appended here, and what the lanes hold
    goes out (or falls back here, into the still open batcher)."""
    router, state.router = state.router, None
    if router is None:
        return
    router.close()
    with anyio.move_on_after(FORWARD_DRAIN_S, shield=True):
        await router.stopped.wait()


async def _answer_forwarded(server: ForwardServer, batcher: Batcher | None) -> None:
    """Until every frame the forward server took is answered: once the batcher's last
    flushes have committed them (however long they take: shutdown waits for the batcher
    anyway), the answers have FORWARD_DRAIN_S to go out. A frame cut off unanswered
    leaves its forwarder in doubt, and its client sends again what may well be committed
    already."""
    if batcher is not None:
        await batcher.finished.wait()
    with anyio.move_on_after(FORWARD_DRAIN_S, shield=True):
        await server.stopped.wait()


async def _scan_s3_usage(state: BrokerState, s3: S3Store, interval_s: float) -> None:
    """Refresh stored bytes/objects under the root prefix, rate-limited."""
    prefix = state.settings.root_prefix + "/"
    while True:
        try:
            total = count = 0
            async for obj in s3.list(prefix):
                total += obj.size
                count += 1
            state.s3_usage = S3Usage(total, count, int(time.time() * 1000))
        except LlogError as exc:
            log.warning("S3 usage scan failed: %s", exc)
        await anyio.sleep(interval_s)

