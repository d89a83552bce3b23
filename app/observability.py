"""Observability shared by every service of the project (broker, compactor): the
``Service`` protocol of the health and metrics routes (its status: app/service_health.py),
the JSON snapshot of gathered metric families, and the S3 cost estimate with its figures.

Statistics snapshots become metrics in :mod:`app.telemetry.snapshots`; the registry
that answers a scrape, alone or for all the workers of a server, is
:class:`app.telemetry.registry.ServiceRegistry`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter
from prometheus_client.core import Metric

from app.service_health import ServiceHealth
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import Figure

# S3 Standard, us-east-1 list prices: an estimate for visibility, not a bill.
PRICE_PER_1000_PUT_LIST_USD = 0.005
PRICE_PER_1000_GET_USD = 0.0004
PRICE_PER_GB_MONTH_USD = 0.023


class Service(Protocol):
    """What the shared health and metrics routes need of a running service."""

    @property
    def health(self) -> ServiceHealth: ...

    @property
    def registry(self) -> ServiceRegistry: ...

    def identity(self) -> dict[str, Any]:
        """Fields that name this process in /health (broker_id, host, port, ...)."""
        ...

    def metrics_header(self) -> dict[str, Any]:
        """Fields heading the JSON /metrics snapshot."""
        ...


READY = Figure("ready", "1 while /health/ready answers 200 (status ok), else 0; with "
                        "several workers, 0 unless every one is", "livemin")


def readiness(health: ServiceHealth) -> dict[str, int]:
    """The statistics snapshot behind :data:`READY`."""
    return {"ready": int(health.ready)}


@dataclass
class S3Usage:
    stored_bytes: int = 0
    stored_objects: int = 0
    scanned_at_ms: int = 0


# The figures of s3_cost_estimate. Stored bytes describe the whole bucket, which every
# worker scans: the largest recent scan is the server's figure.
S3_REQUEST_COST = Figure(
    "estimated_request_cost_usd",
    "Estimated cost of the S3 requests counted in llog_s3_requests_total (S3 Standard "
    "us-east-1 list prices)", "counter")
S3_USAGE = (
    Figure("stored_bytes", "Bytes stored under the root prefix, as last listed", "livemax"),
    Figure("stored_objects", "Objects stored under the root prefix, as last listed",
           "livemax"),
    Figure("estimated_storage_cost_usd_per_month",
           "Estimated monthly storage cost of llog_s3_stored_bytes (S3 Standard us-east-1)",
           "livemax"),
    Figure("usage_scan_timestamp_seconds",
           "When the stored bytes were last listed (Unix time; 0: not yet)", "livemax"),
    Figure("estimated_raw_bytes",
           "Bytes the bucket would hold uncompressed: llog_s3_stored_bytes times the "
           "compression ratio of what this process stored (llog_stored_raw_bytes_total over "
           "llog_stored_bytes_total; 1 before it stored anything)", "livemax"),
    Figure("estimated_storage_saved_usd_per_month",
           "Estimated monthly storage cost compression saves: llog_s3_estimated_raw_bytes "
           "less llog_s3_stored_bytes, at S3 Standard us-east-1 list prices", "livemax"),
)


def s3_cost_estimate(request_counts: dict[str, float], usage: S3Usage,
                     written: tuple[float, float] = (0.0, 0.0)) -> dict[str, float]:
    """The estimate's figures from S3 requests by op, the last usage scan, and ``written``:
    (raw, stored) bytes this process stored (:func:`stored_totals`).

    Oxia requests are not priced: Oxia runs on the operator's own machines, a fixed cost
    per cluster rather than a charge per request (docs/cost.md)."""
    raw, stored = written
    ratio = raw / stored if stored > 0 and raw > 0 else 1.0
    raw_equivalent = usage.stored_bytes * ratio
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
        "usage_scan_timestamp_seconds": usage.scanned_at_ms / 1000,
        "estimated_raw_bytes": raw_equivalent,
        "estimated_storage_saved_usd_per_month": (raw_equivalent - usage.stored_bytes) / 1e9
        * PRICE_PER_GB_MONTH_USD,
    }


def stored_totals(raw_bytes: Counter, stored_bytes: Counter) -> tuple[float, float]:
    """(raw, stored) bytes over every kind of ``llog_stored_raw_bytes_total`` and
    ``llog_stored_bytes_total`` (StoreMetrics)."""
    return _total(raw_bytes), _total(stored_bytes)


def _total(counter: Counter) -> float:
    return sum(sample.value for metric in counter.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


def request_counts(s3_requests: Counter) -> dict[str, float]:
    """S3 requests by op (all outcomes: a failed request is billed too)."""
    counts: dict[str, float] = {}
    for metric in s3_requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                op = sample.labels["op"]
                counts[op] = counts.get(op, 0) + sample.value
    return counts


def json_snapshot(families: Iterable[Metric], header: dict[str, Any]) -> dict[str, Any]:
    """Every sample of ``families`` as ``{metric: {labels: value}}``, after ``header``."""
    metrics: dict[str, dict[str, float]] = {}
    for metric in families:
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            value = sample.value
            if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
                continue
            metrics.setdefault(sample.name, {})[labels] = value
    return {**header, "metrics": metrics}
