"""What one broker process holds from ``create_app`` on, before and after its services
run: its settings, metrics registry and counters, its status (app/service_health.py),
and the figures of its components' statistics.

The services themselves are built by the app's lifespan (app/broker/assembly.py) into a
:class:`~app.broker.assembly.Broker`; this is the part the health and metrics routes
serve (the :class:`~app.observability.Service` protocol), which answers while the
broker starts and stops as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.broker.metrics import (
    ANSWER_FIGURES,
    BATCHER_FIGURES,
    CONSUME_FIGURES,
    PLAN_AHEAD_FIGURES,
    READ_AHEAD_FIGURES,
    READ_OBJECT_CACHE_FIGURES,
    WATCH_FIGURES,
    BrokerInfoCollector,
    ConsumeMetrics,
    ProduceMetrics,
    tail_cache_figures,
)
from app.errors import RoleDisabled
from app.observability import (
    READY,
    S3_REQUEST_COST,
    S3_USAGE,
    S3Usage,
    readiness,
    request_counts,
    s3_cost_estimate,
    stored_totals,
)
from app.service_health import ServiceHealth
from app.settings import Settings
from app.stores.metrics import StoreMetrics
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import SnapshotMetrics, StatisticsSource

if TYPE_CHECKING:
    from app.broker.assembly import Broker


@dataclass
class BrokerProcess:
    settings: Settings
    registry: ServiceRegistry
    store_metrics: StoreMetrics
    produce_metrics: ProduceMetrics
    consume_metrics: ConsumeMetrics
    health: ServiceHealth = field(default_factory=ServiceHealth)
    # The last listing of the bucket (written by the broker's usage scan).
    s3_usage: S3Usage = field(default_factory=S3Usage)
    # The running broker, whose components' figures the registry reports: set once
    # assembled (app/broker/assembly.py); none before, so none are reported.
    running: Broker | None = None

    @classmethod
    def create(cls, settings: Settings) -> BrokerProcess:
        registry = ServiceRegistry.for_this_process()
        process = cls(settings, registry, StoreMetrics(registry), ProduceMetrics(registry),
                      ConsumeMetrics(registry))
        process._register_collectors()
        return process

    def identity(self) -> dict[str, Any]:
        s = self.settings
        return {"broker_id": s.broker_id, "host": s.host, "port": s.port}

    def metrics_header(self) -> dict[str, Any]:
        s = self.settings
        return {
            "broker_id": s.broker_id, "roles": list(s.roles), "status": self.health.status,
            "started_at_ms": self.health.started_at_ms,
            "batch": {"max_bytes": s.batch_max_bytes, "max_delay_ms": s.batch_max_delay_ms,
                      "buffer_max_bytes": s.batch_buffer_max_bytes},
            "s3_prices_note": "S3 cost figures are estimates at S3 Standard us-east-1 "
                              "list prices",
        }

    def _of(self, statistics: Callable[[Broker], Any]) -> StatisticsSource:
        """A source of the running broker's ``statistics``: none before it runs, nor of
        a component of a role it lacks (a stand-in refuses, app/broker/roles.py)."""
        def source() -> Any:
            if self.running is None:
                return None
            try:
                return statistics(self.running)
            except RoleDisabled:
                return None
        return source

    def _register_collectors(self) -> None:
        s = self.settings
        info = {"broker_id": s.broker_id, "roles": ",".join(s.roles),
                "batch_max_bytes": str(s.batch_max_bytes),
                "batch_max_delay_ms": str(s.batch_max_delay_ms),
                "root_prefix": s.root_prefix, "bucket": s.s3_bucket}
        scenario = json.loads(s.loadtest_scenario) if s.loadtest_scenario else None
        self.registry.register(BrokerInfoCollector(info, scenario))
        of = self._of
        for prefix, source, figures in (
            ("llog_broker", lambda: readiness(self.health), (READY,)),
            ("llog_batcher", of(lambda b: b.batcher.statistics()), BATCHER_FIGURES),
            ("llog_consume", of(lambda b: b.consume.statistics()), CONSUME_FIGURES),
            ("llog_answer", of(lambda b: b.consume.answers.statistics()), ANSWER_FIGURES),
            ("llog_watch", of(lambda b: b.watch.statistics()), WATCH_FIGURES),
            ("llog_tail_cache", of(lambda b: b.cache.statistics()),
             tail_cache_figures(s.tail_cache_dir is not None)),
            ("llog_read_object_cache", of(lambda b: b.reader.objects.statistics()),
             READ_OBJECT_CACHE_FIGURES),
            ("llog_read_ahead", of(lambda b: b.reader.ahead.statistics()),
             READ_AHEAD_FIGURES),
            ("llog_plan_ahead", of(lambda b: b.reader.plans.statistics()),
             PLAN_AHEAD_FIGURES),
            ("llog_s3", lambda: s3_cost_estimate(
                request_counts(self.store_metrics.s3_requests), self.s3_usage,
                stored_totals(self.store_metrics.stored_raw_bytes,
                              self.store_metrics.stored_bytes)),
             (S3_REQUEST_COST, *S3_USAGE)),
        ):
            self.registry.register(SnapshotMetrics(prefix, source, figures))
