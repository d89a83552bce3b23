"""Observability shared by every service of the project (broker, compactor): point-in-time
statistics exported as gauges, the JSON snapshot of a registry, and the S3 cost estimate.

Components expose typed ``statistics()`` snapshots (dataclasses, like anyio's memory
streams); :class:`StatisticsCollector` turns the numeric fields of each snapshot into
gauges when Prometheus scrapes, so nothing has to keep gauges up to date.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# S3 Standard, us-east-1 list prices: an estimate for visibility, not a bill.
PRICE_PER_1000_PUT_LIST_USD = 0.005
PRICE_PER_1000_GET_USD = 0.0004
PRICE_PER_GB_MONTH_USD = 0.023


Status = Literal["starting", "ok", "stopping", "failed"]


class Service(Protocol):
    """What the shared health and metrics routes need of a running service."""

    status: Status
    failure: str | None
    started_at_ms: int
    registry: CollectorRegistry

    def identity(self) -> dict[str, Any]:
        """Fields that name this process in /health (broker_id, host, port, ...)."""
        ...

    def metrics_header(self) -> dict[str, Any]:
        """Fields heading the JSON /metrics snapshot."""
        ...


@dataclass
class S3Usage:
    stored_bytes: int = 0
    stored_objects: int = 0
    scanned_at_ms: int = 0


StatisticsSource = Callable[[], Any]


class StatisticsCollector(Collector):
    """Gauges ``{prefix}_{field}`` from the numeric fields of statistics snapshots,
    computed at scrape time; a source answering None (not running) adds nothing."""

    def __init__(self, sources: dict[str, tuple[str, StatisticsSource]]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for prefix, (doc, source) in self._sources.items():
            snapshot = source()
            if snapshot is None:
                continue
            for name, value in numeric_fields(snapshot).items():
                yield GaugeMetricFamily(f"{prefix}_{name}", doc, value=value)


def numeric_fields(snapshot: Any) -> dict[str, float]:
    """The numeric fields of a statistics snapshot (labels such as a state are left out)."""
    values = asdict(snapshot) if is_dataclass(snapshot) and not isinstance(snapshot, type) \
        else dict(snapshot)
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}


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
