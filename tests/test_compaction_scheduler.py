"""The scheduler (seeds, discovery, pool, lag), its hosts, and the compact-once command.

Each test uses its own root prefix, so discovery sees only the partitions it created.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from app.compaction.commands import compact_once_main, compact_partition
from app.compaction.metrics import CompactionMetrics
from app.compaction.scheduler import CompactionScheduler, Visit, parse_targets
from app.compaction.service import run_in_broker
from app.compactor_app import create_compactor_app
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.keys import TopicPartition
from tests.helpers.compaction import (
    Expected,
    append_batches,
    assert_compacted,
    compaction_settings,
    make_compactor,
    read_all,
)
from tests.helpers.stack import Engine, open_engine


def isolated_settings(stack: LocalStack, **overrides: Any) -> Settings:
    """A root prefix of its own (see compaction_settings) and fast passes."""
    values: dict[str, Any] = {"compaction_interval_s": 0.05,
                              "compaction_discovery_interval_s": 0.05}
    values.update(overrides)
    return compaction_settings(stack, **values)


class AllCaughtUp:
    """A visit listener: the event fires once every partition was seen with zero lag."""

    def __init__(self, tps: set[TopicPartition]) -> None:
        self.waiting = set(tps)
        self.event = anyio.Event()
        self.visits: list[Visit] = []

    def __call__(self, visit: Visit) -> None:
        self.visits.append(visit)
        if visit.lag is not None and visit.lag.records == 0 and visit.lag.high_watermark:
            self.waiting.discard(visit.tp)
        if not self.waiting:
            self.event.set()


async def _fill(e: Engine, tps: list[TopicPartition]) -> dict[TopicPartition, dict[int, bytes]]:
    return {tp: await append_batches(e.writer, tp, 3, 2, tag=str(tp)) for tp in tps}


def test_seed_targets_are_parsed_and_bad_ones_skipped() -> None:
    assert parse_targets(["orders:0", "a.b:12", "bad", "x:-1", "ok:abc", "/:1"]) == [
        TopicPartition("orders", 0), TopicPartition("a.b", 12)]


async def test_scheduler_discovers_and_compacts_partitions(stack: LocalStack) -> None:
    settings = isolated_settings(stack, compaction_concurrency=2)
    t1, t2 = f"s-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(t1, 0), TopicPartition(t1, 1), TopicPartition(t2, 0)]
    registry = CollectorRegistry()
    metrics = CompactionMetrics(registry)
    max_active = 0

    def track(step: str) -> None:
        nonlocal max_active
        max_active = max(max_active, metrics.active_tasks)

    async with open_engine(settings) as e:
        acked = await _fill(e, tps)
        caught_up = AllCaughtUp(set(tps))
        scheduler = CompactionScheduler(make_compactor(e, metrics=metrics, crash_hook=track),
                                        e.oxia, e.layout, settings, compactor_id="sched",
                                        metrics=metrics, on_visit=caught_up)
        assert scheduler.known == frozenset()  # no seeds: everything comes from discovery
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                await tg.start(scheduler.run)
                await caught_up.event.wait()
                scheduler.stop()  # graceful: run returns after the running visits
        assert scheduler.known == frozenset(tps)
        for tp in tps:
            await assert_compacted(e, tp, Expected([(1, 6)]))
            assert await read_all(e, tp) == acked[tp]
        assert 1 <= max_active <= 2
        assert all(v.error is None and not v.busy for v in caught_up.visits)
    assert registry.get_sample_value("llog_compaction_runs_total", {"action": "compacted"}) == 3
    assert registry.get_sample_value("llog_compaction_partitions_known") == 3
    assert registry.get_sample_value("llog_compaction_lag_records") == 0
    assert registry.get_sample_value("llog_compaction_claims_total", {"outcome": "acquired"})
    assert registry.get_sample_value("llog_compaction_discoveries_total", {"outcome": "ok"})
    assert registry.get_sample_value("llog_compaction_stage_seconds_count",
                                     {"stage": "read_write_blob"}) == 3


async def test_lag_gauge_keeps_only_the_top_partitions(stack: LocalStack) -> None:
    settings = isolated_settings(stack)
    topic = f"lag-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(3)]
    registry = CollectorRegistry()
    metrics = CompactionMetrics(registry, lag_top_n=2)
    async with open_engine(settings) as e:
        for p, tp in enumerate(tps):
            await append_batches(e.writer, tp, 1, p + 1)
        # Compaction needs two entries: each partition keeps its single append as lag.
        scheduler = CompactionScheduler(make_compactor(e), e.oxia, e.layout, settings,
                                        compactor_id="lag", metrics=metrics)
        scheduler.add(tps)
        visits = await scheduler.run_pass()
    assert sorted((v.tp.partition, v.lag.records if v.lag else -1) for v in visits) == [
        (0, 1), (1, 2), (2, 3)]
    per_partition = {
        s.labels["partition"]: s.value
        for m in registry.collect() if m.name == "llog_compaction_partition_lag_records"
        for s in m.samples
    }
    assert per_partition == {"2": 3, "1": 2}  # bounded to the top two
    assert registry.get_sample_value("llog_compaction_lag_records") == 6
    assert registry.get_sample_value("llog_compaction_lag_records_max") == 3


async def test_run_in_broker_compacts_seed_targets(stack: LocalStack) -> None:
    topic = f"seed-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 3)
    settings = isolated_settings(stack, compaction_seed_targets=(f"{topic}:3",),
                                 compaction_discovery_interval_s=3600)
    registry = CollectorRegistry()
    async with open_engine(settings) as e:
        acked = await append_batches(e.writer, tp, 4, 2)
        caught_up = AllCaughtUp({tp})
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                await tg.start(functools.partial(run_in_broker, settings, e.oxia, e.s3,
                                                 registry, on_visit=caught_up))
                await caught_up.event.wait()
                tg.cancel_scope.cancel()  # how the broker's shutdown ends it
        await assert_compacted(e, tp, Expected([(1, 8)]))
        assert await read_all(e, tp) == acked
        assert await e.oxia.get(e.layout.compactor_claim(tp), tp.partition_key) is None
    assert registry.get_sample_value("llog_compaction_records_total") == 8


async def _get(app: Any, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://compactor") as client:
        return await client.get(path)


async def test_service_serves_health_and_metrics_while_compacting(stack: LocalStack) -> None:
    topic = f"svc-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    settings = isolated_settings(stack, broker_id="compactor-under-test")
    app = create_compactor_app(settings)
    not_started = await _get(app, "/health")
    assert not_started.status_code == 503 and not_started.json()["status"] == "starting"

    async with open_engine(settings) as e:
        acked = await append_batches(e.writer, tp, 3, 2)
        with anyio.fail_after(60):
            async with app.router.lifespan_context(app):
                scheduler = app.state.compactor.scheduler
                caught_up = AllCaughtUp({tp})
                scheduler.listeners.append(caught_up)
                await caught_up.event.wait()
                health = await _get(app, "/health")
                snapshot = await _get(app, "/metrics")
                prometheus = await _get(app, "/metrics/prometheus")
        assert app.state.compactor.health.status == "stopping"
        await assert_compacted(e, tp, Expected([(1, 6)]))
        assert await read_all(e, tp) == acked

    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok" and body["compactor_id"] == "compactor-under-test"
    assert isinstance(body["started_at_ms"], int)
    data = snapshot.json()
    assert data["compactor_id"] == "compactor-under-test" and data["known_partitions"] >= 1
    metrics = data["metrics"]
    assert metrics["llog_compaction_runs_total"]["action=compacted"] == 1
    assert metrics["llog_compaction_records_total"][""] == 6
    assert metrics["llog_s3_requests_total"]["op=put,outcome=ok"] >= 1
    assert metrics["llog_s3_estimated_request_cost_usd_total"][""] > 0
    assert prometheus.status_code == 200
    text = prometheus.text
    assert "llog_compaction_lag_records 0.0" in text
    assert 'llog_compactor_info{' in text and "llog_compaction_stage_seconds_bucket" in text


async def test_compact_once_command(stack: LocalStack, capsys: pytest.CaptureFixture[str]
                                    ) -> None:
    settings = isolated_settings(stack)
    tp = TopicPartition(f"cli-{uuid.uuid4().hex[:8]}", 0)
    async with open_engine(settings) as e:
        acked = await append_batches(e.writer, tp, 3, 2)
        run: Callable[[], int] = functools.partial(compact_once_main, settings, tp.topic,
                                                   tp.partition)
        assert await anyio.to_thread.run_sync(run) == 0
        printed = json.loads(capsys.readouterr().out)
        assert (printed["action"], printed["end_offset"], printed["tp"]) == (
            "compacted", 6, str(tp))
        # Held claim: the command reports busy and changes nothing.
        claim = await e.oxia.put(e.layout.compactor_claim(tp), b"{}", tp.partition_key,
                                 ephemeral=True)
        assert await anyio.to_thread.run_sync(run) == 3
        assert json.loads(capsys.readouterr().out)["action"] == "busy"
        await e.oxia.delete(e.layout.compactor_claim(tp), tp.partition_key,
                            expected_version=claim)
        outcome = await compact_partition(settings, tp)
        assert outcome is not None and outcome.action == "nothing_to_do"
        await assert_compacted(e, tp, Expected([(1, 6)]))
        assert await read_all(e, tp) == acked


async def test_first_discovery_registers_uncatalogued_data_but_not_deleted_topics(
        stack: LocalStack) -> None:
    """Partitions written before the catalog existed get their topic registered; a
    deleted topic (its partitions emptied, their control records kept) stays deleted."""
    from app.storage.topic_admin import TopicAdmin
    from app.storage.topic_catalog import TopicCatalog
    from app.storage.topic_deletion import TopicDeleter

    settings = isolated_settings(stack)
    old, deleted = (f"old-{uuid.uuid4().hex[:8]}", f"del-{uuid.uuid4().hex[:8]}")
    async with open_engine(settings) as e:
        await append_batches(e.writer, TopicPartition(old, 1), 1, 2)
        await append_batches(e.writer, TopicPartition(deleted, 0), 1, 2)
        catalog = TopicCatalog(e.oxia, e.layout)
        old_topic = await catalog.get(old)
        assert old_topic is not None
        await catalog.remove(old_topic)  # as if written before the catalog existed
        await TopicDeleter(TopicAdmin(e.oxia, e.layout, e.reader, catalog),
                               by="test").delete_here(deleted)

        scheduler = CompactionScheduler(make_compactor(e), e.oxia, e.layout, settings,
                                        compactor_id="boot")
        await scheduler.discover()
        registered = {t.name: t.partitions for t in await catalog.list()}
    assert registered.get(old) == 2
    assert deleted not in registered
