"""What a producer counts: readable as a dict (``Producer.metrics()``) and as
Prometheus samples in the text exposition format (``Producer.prometheus()``), for a
program that serves its own ``/metrics``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llog_client._accumulator import Batch

# (name, kind, help) of each sample, in the order they are exposed.
_SAMPLES = (
    ("records_sent", "counter", "records acknowledged by a broker"),
    ("record_bytes_sent", "counter", "value and key bytes of the records acknowledged"),
    ("batches_sent", "counter", "batches acknowledged"),
    ("records_failed", "counter", "records whose delivery failed"),
    ("requests", "counter", "produce requests answered or broken"),
    ("request_errors", "counter", "produce requests that failed whole"),
    ("request_bytes", "counter", "bytes of produce request bodies, as sent"),
    ("retries", "counter", "batches sent again"),
    ("request_latency_avg_ms", "gauge", "mean time from request to answer"),
    ("request_latency_max_ms", "gauge", "longest time from request to answer"),
    ("batch_records_avg", "gauge", "mean records per acknowledged batch"),
    ("batch_bytes_avg", "gauge", "mean record bytes per acknowledged batch"),
    ("buffered_bytes", "gauge", "bytes of records sent and not yet settled"),
)


@dataclass
class ProducerMetrics:
    records_sent: int = 0
    record_bytes_sent: int = 0
    batches_sent: int = 0
    records_failed: int = 0
    requests: int = 0
    request_errors: int = 0
    request_bytes: int = 0
    retries: int = 0
    latency_total_s: float = 0.0
    latency_max_s: float = 0.0

    def request(self, seconds: float, *, failed: bool) -> None:
        self.requests += 1
        self.request_errors += failed
        self.latency_total_s += seconds
        self.latency_max_s = max(self.latency_max_s, seconds)

    def delivered(self, batch: Batch) -> None:
        self.records_sent += len(batch)
        self.record_bytes_sent += batch.size
        self.batches_sent += 1

    def failed(self, batch: Batch) -> None:
        self.records_failed += len(batch)

    def snapshot(self, buffered_bytes: int) -> dict[str, float]:
        batches = self.batches_sent or 1
        return {
            "records_sent": self.records_sent, "record_bytes_sent": self.record_bytes_sent,
            "batches_sent": self.batches_sent, "records_failed": self.records_failed,
            "requests": self.requests, "request_errors": self.request_errors,
            "request_bytes": self.request_bytes, "retries": self.retries,
            "request_latency_avg_ms": 1000 * self.latency_total_s / (self.requests or 1),
            "request_latency_max_ms": 1000 * self.latency_max_s,
            "batch_records_avg": self.records_sent / batches,
            "batch_bytes_avg": self.record_bytes_sent / batches,
            "buffered_bytes": buffered_bytes,
        }


def prometheus_text(values: dict[str, float], prefix: str = "llog_producer") -> str:
    """The samples in the Prometheus text format (counters end in ``_total``)."""
    lines: list[str] = []
    for name, kind, text in _SAMPLES:
        full = f"{prefix}_{name}" + ("_total" if kind == "counter" else "")
        lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", f"{full} {values[name]}"]
    return "\n".join(lines) + "\n"
