"""The console's metrics ring, on a real registry with the broker's own metric objects
and counters moved by hand between samples taken at chosen times: rates, latency
quantiles from bucket increases, counter restarts, a bounded ring, failed reads."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.broker.metrics import ConsumeMetrics, ProduceMetrics
from app.console.series import COLUMNS, MetricsRing, quantile
from app.observability import S3_REQUEST_COST
from app.routes.http_series import HttpSeries
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import SnapshotMetrics


class Broker:
    """The series the ring reads, registered as the broker registers them."""

    def __init__(self) -> None:
        self.registry = ServiceRegistry()
        self.produce = ProduceMetrics(self.registry)
        self.consume = ConsumeMetrics(self.registry)
        self.http = HttpSeries(self.registry, namespace="llog")
        self.s3 = Counter("llog_s3_requests", "S3", ["op", "outcome"], registry=self.registry)
        self.cost = 0.0
        self.registry.register(SnapshotMetrics(
            "llog_s3", lambda: {"estimated_request_cost_usd": self.cost},
            [S3_REQUEST_COST]))


def last(ring: MetricsRing, column: str) -> Any:
    return ring.snapshot()["series"][column][-1]


async def test_rates_per_second_over_the_interval() -> None:
    b = Broker()
    ring = MetricsRing(b.registry)
    assert await ring.sample(1_000)
    first = ring.snapshot()["series"]
    assert first["t_ms"] == [1_000]
    assert all(first[c] == [None] for c in COLUMNS if c not in (
        "s3_requests_per_s", "compaction_lag_records"))
    assert first["s3_requests_per_s"] == {}

    b.produce.records.inc(40)
    b.produce.bytes.inc(4000)
    b.consume.records.inc(10)
    b.consume.bytes.inc(1000)
    for _ in range(6):
        b.http.record("/produce", "POST", "200", 10, 10, 0.004)
    for _ in range(2):
        b.http.record("/consume", "POST", "200", 10, 10, 0.2)
    b.http.record("/topics", "GET", "200", 0, 10, 0.001)
    b.s3.labels("put", "ok").inc(3)
    b.s3.labels("put", "error").inc(1)
    b.s3.labels("get", "ok").inc(2)
    b.cost = 0.002
    assert await ring.sample(3_000)  # 2 s later
    assert last(ring, "produce_records_per_s") == 20
    assert last(ring, "produce_bytes_per_s") == 2000
    assert last(ring, "consume_records_per_s") == 5
    assert last(ring, "consume_bytes_per_s") == 500
    assert last(ring, "http_requests_per_s") == 4.5
    assert last(ring, "produce_requests_per_s") == 3
    assert last(ring, "consume_requests_per_s") == 1
    # A failed S3 request is billed too: counted.
    assert ring.snapshot()["series"]["s3_requests_per_s"] == {"get": [None, 1.0],
                                                              "put": [None, 2.0]}
    assert last(ring, "s3_cost_usd_per_hour") == pytest.approx(0.002 / 2 * 3600)
    assert last(ring, "compaction_lag_records") is None  # no compaction here

    b.s3.labels("list", "ok").inc(4)
    assert await ring.sample(4_000)
    series = ring.snapshot()["series"]
    # Quiet counters rate 0; an operation seen late is null before it.
    assert series["produce_records_per_s"] == [None, 20, 0]
    assert series["s3_requests_per_s"] == {"get": [None, 1.0, 0.0], "list": [None, None, 4.0],
                                           "put": [None, 2.0, 0.0]}
    assert series["produce_p50_ms"][-1] is None  # no request in the interval


async def test_latency_quantiles_from_the_buckets_gained_in_the_interval() -> None:
    b = Broker()
    ring = MetricsRing(b.registry)
    for _ in range(1000):  # before the interval: must not count
        b.produce.latency.observe(2.0)
    await ring.sample(0)
    # Produce buckets: ... 0.005, 0.01, 0.02, 0.05 ...
    for _ in range(50):
        b.produce.latency.observe(0.004)   # (0.0025, 0.005]
    for _ in range(49):
        b.produce.latency.observe(0.015)   # (0.01, 0.02]
    b.produce.latency.observe(0.04)        # (0.02, 0.05]
    b.consume.latency.observe(100)         # beyond the last bound (30 s)
    await ring.sample(2_000)
    # p50: rank 50 of 100, the top of the (2.5, 5] ms bucket.
    assert last(ring, "produce_p50_ms") == pytest.approx(5.0)
    # p99: rank 99, the top of the (10, 20] ms bucket (50 + 49 = 99).
    assert last(ring, "produce_p99_ms") == pytest.approx(20.0)
    # In +Inf: the highest finite bound, as histogram_quantile answers.
    assert last(ring, "consume_p50_ms") == pytest.approx(30_000.0)


def test_quantile_interpolates_within_the_bucket() -> None:
    inf = float("inf")
    buckets = [(0.1, 0.0), (0.5, 10.0), (1.0, 10.0), (inf, 10.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.3)  # halfway into (0.1, 0.5]
    assert quantile(0.5, [(0.1, 4.0), (inf, 4.0)]) == pytest.approx(0.05)
    assert quantile(0.99, [(0.1, 0.0), (inf, 0.0)]) is None
    assert quantile(0.5, []) is None
    # Not monotonic (increases of separate buckets across a restart): made so.
    assert quantile(0.5, [(0.1, 4.0), (0.5, 2.0), (inf, 4.0)]) == pytest.approx(0.05)


async def test_a_counter_restarted_from_zero_never_gives_a_negative_rate() -> None:
    b = Broker()
    ring = MetricsRing(b.registry)
    b.produce.records.inc(100)
    b.s3.labels("put", "ok").inc(50)
    await ring.sample(0)
    b.produce.records.inc(10)
    await ring.sample(1_000)
    assert last(ring, "produce_records_per_s") == 10

    # The component restarts: its counters begin again from zero (a new registry's
    # metrics, as a restarted worker's), and count 4 and 2 since.
    restarted = Broker()
    restarted.produce.records.inc(4)
    restarted.s3.labels("put", "ok").inc(2)
    ring.registry = restarted.registry
    await ring.sample(2_000)
    assert last(ring, "produce_records_per_s") == 4
    assert ring.snapshot()["series"]["s3_requests_per_s"]["put"][-1] == 2
    series = ring.snapshot()["series"]
    assert all(v is None or v >= 0 for c in COLUMNS if c != "s3_requests_per_s"
               for v in series[c])


async def test_the_ring_keeps_the_last_capacity_samples() -> None:
    b = Broker()
    ring = MetricsRing(b.registry, interval_s=1, capacity=3)
    for i in range(10):
        if i == 7:  # counted by the sample at 7000
            b.s3.labels("put", "ok").inc()
        await ring.sample(i * 1000)
    snapshot = ring.snapshot()
    assert snapshot["interval_s"] == 1 and snapshot["capacity"] == 3
    series = snapshot["series"]
    assert series["t_ms"] == [7000, 8000, 9000]
    assert all(len(series[c]) == 3 for c in COLUMNS if c != "s3_requests_per_s")
    assert series["s3_requests_per_s"] == {"put": [1.0, 0.0, 0.0]}
    with pytest.raises(ValueError):
        MetricsRing(b.registry, capacity=0)


async def test_the_compaction_backlog_is_its_gauge_when_the_registry_has_it() -> None:
    b = Broker()
    Gauge("llog_compaction_lag_records", "lag", registry=b.registry).set(1234)
    ring = MetricsRing(b.registry)
    await ring.sample(0)
    assert last(ring, "compaction_lag_records") == 1234


class Flaky(ServiceRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.broken = False

    async def gather(self, *, views: bool = True) -> list[Metric]:
        if self.broken:
            raise OSError("the metrics directory is gone")
        return await super().gather(views=views)


async def test_a_failed_read_is_skipped_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = Flaky()
    records = Counter("llog_produce_records", "records", registry=registry)
    now = [0.0]
    ring = MetricsRing(registry, clock=lambda: now[0])
    await ring.sample(0)
    registry.broken = True
    with caplog.at_level(logging.WARNING, logger="llog.console"):
        for i in range(1, 4):
            assert not await ring.sample(i * 1000)
        now[0] = 61.0
        assert not await ring.sample(5_000)
    warnings = [r for r in caplog.records if r.name == "llog.console"]
    assert len(warnings) == 2 and "2 more failed" in warnings[1].getMessage()
    assert ring.failures == 4
    registry.broken = False
    records.inc(60)
    assert await ring.sample(6_000)
    # The next sample's rate spans the whole gap since the last good one.
    assert ring.snapshot()["series"]["t_ms"] == [0, 6_000]
    assert last(ring, "produce_records_per_s") == 10


class CostlyView(Collector):
    """A view (a collector computing its family at scrape time) the ring has no use for."""

    def __init__(self) -> None:
        self.collected = 0

    def collect(self) -> Iterator[Metric]:
        self.collected += 1
        yield GaugeMetricFamily("llog_most_lagging", "a heap over every partition", value=1)


async def test_the_ring_leaves_the_registry_views_out() -> None:
    b = Broker()
    view = CostlyView()
    b.registry.register(view)
    b.produce.records.inc(2)
    ring = MetricsRing(b.registry)
    await ring.sample(0)
    await ring.sample(1000)
    assert view.collected == 0
    assert last(ring, "produce_records_per_s") == 0
    names = {f.name for f in await b.registry.gather()}
    assert "llog_most_lagging" in names and view.collected == 1
    assert "llog_most_lagging" not in {f.name for f in await b.registry.gather(views=False)}


async def test_run_samples_every_interval_until_cancelled() -> None:
    b = Broker()
    ring = MetricsRing(b.registry, interval_s=0.01)
    with anyio.move_on_after(0.2):
        await ring.run()
    assert 3 <= len(ring.snapshot()["series"]["t_ms"]) <= 25
