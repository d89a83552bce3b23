"""The broker's own metrics: produce and consume counters, and its identity.

Counters and histograms are registered by their owners (store clients, batcher, routes)
on the app's registry; point-in-time gauges come from statistics snapshots
(:class:`app.observability.StatisticsCollector`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector


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
                    yield GaugeMetricFamily(f"llog_loadtest_scenario_{key}",
                                            f"Load-test scenario setting {key}", value=value)
