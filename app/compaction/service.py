"""Hosting the compaction scheduler: in the broker, or as the ``llog compactor`` service.

- :func:`run_in_broker` runs the scheduler on the broker's own store clients and metrics
  registry; the broker's lifespan starts it in a task group when LLOG_ROLES includes
  ``compact``.
- :func:`run_compactor` is the standalone service's lifespan (``llog compactor``, whose
  app :mod:`app.compactor_app` builds): it opens its own OxiaStore and S3Store and runs
  the scheduler.

A scheduler loop that crashes (it should not: visits catch their own errors) marks the
service failed (app/service_health.py, as the broker's loops do), so ``/health``
answers 503 and an orchestrator restarts it, rather than taking the HTTP server down
with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry
from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from app.compaction.compactor import CompactionConfig, Compactor
from app.compaction.metrics import CompactionMetrics
from app.compaction.scheduler import CompactionScheduler, Visit, visit_timeout_s
from app.observability import (
    READY,
    S3_REQUEST_COST,
    S3Usage,
    readiness,
    request_counts,
    s3_cost_estimate,
)
from app.service_health import ServiceHealth
from app.settings import Settings
from app.storage.keys import KeyLayout
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import SnapshotMetrics

# How long a stopping service lets running compactions finish before cancelling them
# (cancelling is safe too: every step is idempotent).
STOP_GRACE_S = 20.0


def build_scheduler(
    settings: Settings,
    oxia: OxiaStore,
    s3: S3Store,
    metrics: CompactionMetrics,
    *,
    compactor_id: str | None = None,
    on_visit: Callable[[Visit], None] | None = None,
) -> CompactionScheduler:
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    compaction = settings.compaction
    compactor = Compactor(oxia, s3, layout, CompactionConfig.from_settings(compaction),
                          metrics=metrics)
    return CompactionScheduler(compactor, oxia, layout, compaction,
                               compactor_id=compactor_id or settings.broker_id,
                               metrics=metrics, on_visit=on_visit,
                               task_timeout_s=visit_timeout_s(settings.s3, settings.oxia))


async def run_in_broker(
    settings: Settings,
    oxia: OxiaStore,
    s3: S3Store,
    registry: CollectorRegistry,
    *,
    on_visit: Callable[[Visit], None] | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Compact in a broker process until cancelled (the broker's shutdown cancels it).

    Registers the ``llog_compaction_*`` metrics on ``registry``, so call it once per
    registry. The broker's S3 and Oxia counters already count the compactor's requests.
    ``on_visit`` is called after every partition visit.
    """
    scheduler = build_scheduler(settings, oxia, s3, CompactionMetrics(registry),
                                on_visit=on_visit)
    await scheduler.run(task_status=task_status)


# -- the standalone service ------------------------------------------------------------


@dataclass
class CompactorService:
    """Everything one ``llog compactor`` process holds while it runs."""

    settings: Settings
    registry: ServiceRegistry
    store_metrics: StoreMetrics
    metrics: CompactionMetrics
    health: ServiceHealth = field(default_factory=ServiceHealth)
    scheduler: CompactionScheduler | None = None

    @classmethod
    def create(cls, settings: Settings) -> CompactorService:
        registry = ServiceRegistry.for_this_process()
        store_metrics = StoreMetrics(registry)
        service = cls(settings, registry, store_metrics, CompactionMetrics(registry))
        registry.register(_ServiceInfo(service))
        registry.register(SnapshotMetrics("llog_compactor",
                                          lambda: readiness(service.health), (READY,)))
        # Stored bytes are the brokers' to scan; this process reports its own requests.
        registry.register(SnapshotMetrics("llog_s3", lambda: s3_cost_estimate(
            request_counts(store_metrics.s3_requests), S3Usage()), (S3_REQUEST_COST,)))
        return service

    @property
    def compactor_id(self) -> str:
        return self.settings.broker_id

    def identity(self) -> dict[str, Any]:
        return {"compactor_id": self.compactor_id}

    async def drain(self) -> None:
        """Not ready, and no new compaction starts; the running ones finish (app/drain.py)."""
        self.health.not_ready()
        if self.scheduler is not None:
            self.scheduler.stop()
        await anyio.sleep(self.settings.drain_s)

    def metrics_header(self) -> dict[str, Any]:
        s = self.settings
        return {
            "compactor_id": self.compactor_id,
            "status": self.health.status,
            "started_at_ms": self.health.started_at_ms,
            "known_partitions": len(self.scheduler.known) if self.scheduler else 0,
            "compaction": {
                "max_bytes": s.compaction_max_bytes, "max_entries": s.compaction_max_entries,
                "min_entries": s.compaction_min_entries,
                "min_entry_age_ms": s.compaction_min_entry_age_ms,
                "interval_s": s.compaction_interval_s,
                "discovery_interval_s": s.compaction_discovery_interval_s,
                "concurrency": s.compaction_concurrency,
                "max_bytes_per_s": s.compaction_max_bytes_per_s,  # None: unlimited
            },
            "s3_prices_note": "S3 cost figures are estimates at S3 Standard us-east-1 list "
                              "prices",
        }


class _ServiceInfo(Collector):
    """The service's identity and budgets."""

    def __init__(self, service: CompactorService) -> None:
        self._service = service

    def collect(self) -> Iterator[Metric]:
        s = self._service.settings
        info = InfoMetricFamily("llog_compactor", "Compactor identity and budgets")
        info.add_metric([], {
            "compactor_id": self._service.compactor_id,
            "root_prefix": s.root_prefix,
            "bucket": s.s3_bucket,
            "concurrency": str(s.compaction_concurrency),
            "max_bytes": str(s.compaction_max_bytes),
            "max_entries": str(s.compaction_max_entries),
            "min_entry_age_ms": str(s.compaction_min_entry_age_ms),
            "max_bytes_per_s": str(s.compaction_max_bytes_per_s or "unlimited"),
        })
        yield info


@contextlib.asynccontextmanager
async def run_compactor(service: CompactorService) -> AsyncIterator[CompactorService]:
    """Open the store clients and run the scheduler; on exit stop it gracefully."""
    s = service.settings
    async with (
        OxiaStore(s.oxia, service.store_metrics, identity=service.compactor_id) as oxia,
        S3Store(s.s3, service.store_metrics) as s3,
        anyio.create_task_group() as tg,
    ):
        scheduler = build_scheduler(s, oxia, s3, service.metrics,
                                    compactor_id=service.compactor_id)
        service.scheduler = scheduler
        await tg.start(service.health.watched, scheduler.run)
        service.health.serving()
        try:
            yield service
        finally:
            service.health.stopping()
            scheduler.stop()
            tg.cancel_scope.deadline = anyio.current_time() + STOP_GRACE_S

