"""Counters and latency histograms of the store clients.

One :class:`StoreMetrics` per process, registered on the app's own
``CollectorRegistry`` (never the global one), so tests and several apps in one process
stay independent.
"""

from __future__ import annotations

from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

# What a stored byte belongs to: a slice of a shared WAL object, or a compacted chunk.
StoredKind = Literal["wal", "chunk"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class StoreMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Every family of the store clients, declared one after another: long because
        it is the one list of them, and splitting it would only scatter that list."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.oxia_requests = Counter(
            "llog_oxia_requests", "Oxia requests (round trips) by kind and outcome",
            ["op", "outcome"],
            registry=r,
        )
        self.oxia_latency = Histogram(
            "llog_oxia_request_seconds", "Oxia operation latency", ["op"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.oxia_puts = Counter(
            "llog_oxia_puts", "Puts and CAS puts by outcome (sent in coalesced write rounds): "
            "ok, conflict, error; expired: not sent, its deadline to be sent had passed",
            ["op", "outcome"], registry=r,
        )
        self.oxia_batch_size = Histogram(
            "llog_oxia_write_batch_puts", "Puts coalesced into one Oxia write round",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r,
        )
        self.s3_requests = Counter(
            "llog_s3_requests", "S3 requests by kind and outcome", ["op", "outcome"],
            registry=r,
        )
        self.s3_latency = Histogram(
            "llog_s3_request_seconds", "S3 request latency", ["op"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.s3_bytes = Counter(
            "llog_s3_bytes", "Bytes moved to and from S3", ["direction"], registry=r,
        )
        self.cas_conflicts = Counter(
            "llog_commit_cas_conflicts", "meta/control CAS conflicts seen by writers",
            registry=r,
        )
        self.cas_retries = Counter(
            "llog_cas_retries", "Compare-and-set attempts repeated, by operation and reason",
            ["op", "reason"], registry=r,
        )
        self.pending_materialised = Counter(
            "llog_pending_materialised",
            "Pending appends whose index entry was materialised, by who did it", ["by"],
            registry=r,
        )
        self.shared_blob_bytes = Histogram(
            "llog_shared_blob_bytes", "Size of shared WAL blobs written",
            buckets=(1024, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864),
            registry=r,
        )
        self.appended_records = Counter(
            "llog_appended_records", "Records committed by this process's writer", registry=r,
        )
        self.appended_bytes = Counter(
            "llog_appended_bytes", "Record bytes committed by this process's writer",
            registry=r,
        )
        # What compression saves: bytes of WAL bodies and compacted chunks before and
        # after their codec (equal where stored raw), counted where they are stored. The
        # broker's S3 cost estimate (app/observability.py) turns them into money.
        self.stored_raw_bytes = Counter(
            "llog_stored_raw_bytes",
            "Record bytes stored, before compression, by kind (wal: slices of shared WAL "
            "objects; chunk: compacted chunks)", ["kind"], registry=r,
        )
        self.stored_bytes = Counter(
            "llog_stored_bytes",
            "Bytes stored for them after compression (as written to S3), by kind",
            ["kind"], registry=r,
        )

    def count_stored(self, kind: StoredKind, raw: int, stored: int) -> None:
        """``raw`` bytes of ``kind`` were stored as ``stored`` bytes (their codec's)."""
        self.stored_raw_bytes.labels(kind=kind).inc(raw)
        self.stored_bytes.labels(kind=kind).inc(stored)
