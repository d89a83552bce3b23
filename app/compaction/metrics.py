"""Compaction metrics, registered on a registry the caller owns (never the global one).

Counters and the stage histogram are updated by the compactor and the scheduler as they
work. Per-partition lag is different: a process may know thousands of partitions, so only
the ``lag_top_n`` most lagging ones get their own labelled series
(``llog_compaction_partition_lag_records``), next to the total and the maximum over all
of them; they are computed at scrape time from the table the scheduler keeps up to date,
so a partition that catches up simply drops out.

Every scheduler observes the lag of every partition it visits, claimed by it or not, so
the lag figures describe the store, not the process: over the workers of one server the
largest is taken, and the labelled series are those of the worker that answers.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.storage.keys import TopicPartition
from app.telemetry.snapshots import Figure, SnapshotMetrics

_STAGE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DEFAULT_LAG_TOP_N = 10
LAG_FIGURES = (
    Figure("lag_records", "Records not yet compacted, over every observed partition",
           "livemax"),
    Figure("lag_records_max", "Largest number of records not yet compacted in one partition",
           "livemax"),
    Figure("partitions_pending", "Observed partitions whose meta/control holds a pending "
                                 "append", "livemax"),
    Figure("partitions_known", "Partitions this compactor knows (seeds and discovered)",
           "livemax"),
    Figure("active_tasks", "compact_once tasks running now"),
)


@dataclass(frozen=True)
class CompactionStats:
    lag_records: int
    lag_records_max: int
    partitions_pending: int
    partitions_known: int
    active_tasks: int


@dataclass(frozen=True)
class PartitionLag:
    """What compaction still has to do on one partition, as last observed."""

    high_watermark: int
    cursor: int
    pending: bool
    observed_at_ms: int

    @property
    def records(self) -> int:
        """Committed records not yet compacted: high watermark - (cursor - 1)."""
        return max(0, self.high_watermark - (self.cursor - 1))


class CompactionMetrics:
    def __init__(self, registry: CollectorRegistry, *, lag_top_n: int = DEFAULT_LAG_TOP_N
                 ) -> None:
        r = registry
        self.runs = Counter("llog_compaction_runs", "compact_once calls, by what they did",
                            ["action"], registry=r)
        self.successes = Counter(
            "llog_compaction_successes",
            "compact_once calls that compacted a range or finished an interrupted one",
            registry=r,
        )
        self.failures = Counter("llog_compaction_failures",
                                "compact_once calls that raised, by error type",
                                ["error_type"], registry=r)
        self.recoveries = Counter(
            "llog_compaction_recoveries",
            "Interrupted compactions resumed, by the state they were found in",
            ["state"], registry=r,
        )
        self.nothing_to_do = Counter("llog_compaction_nothing_to_do",
                                     "compact_once calls that found nothing worth doing",
                                     ["reason"], registry=r)
        self.candidates = Counter("llog_compaction_candidates",
                                  "Runs of WAL entries selected for compaction", registry=r)
        self.records = Counter("llog_compaction_records", "Records rewritten into compacted blobs",
                               registry=r)
        self.bytes = Counter("llog_compaction_bytes", "Bytes of compacted blobs written",
                             registry=r)
        self.entries_replaced = Counter("llog_compaction_entries_replaced",
                                        "WAL index entries replaced by compacted entries",
                                        registry=r)
        self.pending_materialised = Counter(
            "llog_compaction_pending_materialised",
            "Pending appends the compactor materialised before selecting", registry=r,
        )
        self.claims = Counter("llog_compaction_claims",
                              "meta/compactor-claim attempts: acquired, busy or lost",
                              ["outcome"], registry=r)
        self.passes = Counter("llog_compaction_passes", "Scheduler passes over known partitions",
                              registry=r)
        self.discoveries = Counter("llog_compaction_discoveries",
                                   "Partition discovery scans, by outcome", ["outcome"],
                                   registry=r)
        self._throttle_metrics(r)
        self.stage_seconds = Histogram("llog_compaction_stage_seconds",
                                       "Time spent in each compaction stage", ["stage"],
                                       buckets=_STAGE_BUCKETS, registry=r)
        self._lag: dict[TopicPartition, PartitionLag] = {}
        self._lag_top_n = lag_top_n
        self.known_partitions = 0
        self.active_tasks = 0
        registry.register(_TopLagCollector(self))
        registry.register(SnapshotMetrics("llog_compaction", self.statistics, LAG_FIGURES))

    def _throttle_metrics(self, r: CollectorRegistry) -> None:
        # The throttle (LLOG_COMPACTION_MAX_BYTES_PER_S, app/compaction/throttle.py): what
        # it charged, how long new work waited for it, and visits it ended early. With a
        # steady wait and a growing lag, compaction is slower than produce.
        self.throttle_paid_bytes = Counter(
            "llog_compaction_throttle_paid_bytes",
            "WAL bytes (as decompressed) of finished runs charged to the throttle",
            registry=r)
        self.throttle_wait_seconds = Counter(
            "llog_compaction_throttle_wait_seconds",
            "Seconds the scheduler waited for the throttle before claiming a partition",
            registry=r)
        self.throttle_visits_ended = Counter(
            "llog_compaction_throttle_visits_ended",
            "Visits that let go of their partition early because the throttle was in debt",
            registry=r)

    def stage(self, name: str) -> _StageTimer:
        return _StageTimer(self.stage_seconds, name)

    def observe_lag(self, tp: TopicPartition, lag: PartitionLag) -> None:
        self._lag[tp] = lag

    def lag_of(self, tp: TopicPartition) -> PartitionLag | None:
        return self._lag.get(tp)

    def lag_table(self) -> dict[TopicPartition, PartitionLag]:
        return dict(self._lag)

    def statistics(self) -> CompactionStats:
        lags = [lag.records for lag in self._lag.values()]
        return CompactionStats(sum(lags), max(lags, default=0),
                               sum(1 for lag in self._lag.values() if lag.pending),
                               self.known_partitions, self.active_tasks)

    def top_lagging(self) -> list[tuple[TopicPartition, PartitionLag]]:
        return heapq.nlargest(self._lag_top_n, self._lag.items(), key=lambda kv: kv[1].records)


class _StageTimer:
    """``with metrics.stage("read"):`` observes the block's duration, failures included."""

    def __init__(self, histogram: Histogram, name: str) -> None:
        self._histogram = histogram
        self._name = name
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self._histogram.labels(self._name).observe(time.monotonic() - self._started)


class _TopLagCollector(Collector):
    def __init__(self, metrics: CompactionMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        per_partition = GaugeMetricFamily(
            "llog_compaction_partition_lag_records",
            "Records not yet compacted (high watermark - (cursor - 1)) of the most lagging "
            "partitions only",
            labels=["topic", "partition"],
        )
        for tp, lag in self._metrics.top_lagging():
            per_partition.add_metric([tp.topic, str(tp.partition)], lag.records)
        yield per_partition
