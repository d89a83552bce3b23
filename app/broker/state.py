"""Everything one broker process holds while it runs, built by the app's lifespan."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from app.batching.batcher import Batcher
from app.batching.metrics import BatcherMetrics
from app.broker.consume import ConsumeService
from app.broker.metrics import (
    ConsumeMetrics,
    ProduceMetrics,
    S3Usage,
    SnapshotCollector,
    request_counts,
    s3_cost_estimate,
    stats_dict,
)
from app.broker.watch import OxiaChangeListener, PartitionWatch
from app.compaction.service import run_in_broker
from app.errors import LlogError
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import KeyLayout
from app.storage.metrics import StoreMetrics
from app.storage.oxia_store import OxiaStore
from app.storage.reader import LogReader
from app.storage.s3 import S3Store
from app.storage.writer import LogWriter
from app.tailcache import TailCache, open_tail_cache, run_cache_io

log = logging.getLogger(__name__)
Status = Literal["starting", "ok", "stopping", "failed"]


@dataclass
class BrokerState:
    settings: Settings
    registry: CollectorRegistry
    store_metrics: StoreMetrics
    produce_metrics: ProduceMetrics
    consume_metrics: ConsumeMetrics
    started_at_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    status: Status = "starting"
    batcher: Batcher | None = None
    consume: ConsumeService | None = None
    writer: LogWriter | None = None
    reader: LogReader | None = None
    cache: TailCache | None = None
    watch: PartitionWatch = field(default_factory=PartitionWatch)
    s3_usage: S3Usage = field(default_factory=S3Usage)
    failure: str | None = None

    @classmethod
    def create(cls, settings: Settings) -> BrokerState:
        registry = CollectorRegistry()
        return cls(settings, registry, StoreMetrics(registry), ProduceMetrics(registry),
                   ConsumeMetrics(registry))


def _info(settings: Settings) -> dict[str, str]:
    return {
        "broker_id": settings.broker_id,
        "roles": ",".join(settings.roles),
        "batch_max_bytes": str(settings.batch_max_bytes),
        "batch_max_delay_ms": str(settings.batch_max_delay_ms),
        "root_prefix": settings.root_prefix,
        "bucket": settings.s3_bucket,
    }


def _register_gauges(state: BrokerState) -> None:
    def batcher() -> dict[str, float]:
        return stats_dict(state.batcher.statistics()) if state.batcher else {}

    def consume() -> dict[str, float]:
        return {
            "long_polls": float(state.consume.long_polls if state.consume else 0),
            "watched_partitions": float(state.watch.watched_partitions),
            "remote_changes": float(state.watch.remote_changes),
        }

    def cache() -> dict[str, float]:
        return stats_dict(state.cache.statistics()) if state.cache else {}

    def objects() -> dict[str, float]:
        if state.reader is None:
            return {}
        return stats_dict(state.reader.objects.statistics())

    def s3() -> dict[str, float]:
        return s3_cost_estimate(request_counts(state.store_metrics.s3_requests),
                                state.s3_usage)

    scenario = (json.loads(state.settings.loadtest_scenario)
                if state.settings.loadtest_scenario else None)
    state.registry.register(SnapshotCollector(_info(state.settings), {
        "llog_batcher": ("Produce batcher queue (point in time)", batcher),
        "llog_consume": ("Consume long-polls (point in time)", consume),
        "llog_tail_cache": ("Tail cache statistics", cache),
        "llog_read_object_cache": ("Compacted/legacy objects kept between reads", objects),
        "llog_s3": ("S3 usage and estimated cost (S3 Standard us-east-1 list prices)", s3),
    }, scenario))


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


@contextlib.asynccontextmanager
async def run_broker(state: BrokerState) -> AsyncIterator[BrokerState]:
    """Start clients and background loops; on exit flush, answer every waiter, close."""
    s = state.settings
    _register_gauges(state)
    layout = KeyLayout(s.root_prefix, s.s3_bucket)
    async with contextlib.AsyncExitStack() as stack:
        oxia = await stack.enter_async_context(OxiaStore(s, state.store_metrics))
        s3 = await stack.enter_async_context(S3Store(s, state.store_metrics))
        state.cache = open_tail_cache(s.tail_cache_dir, s.tail_cache_max_bytes)
        stack.callback(state.cache.close)
        writer = LogWriter(oxia, s3, layout, state.store_metrics,
                           max_attempts=s.commit_max_attempts,
                           commit_horizon_ms=s.retry_horizon_safe_ms,
                           pending_reread_ms=s.compaction_min_entry_age_ms // 2)
        await stack.enter_async_context(writer)
        state.writer = writer

        cache = state.cache

        def cache_put(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
            for group, result in committed:
                cache.put(group.tp, result.start_offset, list(group.records))

        async def on_committed(committed: list[tuple[AppendGroup, AppendResult]]) -> None:
            await run_cache_io(cache, cache_put, committed)
            for group, _ in committed:
                state.watch.notify(group.tp)

        async with anyio.create_task_group() as tg:
            if s.has_role("write"):
                state.batcher = Batcher(
                    writer.append_shared,
                    max_bytes=s.batch_max_bytes,
                    max_delay_s=s.batch_max_delay_ms / 1000,
                    buffer_max_bytes=s.batch_buffer_max_bytes,
                    max_inflight_flushes=s.batch_max_inflight,
                    metrics=BatcherMetrics(state.registry),
                    on_committed=on_committed,
                )
                await tg.start(_watched, state, state.batcher.run)
            # Loops that shutdown simply cancels; the batcher above is drained instead.
            async with anyio.create_task_group() as background:
                if s.has_role("read"):
                    state.reader = LogReader(
                        oxia, s3, layout, object_cache_bytes=s.read_object_cache_bytes,
                        fetch_concurrency=s.read_fetch_concurrency,
                        max_concurrent_fetches=s.read_max_concurrent_fetches)
                    state.consume = ConsumeService(
                        state.reader, state.cache, state.watch,
                        state.consume_metrics, max_long_polls=s.max_concurrent_long_polls,
                    )
                    listener = OxiaChangeListener(oxia.client, layout, state.watch,
                                                  writer.owns_version)
                    stack.callback(listener.close)
                    with anyio.fail_after(30):
                        await background.start(_watched, state, listener.run)
                if s.has_role("compact"):
                    await background.start(_watched, state, functools.partial(
                        run_in_broker, s, oxia, s3, state.registry))
                background.start_soon(_scan_s3_usage, state, s3, s.s3_usage_scan_interval_s)
                state.status = "ok"
                try:
                    yield state
                finally:
                    state.status = "stopping"
                    if state.batcher is not None:
                        state.batcher.close()  # flush what is buffered, answer every waiter
                    background.cancel_scope.cancel()


async def _watched(state: BrokerState, run: Callable[..., Awaitable[None]], *,
                   task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run a background loop; if it crashes, the broker reports itself failed."""
    try:
        await run(task_status=task_status)
    except Exception as exc:
        state.status = "failed"
        state.failure = repr(exc)
        log.exception("background loop %s crashed", getattr(run, "__qualname__", run))
        raise
