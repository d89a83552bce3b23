"""The collector policy of server processes (app/gc_policy.py): thresholds applied, the
process frozen once started, its collections counted and exported; `llog serve` and the
compactor apply the settings, apps built in a process they do not own leave it alone."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.gc_policy import CollectorPolicy, own_process
from app.localstack.broker import wait_healthy
from app.localstack.processes import free_port
from app.localstack.stack import LocalStack
from app.telemetry.registry import ServiceRegistry
from tests.helpers.stack import BrokerFactory, compactor_process


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to this process's collector is undone after it."""
    thresholds = gc.get_threshold()
    callbacks = list(gc.callbacks)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks[:] = callbacks
        gc.unfreeze()


class Ticks:
    """A clock that moves half a second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def test_the_young_threshold_is_set_and_the_older_ones_kept(collector: None) -> None:
    _, middle, oldest = gc.get_threshold()
    CollectorPolicy(12_345, freeze_after_start=False).apply()
    assert gc.get_threshold() == (12_345, middle, oldest)


def test_zero_keeps_pythons_thresholds(collector: None) -> None:
    before = gc.get_threshold()
    CollectorPolicy(0, freeze_after_start=False).apply()
    assert gc.get_threshold() == before


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="young threshold"):
        CollectorPolicy(-1, freeze_after_start=False)


def test_collections_and_their_pauses_are_counted_by_generation(collector: None) -> None:
    policy = CollectorPolicy(0, freeze_after_start=False, clock=Ticks())
    policy.apply()
    before = policy.statistics()
    gc.collect(0)
    gc.collect(2)
    after = policy.statistics()
    policy.close()
    # Collections may also start by themselves meanwhile: at least ours were counted,
    # and every one took exactly one tick (a start and a stop read the clock once each).
    collections = after.collections - before.collections
    assert collections >= 2
    assert after.full_collections - before.full_collections >= 1
    assert after.pause_seconds - before.pause_seconds == pytest.approx(0.5 * collections)
    assert after.full_pause_seconds >= 0.5
    gc.collect(2)
    assert policy.statistics().collections == after.collections  # closed: not counted


def test_started_freezes_only_when_asked(collector: None) -> None:
    gc.unfreeze()
    CollectorPolicy(0, freeze_after_start=False).started()
    assert gc.get_freeze_count() == 0
    CollectorPolicy(0, freeze_after_start=True).started()
    assert gc.get_freeze_count() > 0


def test_the_frozen_objects_are_counted_once_when_frozen(
        collector: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting them walks every one (about 4 ms in a broker): a sample of the figures
    (the console's sampler, a /metrics scrape) does not count them again."""
    gc.unfreeze()
    policy = CollectorPolicy(0, freeze_after_start=True)
    assert policy.statistics().frozen_objects == 0
    policy.started()
    frozen = gc.get_freeze_count()  # at most what started() counted: some may have died
    assert frozen > 0

    def walk() -> int:
        raise AssertionError("the frozen objects were counted again")

    monkeypatch.setattr(gc, "get_freeze_count", walk)
    assert policy.statistics().frozen_objects >= frozen


async def test_an_app_owning_its_process_freezes_after_its_startup(collector: None) -> None:
    gc.unfreeze()
    seen: dict[str, int] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        seen["frozen during startup"] = gc.get_freeze_count()
        yield

    registry = ServiceRegistry()
    app = own_process(FastAPI(lifespan=lifespan),
                      CollectorPolicy(23_456, freeze_after_start=True), registry)
    assert gc.get_threshold()[0] == 23_456  # applied when the app is built
    async with app.router.lifespan_context(app):
        assert seen["frozen during startup"] == 0
        frozen = gc.get_freeze_count()
        assert frozen > 0
        families = {f.name: f for f in registry.collect()}
        # Counted when frozen: a frozen object that dies since leaves the permanent
        # generation (another thread of the test process may free one), not the figure.
        assert families["llog_gc_young_threshold"].samples[0].value == 23_456
        assert frozen <= families["llog_gc_frozen_objects"].samples[0].value
        assert "llog_gc_full_pause_seconds" in families
    assert all(getattr(cb, "__self__", None) is None or not isinstance(
        cb.__self__, CollectorPolicy) for cb in gc.callbacks)  # stopped counting


def _metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ") or line.startswith(name + "{")]
    assert values, f"{name} is not exported"
    return sum(values)


async def test_llog_serve_applies_the_settings(brokers: BrokerFactory) -> None:
    default = brokers.start()
    tuned = brokers.start(gc_young_threshold="12345", gc_freeze_after_start="false")
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(f"{default.url}/metrics/prometheus")).text
        assert _metric(text, "llog_gc_young_threshold") == 50_000
        assert _metric(text, "llog_gc_frozen_objects") > 0
        text = (await client.get(f"{tuned.url}/metrics/prometheus")).text
        assert _metric(text, "llog_gc_young_threshold") == 12_345
        assert _metric(text, "llog_gc_frozen_objects") == 0


async def test_the_compactor_applies_the_settings(stack: LocalStack, tmp_path: Path) -> None:
    port = free_port()
    proc = compactor_process(stack, tmp_path / "compactor-gc.log", port, LLOG_DRAIN_S="0",
                             LLOG_BROKER_ID="compactor-gc", LLOG_GC_YOUNG_THRESHOLD="34567")
    url = f"http://127.0.0.1:{port}"
    proc.start()
    try:
        await anyio.to_thread.run_sync(wait_healthy, proc, url)
        async with httpx.AsyncClient(timeout=30) as client:
            text = (await client.get(f"{url}/metrics/prometheus")).text
        assert _metric(text, "llog_gc_young_threshold") == 34_567
        assert _metric(text, "llog_gc_frozen_objects") > 0
    finally:
        proc.stop()
