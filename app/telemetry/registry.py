"""One registry per service process, and what a scrape of it answers.

A single process (``llog serve`` with one worker, the compactor, an app in a test)
exposes its registry as it is. Under ``llog serve --workers N`` the workers share a
metrics directory (``PROMETHEUS_MULTIPROC_DIR``, see :mod:`app.telemetry.workers`):
prometheus_client then keeps every counter, gauge and histogram value in a file of
that directory, and a scrape, whichever worker answers it, reads all the files
(``MultiProcessCollector``) and so reports the server's totals.

Collectors that compute their families at scrape time are of two kinds, and the
registry tells them apart as they are registered:

- :class:`SnapshotMetrics` are refreshed into real metrics (and so into the files);
- any other collector is a *view*: what this process sees of something every worker
  sees the same (its identity and settings, the most lagging partitions of the store).
  Under several workers a view is answered by the worker that serves the scrape.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import anyio
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from app.telemetry.snapshots import SnapshotMetrics

# Read by prometheus_client when it is first imported; llog serve sets it for its workers.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Scrapes read the shared directory in worker threads; at most this many at once.
_READ_THREADS = 2


def multiprocess_dir() -> Path | None:
    """The metrics directory shared by this server's workers, if it has several."""
    value = os.environ.get(MULTIPROC_ENV)
    return Path(value) if value else None


class ServiceRegistry(CollectorRegistry):
    """The metrics of one service process, exposed alone or as its server's totals."""

    def __init__(self, shared_dir: Path | None = None) -> None:
        super().__init__()
        self.shared_dir = shared_dir
        self.snapshots: list[SnapshotMetrics] = []
        self.views: list[Collector] = []
        self._files = (MultiProcessCollector(None, path=str(shared_dir))  # type: ignore[no-untyped-call]
                       if shared_dir is not None else None)
        self._limiter: anyio.CapacityLimiter | None = None

    @classmethod
    def for_this_process(cls) -> ServiceRegistry:
        return cls(multiprocess_dir())

    def register(self, collector: Collector) -> None:
        super().register(collector)
        if isinstance(collector, SnapshotMetrics):
            self.snapshots.append(collector)
        elif not isinstance(collector, MetricWrapperBase):
            self.views.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        for kept in (self.snapshots, self.views):
            if collector in kept:
                kept.remove(collector)  # type: ignore[arg-type]

    def refresh(self) -> None:
        """Write this process's snapshot figures (to the shared directory, if any)."""
        for snapshot in self.snapshots:
            snapshot.refresh()

    async def refresh_every(self, interval_s: float) -> None:
        """Keep this worker's snapshot figures at most ``interval_s`` old in the shared
        directory, for scrapes answered by the other workers. Runs until cancelled."""
        while True:
            self.refresh()
            await anyio.sleep(interval_s)

    async def gather(self, *, views: bool = True) -> list[Metric]:
        """Every family a scrape answers: this process's, or its server's totals.

        ``views=False`` leaves the views out: a reader that samples often and needs only
        counters, histograms and snapshot figures (the console's ring) does not pay for
        them at every sample; some cost time in proportion to what the process knows
        (the most lagging partitions, a heap over every observed one)."""
        if self._files is None:
            if views:
                return list(self.collect())
            with self._lock:
                collectors = list(self._collector_to_names)
            return [family for collector in collectors if collector not in self.views
                    for family in collector.collect()]
        self.refresh()
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(_READ_THREADS)
        files = self._files
        shared = await anyio.to_thread.run_sync(lambda: list(files.collect()),  # type: ignore[no-untyped-call]
                                                limiter=self._limiter)
        if not views:
            return shared
        return shared + [family for view in self.views for family in view.collect()]


class Families(Collector):
    """Families already gathered, in the shape ``generate_latest`` takes."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
