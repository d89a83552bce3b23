"""The broker's own metrics: produce and consume counters, the figures of its
components' statistics snapshots, and its identity.

Counters and histograms are registered by their owners (store clients, batcher, routes)
on the app's registry; point-in-time figures come from statistics snapshots
(:class:`app.telemetry.snapshots.SnapshotMetrics`), each saying how it adds up over the
workers of one server.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from app.telemetry.snapshots import Combine, Figure

BATCHER_FIGURES = (
    Figure("buffered_bytes", "Record bytes buffered for the next flush"),
    Figure("buffered_waiters", "Produce requests buffered for the next flush"),
    Figure("inflight_bytes", "Record bytes of the flushes in flight"),
    Figure("inflight_flushes", "Flushes in flight"),
)
CONSUME_FIGURES = (
    Figure("long_polls", "Consume requests waiting in a long-poll"),
    Figure("long_poll_slots",
           "Long-poll slots (LLOG_MAX_CONCURRENT_LONG_POLLS per worker process)"),
    Figure("streams", "Open event streams"),
    Figure("stream_slots",
           "Event stream slots (LLOG_MAX_CONCURRENT_STREAMS per worker process)"),
)
ANSWER_FIGURES = (
    Figure("bytes_in_flight", "Bytes held by consume answers in flight (reserved for "
                              "reads, read, or being sent)"),
    Figure("max_bytes_in_flight",
           "Budget of the answers in flight (LLOG_MAX_ANSWER_BYTES_IN_FLIGHT per worker "
           "process)"),
    Figure("peak_bytes_in_flight", "Most bytes answers in flight held at once", "livemax"),
    Figure("waiting", "Consume reads waiting for room in the answer budget"),
    Figure("refused", "Consume requests refused (503) for want of room in the answer "
                      "budget", "counter"),
)
WATCH_FIGURES = (
    Figure("watched_partitions", "Partitions that long-polls wait on"),
    Figure("waiters", "Long-polls waiting on partitions"),
    Figure("stale_partitions", "Partitions changed by other writers, remembered"),
    Figure("remote_changes", "Changes by other writers seen in Oxia notifications",
           "counter"),
)
READ_OBJECT_CACHE_FIGURES = (
    Figure("items", "Compacted objects and chunks kept between reads"),
    Figure("bytes", "Bytes of the objects and chunks kept between reads"),
    Figure("max_bytes", "Budget of the object cache (LLOG_READ_OBJECT_CACHE_BYTES per "
                        "worker process)"),
    Figure("hits", "Object cache lookups answered from memory", "counter"),
    Figure("misses", "Object cache lookups that downloaded", "counter"),
    Figure("evictions", "Objects and chunks dropped to stay within the budget", "counter"),
    Figure("wal_objects_read", "Shared WAL objects read whole, once for all their slices",
           "counter"),
    Figure("wal_slices_served", "WAL slices taken from a shared WAL object read whole "
                                "(kept, or read for several slices at once)", "counter"),
)


READ_AHEAD_FIGURES = (
    Figure("inflight", "Compacted blobs being read ahead (the chunks after a read)"),
    Figure("max_inflight", "Most blobs read ahead at once (LLOG_READ_AHEAD_MAX_INFLIGHT)"),
    Figure("started", "Read-aheads started", "counter"),
    Figure("failed", "Read-aheads that failed (the next read fetched for itself)",
           "counter"),
    Figure("declined", "Read-aheads not started: the answer budget had no room for "
           "them at once", "counter"),
)
PLAN_AHEAD_FIGURES = (
    Figure("kept", "Lookups (control record, first index page) made ahead of a "
                   "consumer's next read, under way or done"),
    Figure("max_kept", "Most lookups kept ahead (LLOG_READ_AHEAD_MAX_INFLIGHT)"),
    Figure("started", "Lookups made ahead", "counter"),
    Figure("taken", "Reads that took a lookup made ahead instead of reading Oxia",
           "counter"),
    Figure("failed", "Lookups made ahead that failed (the read looked up for itself)",
           "counter"),
    Figure("reused", "Lookups of partitions an answer had no room for, kept for the "
                     "next read of the same offset", "counter"),
)


def tail_cache_figures(shared_dir: bool) -> tuple[Figure, ...]:
    """A tail cache in a directory shared by the workers is seen the same by each (the
    largest view is the server's); one in memory belongs to its worker (summed)."""
    size: Combine = "livemax" if shared_dir else "livesum"
    behind = (
        Figure("pending_writes", "Puts waiting to be written to the shared directory",
               "livesum"),
        Figure("dropped_writes", "Puts not written to the shared directory because "
               "too many were waiting (other workers' consumers read the log instead)",
               "counter"),
    ) if shared_dir else ()
    return (*behind,
        Figure("partitions", "Partitions with cached records", size),
        Figure("segments", "Stored pieces of cached records", size),
        Figure("records", "Cached records", size),
        Figure("bytes", "Bytes of cached records", size),
        Figure("hits", "Tail cache lookups answered (records or known empty)", "counter"),
        Figure("misses", "Tail cache lookups not answered", "counter"),
        Figure("evictions", "Records dropped to stay within LLOG_TAIL_CACHE_MAX_BYTES",
               "counter"),
    )


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
        self.streams = Counter("llog_stream_connections",
                               "Event streams, by how they ended (or refused: no slot)",
                               ["outcome"], registry=registry)
        self.stream_events = Counter("llog_stream_events",
                                     "Events sent on streams: records, heartbeat, end, error",
                                     ["event"], registry=registry)
        self.latency = Histogram(
            "llog_consume_seconds", "Consume latency including long-poll waits",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )


class BrokerInfoCollector(Collector):
    """The broker's identity and, in load-test runs, the scenario it runs under."""

    def __init__(self, info: dict[str, str], scenario: dict[str, Any] | None = None):
        self._info = info
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
                    name, value = _in_seconds(key, value)
                    yield GaugeMetricFamily(f"llog_loadtest_scenario_{name}",
                                            f"Load-test scenario setting {key}", value=value)


def _in_seconds(key: str, value: float) -> tuple[str, float]:
    """Times are exported in seconds: ``duration_s`` -> ``duration_seconds``,
    ``max_delay_ms`` -> ``max_delay_seconds`` (value / 1000)."""
    if key.endswith("_ms"):
        return key.removesuffix("_ms") + "_seconds", value / 1000
    if key.endswith("_s"):
        return key.removesuffix("_s") + "_seconds", value
    return key, value
