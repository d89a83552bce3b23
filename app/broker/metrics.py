"""The broker's metrics: one registry per app, a Prometheus endpoint and a JSON snapshot.

Counters and histograms are registered by their owners (store clients, batcher, routes);
point-in-time gauges (batcher queue, long-polls, tail cache, S3 usage and its estimated
cost) are read when scraped through a custom collector, so nothing has to keep them
up to date.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

# S3 Standard, us-east-1 list prices: an estimate for visibility, not a bill.
PRICE_PER_1000_PUT_LIST_USD = 0.005
PRICE_PER_1000_GET_USD = 0.0004
PRICE_PER_GB_MONTH_USD = 0.023


class ProduceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("llog_produce_requests", "Produce requests by HTTP status",
                                ["status"], registry=registry)
        self.records = Counter("llog_produce_records", "Records acknowledged by produce",
                               registry=registry)
        self.bytes = Counter("llog_produce_bytes", "Record bytes acknowledged by produce",
                             registry=registry)
        self.failed_entries = Counter(
            "llog_produce_failed_entries", "Produce entries that failed, by error type",
            ["error_type"], registry=registry,
        )
        self.latency = Histogram(
            "llog_produce_seconds", "Produce latency, request parsed to answer",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )


class ConsumeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("llog_consume_requests", "Consume requests", registry=registry)
        self.records = Counter("llog_consume_records", "Records returned by consume",
                               registry=registry)
        self.bytes = Counter("llog_consume_bytes", "Record bytes returned by consume",
                             registry=registry)
        self.failed_entries = Counter(
            "llog_consume_failed_entries", "Consume entries that failed, by error type",
            ["error_type"], registry=registry,
        )
        self.cache = Counter("llog_consume_cache_lookups",
                             "Tail cache lookups: hit, tail (known empty) or miss",
                             ["result"], registry=registry)
        self.long_poll_wakeups = Counter("llog_consume_long_poll_wakeups",
                                         "Long-poll wake-ups", registry=registry)
        self.long_polls_refused = Counter(
            "llog_consume_long_polls_unqueued",
            "Consume requests answered without waiting because every long-poll slot was taken",
            registry=registry,
        )
        self.latency = Histogram(
            "llog_consume_seconds", "Consume latency including long-poll waits",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


@dataclass
class S3Usage:
    stored_bytes: int = 0
    stored_objects: int = 0
    scanned_at_ms: int = 0


GaugeSource = Callable[[], dict[str, float]]


class SnapshotCollector(Collector):
    """Gauges computed at scrape time from callables, plus the broker's identity and, in
    load-test runs, the scenario it runs under."""

    def __init__(self, info: dict[str, str], gauges: dict[str, tuple[str, GaugeSource]],
                 scenario: dict[str, Any] | None = None):
        self._info = info
        self._gauges = gauges
        self._scenario = scenario or {}

    def collect(self) -> Iterator[Metric]:
        info = InfoMetricFamily("llog_broker", "Broker identity, roles and batch settings")
        info.add_metric([], self._info)
        yield info
        if self._scenario:
            labels = {k: str(v) for k, v in self._scenario.items()
                      if isinstance(v, str | bool) or v is None}
            scenario = InfoMetricFamily("llog_loadtest_scenario", "Load-test scenario of this run")
            scenario.add_metric([], labels)
            yield scenario
            for key, value in self._scenario.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    yield GaugeMetricFamily(f"llog_loadtest_scenario_{key}",
                                            f"Load-test scenario setting {key}", value=value)
        for prefix, (doc, source) in self._gauges.items():
            for name, value in source().items():
                yield GaugeMetricFamily(f"{prefix}_{name}", doc, value=value)


def s3_cost_estimate(request_counts: dict[str, float], usage: S3Usage) -> dict[str, float]:
    put_list = request_counts.get("put", 0) + request_counts.get("list", 0)
    gets = (request_counts.get("get", 0) + request_counts.get("range_get", 0)
            + request_counts.get("head", 0))
    return {
        "estimated_request_cost_usd": put_list / 1000 * PRICE_PER_1000_PUT_LIST_USD
        + gets / 1000 * PRICE_PER_1000_GET_USD,
        "stored_bytes": float(usage.stored_bytes),
        "stored_objects": float(usage.stored_objects),
        "estimated_storage_cost_usd_per_month": usage.stored_bytes / 1e9
        * PRICE_PER_GB_MONTH_USD,
        "usage_scanned_at_ms": float(usage.scanned_at_ms),
    }


def request_counts(s3_requests: Counter) -> dict[str, float]:
    """S3 requests by op (all outcomes: a failed request is billed too)."""
    counts: dict[str, float] = {}
    for metric in s3_requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                op = sample.labels["op"]
                counts[op] = counts.get(op, 0) + sample.value
    return counts


def json_snapshot(registry: CollectorRegistry, header: dict[str, Any]) -> dict[str, Any]:
    """Every sample of the registry as ``{metric: {labels: value}}``, after ``header``."""
    metrics: dict[str, dict[str, float]] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            value = sample.value
            if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
                continue
            metrics.setdefault(sample.name, {})[labels] = value
    return {**header, "metrics": metrics}


def stats_dict(stats: Any) -> dict[str, float]:
    """The numeric fields of a statistics snapshot (labels such as a state are left out)."""
    return {k: float(v) for k, v in asdict(stats).items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
