"""Statistics snapshots as Prometheus metrics that add up across worker processes.

Components expose typed ``statistics()`` snapshots (dataclasses, like anyio's memory
streams). A :class:`SnapshotMetrics` turns the fields it is told about into real
prometheus_client gauges and counters, refreshed from the snapshot when it is collected
and, under ``llog serve --workers N``, also periodically by each worker
(:meth:`app.telemetry.registry.ServiceRegistry.refresh_every`), so that the values
reach the shared metrics directory where any worker's scrape finds them.

Each field says how it combines across the workers of one server:

- ``livesum``: the worker's own quantity (its buffer, its long-polls, its cache); the
  server's figure is the sum over the live workers.
- ``livemax``: every worker observes the same thing (the bucket's size, the store's
  compaction lag, a tail cache directory they share); the server's figure is the
  largest over the live workers, that is the worst recent observation.
- ``livemin``: a condition every worker must meet (being ready): the smallest.
- ``counter``: a cumulative count kept by the component (cache hits, a cost estimate);
  each worker adds what it counted since its last refresh, so the sum over workers,
  dead ones included, only grows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Literal

from prometheus_client import Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

Combine = Literal["livesum", "livemax", "livemin", "counter"]
StatisticsSource = Callable[[], Any]


@dataclass(frozen=True)
class Figure:
    """One numeric field of a snapshot, exported as ``{prefix}_{field}``."""

    field: str
    help: str
    combine: Combine = "livesum"


class SnapshotMetrics(Collector):
    """The figures of one statistics source (answering None while not running, in
    which case nothing is exported). Collecting refreshes first, so a single process
    always exports current values."""

    def __init__(self, prefix: str, source: StatisticsSource, figures: Sequence[Figure]
                 ) -> None:
        self._prefix = prefix
        self._source = source
        self._figures = tuple(figures)
        # Created on the first snapshot: under several workers a metric's creation
        # already writes it to the shared directory.
        self._metrics: dict[str, Counter | Gauge] | None = None
        self._counted: dict[str, float] = {}

    def refresh(self) -> None:
        snapshot = self._source()
        if snapshot is None:
            return
        values = numeric_fields(snapshot)
        metrics = self._metrics if self._metrics is not None else self._create()
        for figure in self._figures:
            value = values.get(figure.field)
            if value is None:
                continue
            metric = metrics[figure.field]
            if isinstance(metric, Gauge):
                metric.set(value)
                continue
            last = self._counted.get(figure.field, 0.0)
            # A component restarted from zero: everything it counts now is new.
            metric.inc(value - last if value >= last else value)
            self._counted[figure.field] = value

    def collect(self) -> Iterator[Metric]:
        self.refresh()
        for metric in (self._metrics or {}).values():
            yield from metric.collect()

    def _create(self) -> dict[str, Counter | Gauge]:
        metrics: dict[str, Counter | Gauge] = {}
        for f in self._figures:
            name = f"{self._prefix}_{f.field}"
            metrics[f.field] = (
                Counter(name, f.help, registry=None) if f.combine == "counter"
                else Gauge(name, f.help, registry=None, multiprocess_mode=f.combine))
        self._metrics = metrics
        return metrics


def numeric_fields(snapshot: Any) -> dict[str, float]:
    """The numeric fields of a statistics snapshot (labels such as a state are left out)."""
    values = asdict(snapshot) if is_dataclass(snapshot) and not isinstance(snapshot, type) \
        else dict(snapshot)
    return {k: float(v) for k, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
