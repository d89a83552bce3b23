"""Batcher statistics exported as metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SIZE_BUCKETS = (1024, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class BatcherMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.flushes = Counter("llog_batcher_flushes", "Flushes (one shared blob each)",
                               registry=registry)
        self.flush_bytes = Histogram("llog_batcher_flush_bytes", "Record bytes per flush",
                                     buckets=_SIZE_BUCKETS, registry=registry)
        self.flush_waiters = Histogram(
            "llog_batcher_flush_requests", "Produce requests coalesced per flush",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=registry,
        )
        self.flush_partitions = Histogram(
            "llog_batcher_flush_partitions", "Topic-partitions per flush",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=registry,
        )
        self.flush_seconds = Histogram("llog_batcher_flush_seconds", "Flush duration",
                                       buckets=_TIME_BUCKETS, registry=registry)
        self.eager_share = Gauge(
            "llog_batcher_eager_flushes",
            "Flushes of a batch below the size threshold this process may have in flight "
            "(its share of LLOG_BATCH_EAGER_FLUSHES; below 1, flush starts are spaced)",
            registry=registry)
        self.rejected = Counter("llog_batcher_rejected",
                                "Produce requests refused because the buffer was full",
                                registry=registry)
        self.sequence_holds = Counter(
            "llog_batcher_sequence_holds",
            "Produce requests read before the one holding their producer's previous "
            "group, held for it (outcome: in_order, it came; timed_out, not in time)",
            ["outcome"], registry=registry)

    def sequence_held(self, in_time: bool) -> None:
        self.sequence_holds.labels("in_order" if in_time else "timed_out").inc()

    def observe_flush(self, size: int, waiters: int, partitions: int, seconds: float) -> None:
        self.flushes.inc()
        self.flush_bytes.observe(size)
        self.flush_waiters.observe(waiters)
        self.flush_partitions.observe(partitions)
        self.flush_seconds.observe(seconds)
