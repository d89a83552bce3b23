"""A broker with several workers reports its totals, whichever worker answers a scrape:
directly, through a real proxy, and after a worker died and was replaced."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from app.localstack.processes import free_port
from app.localstack.proxy import ProxyConfig, find_binary, proxy_process, wait_serving
from tests.helpers.bodies import produce_body
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = pytest.mark.slow  # multi-worker servers, a proxy, a killed worker

LONG_POLL_SLOTS = 7  # per worker, so that the sum over two workers is recognisable
MAX_CONCURRENT = 64
SCRAPES = 6
CONCURRENT = 8


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """One scrape on a connection of its own (so the kernel picks the worker anew)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/metrics/prometheus")
        r.raise_for_status()
        return _samples(r.text)


async def _json_totals(url: str) -> dict[str, dict[str, float]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        metrics: dict[str, dict[str, float]] = (await client.get("/metrics")).json()["metrics"]
        return metrics


def _produced(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> tuple[float, ...]:
    return (samples.get(("llog_produce_requests_total", frozenset({("status", "200")})), 0.0),
            samples.get(("llog_produce_records_total", frozenset()), 0.0),
            samples.get(("llog_http_requests_total", frozenset(
                {("handler", "/produce"), ("method", "POST"), ("status", "200")})), 0.0))


def _produce_counts_by_worker(metrics_dir: Path) -> dict[str, float]:
    """Produce requests counted in each worker's own file of the shared directory."""
    counts: dict[str, float] = {}
    for path in metrics_dir.glob("*/counter_*.db"):
        for family in MultiProcessCollector.merge([str(path)]):  # type: ignore[no-untyped-call]
            for sample in family.samples:
                if sample.name == "llog_produce_requests_total":
                    counts[path.stem] = counts.get(path.stem, 0.0) + sample.value
    return counts


async def _produce_until_both_workers_served(url: str, topic: str, metrics_dir: Path,
                                             at_least: int) -> int:
    """Produce requests, each on a fresh connection, until both workers served some
    (and at least ``at_least`` were sent); returns how many were sent. They go in
    concurrent rounds: a proxy keeps its upstream connections, and opens more only for
    requests that overlap."""
    sent = 0
    concurrent = CONCURRENT

    async def one(value: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.post("/produce", json=produce_body(topic, value))
            assert r.status_code == 200, r.text

    with anyio.fail_after(120):
        while sent < at_least or len(_produce_counts_by_worker(metrics_dir)) < 2:
            async with anyio.create_task_group() as tg:
                for i in range(concurrent):
                    tg.start_soon(one, f"r{sent + i}")
            sent += concurrent
            # A proxy reuses the upstream connections it has (all of them may have gone
            # to one worker): more overlapping requests make it open new ones.
            concurrent = min(2 * concurrent, MAX_CONCURRENT)
    return sent


def _start(brokers: BrokerFactory, tmp_path: Path) -> tuple[Broker, Path]:
    metrics_dir = tmp_path / "metrics"
    broker = brokers.start(workers=2, metrics_dir=str(metrics_dir),
                           max_concurrent_long_polls=str(LONG_POLL_SLOTS))
    return broker, metrics_dir


async def test_every_scrape_of_two_workers_reports_the_totals(
        brokers: BrokerFactory, tmp_path: Path, topic: str) -> None:
    broker, metrics_dir = _start(brokers, tmp_path)
    sent = await _produce_until_both_workers_served(broker.url, topic, metrics_dir, 20)
    assert all(n < sent for n in _produce_counts_by_worker(metrics_dir).values())

    scrapes = [await _scrape(broker.url) for _ in range(SCRAPES)]
    assert {_produced(s) for s in scrapes} == {(sent, sent, sent)}
    # Per-worker gauges are summed over the live workers.
    slots = {s[("llog_consume_long_poll_slots", frozenset())] for s in scrapes}
    assert slots == {2 * LONG_POLL_SLOTS}
    for _ in range(SCRAPES):
        metrics = await _json_totals(broker.url)
        assert metrics["llog_produce_requests_total"] == {"status=200": sent}
        assert metrics["llog_produce_records_total"] == {"": sent}


async def test_a_dead_worker_keeps_its_counts_and_drops_its_gauges(
        brokers: BrokerFactory, tmp_path: Path, topic: str) -> None:
    broker, metrics_dir = _start(brokers, tmp_path)
    sent = await _produce_until_both_workers_served(broker.url, topic, metrics_dir, 10)
    workers = psutil.Process(broker.process.pid).children()
    victim = next(p for p in workers if "spawn_main" in " ".join(p.cmdline()))
    os.kill(victim.pid, signal.SIGKILL)

    # The supervisor replaces it; its live gauge file goes, its counters stay. Another
    # process's state is polled: there is no event to wait on across processes.
    with anyio.fail_after(60):
        while True:
            gone = not list(metrics_dir.glob(f"*/gauge_livesum_{victim.pid}.db"))
            scrape = await _scrape(broker.url)
            if gone and scrape.get(("llog_consume_long_poll_slots", frozenset())) == \
                    2 * LONG_POLL_SLOTS and len(list(metrics_dir.glob("*/counter_*.db"))) == 3:
                break
            await anyio.sleep(0.2)
    for _ in range(SCRAPES):
        assert _produced(await _scrape(broker.url)) == (sent, sent, sent)


@contextlib.contextmanager
def _caddy_in_front_of(broker: Broker, run_dir: Path) -> Iterator[str]:
    binary = find_binary("caddy")
    assert binary is not None
    port = int(broker.url.rsplit(":", 1)[1])
    config = ProxyConfig("caddy", free_port(), [("127.0.0.1", port)], 16 * 1024 * 1024,
                         run_dir)
    proc = proxy_process(config, binary)
    proc.start()
    try:
        wait_serving(proc, config)
        yield f"http://127.0.0.1:{config.listen_port}"
    finally:
        proc.stop()


async def test_scrapes_through_a_proxy_agree_with_the_direct_ones(
        brokers: BrokerFactory, tmp_path: Path, topic: str) -> None:
    broker, metrics_dir = _start(brokers, tmp_path)
    with _caddy_in_front_of(broker, tmp_path / "caddy") as proxied:
        sent = await _produce_until_both_workers_served(proxied, topic, metrics_dir, 20)
        through_proxy: list[tuple[float, ...]] = []

        async def scrape() -> None:
            through_proxy.append(_produced(await _scrape(proxied)))

        for _ in range(2):  # overlapping, so the proxy uses several upstream connections
            async with anyio.create_task_group() as tg:
                for _ in range(SCRAPES):
                    tg.start_soon(scrape)
        direct = [_produced(await _scrape(broker.url)) for _ in range(SCRAPES)]
    assert set(through_proxy) == set(direct) == {(sent, sent, sent)}
