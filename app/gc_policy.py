"""How Python's garbage collector runs in a server process (`llog serve`, the compactor).

CPython collects its youngest generation after 700 net allocations of container
objects. A broker under load allocates that many in a fraction of one request, so the
objects of requests still in flight (coroutine frames, futures, cancel scopes, parsed
bodies) survive collection after collection and are promoted to the oldest generation.
Once those promotions reach a quarter of it, a full collection walks every object of
the process (modules, the app, botocore's models, gRPC's stubs: hundreds of thousands)
on the event loop: 100-250 ms each, every two seconds or so, measured at 32 produce
connections. With the young threshold at 50,000, request-scoped objects die before a
collection finds them, full collections become rare, and a produce costs a fifth less
CPU; the 99th percentile latency fell from 330 to about 110 ms (docs/performance.md).

Once the process has started, what exists then (modules, the app, clients) is moved out
of the collector's reach (``gc.freeze``): it lives as long as the process, and a full
collection no longer walks it, so the pauses that remain are short.

Only processes that own their interpreter apply this: apps built in a test process
leave the collector as the tests have it. The collector's work is counted from its own
callbacks, which touch plain numbers only: a callback runs wherever a collection starts,
possibly inside code holding a lock that a metric update would take.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from app.settings import ServerSettings
from app.telemetry.registry import ServiceRegistry
from app.telemetry.snapshots import Figure, SnapshotMetrics

# The oldest generation: its collections walk every object not frozen.
_OLDEST = 2


@dataclass(frozen=True)
class CollectorStats:
    young_threshold: int
    frozen_objects: int
    collections: int
    full_collections: int
    pause_seconds: float
    full_pause_seconds: float


FIGURES = (
    Figure("young_threshold", "net allocations of container objects between collections "
           "of the youngest generation (LLOG_GC_YOUNG_THRESHOLD)", "livemax"),
    Figure("frozen_objects", "objects moved out of the collector's reach once the process "
           "had started (LLOG_GC_FREEZE_AFTER_START), counted then", "livesum"),
    Figure("collections", "garbage collections, every generation", "counter"),
    Figure("full_collections", "collections of the oldest generation (they walk every "
           "object not frozen)", "counter"),
    Figure("pause_seconds", "time the collector ran, every generation (the event loop "
           "stands still meanwhile)", "counter"),
    Figure("full_pause_seconds", "time the collections of the oldest generation ran",
           "counter"),
)


class CollectorPolicy:
    """The collector's thresholds and freeze for one process, and what it costs."""

    def __init__(self, young_threshold: int, *, freeze_after_start: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if young_threshold < 0:
            raise ValueError("the young threshold is 0 (Python's own) or more")
        self.young_threshold = young_threshold
        self.freeze_after_start = freeze_after_start
        self._clock = clock
        self._started_at = 0.0
        self._collections = 0
        self._full = 0
        self._pause = 0.0
        self._full_pause = 0.0
        self._frozen = 0  # objects frozen by started(), counted once then

    def apply(self) -> None:
        """Set the thresholds (the older generations' stay Python's) and start counting."""
        if self.young_threshold:
            _, middle, oldest = gc.get_threshold()
            gc.set_threshold(self.young_threshold, middle, oldest)
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)

    def started(self) -> None:
        """The process has started: collect what startup left behind, freeze the rest."""
        if self.freeze_after_start:
            gc.collect()
            gc.freeze()
            # Counted once, here: gc.get_freeze_count() walks every frozen object (some
            # 170,000 in a broker, about 4 ms on the event loop: a /metrics scrape took
            # 6.9 ms with it, 2.4 without), which the console's sampler and each scrape
            # would otherwise pay.
            self._frozen = gc.get_freeze_count()

    def close(self) -> None:
        """Stop counting (thresholds and frozen objects stay: they belong to the process)."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._observe)

    def statistics(self) -> CollectorStats:
        return CollectorStats(gc.get_threshold()[0], self._frozen, self._collections,
                              self._full, self._pause, self._full_pause)

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = self._clock()
            return
        took = self._clock() - self._started_at
        self._collections += 1
        self._pause += took
        if info.get("generation") == _OLDEST:
            self._full += 1
            self._full_pause += took


def collector_policy(settings: ServerSettings) -> CollectorPolicy:
    return CollectorPolicy(settings.gc_young_threshold,
                           freeze_after_start=settings.gc_freeze_after_start)


def own_process(app: FastAPI, policy: CollectorPolicy, registry: ServiceRegistry) -> FastAPI:
    """``app`` owns its process: apply ``policy`` now, freeze once its lifespan has
    started, export ``llog_gc_*`` on ``registry``."""
    policy.apply()
    registry.register(SnapshotMetrics("llog_gc", policy.statistics, FIGURES))
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(served: FastAPI) -> AsyncIterator[Any]:
        try:
            async with inner(served) as state:
                policy.started()
                yield state
        finally:
            policy.close()

    app.router.lifespan_context = lifespan
    return app
