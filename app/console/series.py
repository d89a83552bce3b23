"""The console's charts: the broker's own metrics, sampled in process into a bounded ring.

The console shows the last minutes of throughput, latency and S3 spend without a
Prometheus server, and without the metrics token ever reaching a browser: every
``interval_s`` :class:`MetricsRing` reads the registry the ``/metrics`` routes answer
from (``ServiceRegistry.gather``, so under ``llog serve --workers N`` the figures are the
server's totals, whichever worker samples them) and keeps, per sample, the *rates* over
the interval since the previous one rather than the raw counters: a chart wants rates,
and a rate needs the previous reading, which only the sampler has. ``capacity`` samples
are kept (300 at 2 s: ten minutes); older ones fall off, so memory is fixed.

Rates are computed per series (one label set of one counter) and summed, as
Prometheus' ``rate`` does: a series that went down was restarted from zero (its
process or component restarted), so its increase over the interval is its whole
current value, never a negative one; a series not seen before counts from zero, as
prometheus_client creates labelled children. The first sample, having no previous
reading, has null rates; a failed sample is skipped, and the next one's rates span the
longer interval (its ``t_ms`` step shows it).

Latency quantiles come from the bucket counts a histogram gained over the interval,
interpolated within the bucket as Prometheus' ``histogram_quantile`` does. They are
read from ``llog_produce_seconds`` and ``llog_consume_seconds`` (request parsed to
answer; consume includes long-poll waits), not from the HTTP layer's per-route
``llog_http_request_duration_seconds``: that one has buckets at 0.1, 0.5 and 1 s only,
so any request under 100 ms would read as a p50 of ~50 ms and a p99 of ~99 ms.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from prometheus_client.core import Metric

from app.clock import wall_ms
from app.telemetry.registry import ServiceRegistry

log = logging.getLogger("llog.console")

DEFAULT_INTERVAL_S = 2.0
DEFAULT_CAPACITY = 300
# A sampler that keeps failing logs once per this many seconds, not every interval.
FAILURE_LOG_EVERY_S = 60.0

# The samples read from the registry (as they are named in a scrape).
PRODUCE_RECORDS = "llog_produce_records_total"
PRODUCE_BYTES = "llog_produce_bytes_total"
CONSUME_RECORDS = "llog_consume_records_total"
CONSUME_BYTES = "llog_consume_bytes_total"
HTTP_REQUESTS = "llog_http_requests_total"  # labels method, status, handler (a route)
S3_REQUESTS = "llog_s3_requests_total"      # labels op, outcome (a failed one is billed)
S3_REQUEST_COST = "llog_s3_estimated_request_cost_usd_total"  # app/observability.py
PRODUCE_LATENCY = "llog_produce_seconds_bucket"
CONSUME_LATENCY = "llog_consume_seconds_bucket"
# Records not yet compacted over every partition the process observed: only where the
# broker runs compaction (the compact role), else absent and the column null.
COMPACTION_LAG = "llog_compaction_lag_records"

_COUNTERS = frozenset({PRODUCE_RECORDS, PRODUCE_BYTES, CONSUME_RECORDS, CONSUME_BYTES,
                       HTTP_REQUESTS, S3_REQUESTS, S3_REQUEST_COST, PRODUCE_LATENCY,
                       CONSUME_LATENCY})
_GAUGES = frozenset({COMPACTION_LAG})
PRODUCE_ROUTE = "/produce"
CONSUME_ROUTE = "/consume"

# The columns of every sample besides ``t_ms`` and the per-operation S3 rates.
COLUMNS = (
    "produce_records_per_s", "produce_bytes_per_s",
    "consume_records_per_s", "consume_bytes_per_s",
    "http_requests_per_s", "produce_requests_per_s", "consume_requests_per_s",
    "produce_p50_ms", "produce_p99_ms", "consume_p50_ms", "consume_p99_ms",
    "s3_requests_per_s", "s3_cost_usd_per_hour",
    "compaction_lag_records",
)

Labels = tuple[tuple[str, str], ...]
Key = tuple[str, Labels]


@dataclass(frozen=True)
class Reading:
    """The samples of one gather the ring needs, by (sample name, sorted labels)."""

    t_ms: int
    counters: dict[Key, float]
    gauges: dict[Key, float]

    @classmethod
    def of(cls, t_ms: int, families: Iterable[Metric]) -> Reading:
        counters: dict[Key, float] = {}
        gauges: dict[Key, float] = {}
        for family in families:
            for s in family.samples:
                into = counters if s.name in _COUNTERS else gauges if s.name in _GAUGES \
                    else None
                if into is not None and not math.isnan(s.value):
                    key = (s.name, tuple(sorted(s.labels.items())))
                    into[key] = into.get(key, 0.0) + float(s.value)
        return cls(t_ms, counters, gauges)


def increases(now: Mapping[Key, float], before: Mapping[Key, float]) -> dict[Key, float]:
    """What each counter series gained since ``before``: never negative, a series that
    went down having restarted from zero, and a new one counting from zero."""
    out = {}
    for key, value in now.items():
        last = before.get(key, 0.0)
        out[key] = value - last if value >= last else value
    return out


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of observations counted in cumulative ``(le, count)`` buckets,
    as Prometheus' ``histogram_quantile``: linear within the bucket it falls in (from 0
    for the first), the highest finite bound if it falls in +Inf; None without any."""
    ordered = sorted(buckets)
    if not ordered:
        return None
    # Cumulative counts never fall with ``le``; increases of separate buckets over an
    # interval with a restart might, so keep them monotonic as Prometheus does.
    cumulative, running = [], 0.0
    for le, count in ordered:
        running = max(running, count)
        cumulative.append((le, running))
    total = cumulative[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def _sum(gained: Mapping[Key, float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in gained.items()
               if n == name and all((k, want) in ls for k, want in labels.items()))


def _buckets(gained: Mapping[Key, float], name: str) -> list[tuple[float, float]]:
    by_le: dict[float, float] = {}
    for (n, ls), v in gained.items():
        if n == name:
            le = float(dict(ls)["le"])
            by_le[le] = by_le.get(le, 0.0) + v
    return sorted(by_le.items())


def compute(now: Reading, before: Reading | None) -> dict[str, Any]:
    """One sample's columns: rates over the interval from ``before`` to ``now`` (None
    without a previous reading or a forward step of time) and the gauges as of now."""
    lag = _gauge(now, COMPACTION_LAG)
    row: dict[str, Any] = dict.fromkeys(COLUMNS)  # s3_requests_per_s None: no rates
    row["compaction_lag_records"] = lag
    if before is None or now.t_ms <= before.t_ms:
        return row
    seconds = (now.t_ms - before.t_ms) / 1000
    gained = increases(now.counters, before.counters)

    def rate(name: str, **labels: str) -> float:
        return _sum(gained, name, **labels) / seconds

    row.update(
        produce_records_per_s=rate(PRODUCE_RECORDS), produce_bytes_per_s=rate(PRODUCE_BYTES),
        consume_records_per_s=rate(CONSUME_RECORDS), consume_bytes_per_s=rate(CONSUME_BYTES),
        http_requests_per_s=rate(HTTP_REQUESTS),
        produce_requests_per_s=rate(HTTP_REQUESTS, handler=PRODUCE_ROUTE),
        consume_requests_per_s=rate(HTTP_REQUESTS, handler=CONSUME_ROUTE),
        s3_cost_usd_per_hour=rate(S3_REQUEST_COST) * 3600,
    )
    for route, histogram in (("produce", PRODUCE_LATENCY), ("consume", CONSUME_LATENCY)):
        buckets = _buckets(gained, histogram)
        for q, column in ((0.5, f"{route}_p50_ms"), (0.99, f"{route}_p99_ms")):
            seconds_q = quantile(q, buckets)
            row[column] = seconds_q * 1000 if seconds_q is not None else None
    ops: dict[str, float] = {}
    for (n, ls), v in gained.items():
        if n == S3_REQUESTS:
            op = dict(ls).get("op", "")
            ops[op] = ops.get(op, 0.0) + v / seconds
    row["s3_requests_per_s"] = ops
    return row


def _gauge(reading: Reading, name: str) -> float | None:
    values = [v for (n, _), v in reading.gauges.items() if n == name]
    return sum(values) if values else None


class MetricsRing:
    """The last ``capacity`` samples of the broker's figures, one every ``interval_s``,
    as columns (what uPlot draws: one array per series, ``t_ms`` the x axis)."""

    def __init__(self, registry: ServiceRegistry, *, interval_s: float = DEFAULT_INTERVAL_S,
                 capacity: int = DEFAULT_CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0 or capacity < 1:
            raise ValueError("interval_s must be positive and capacity at least 1")
        self.registry = registry
        self.interval_s = interval_s
        self.capacity = capacity
        self._clock = clock
        self._t_ms: deque[int] = deque(maxlen=capacity)
        self._columns: dict[str, deque[float | None]] = {
            c: deque(maxlen=capacity) for c in COLUMNS if c != "s3_requests_per_s"}
        # One column per S3 operation seen; an operation first seen late is back-filled
        # with nulls, so every column is as long as t_ms.
        self._s3_ops: dict[str, deque[float | None]] = {}
        self._last: Reading | None = None
        self.failures = 0
        self._logged_at: float | None = None
        self._unlogged = 0

    async def run(self) -> None:
        """Sample every ``interval_s`` until cancelled, on a fixed schedule: a slow
        gather delays the next sample, never makes them drift or pile up."""
        deadline = anyio.current_time()
        while True:
            await self.sample(wall_ms())
            deadline += self.interval_s
            now = anyio.current_time()
            if deadline < now:  # fell behind (a stalled loop): start the schedule anew
                deadline = now + self.interval_s
            await anyio.sleep(deadline - now)

    async def sample(self, now_ms: int) -> bool:
        """Read the registry and append one sample as of ``now_ms``; False when the
        read failed (logged, at most every FAILURE_LOG_EVERY_S, and skipped)."""
        try:
            reading = Reading.of(now_ms, await self.registry.gather(views=False))
            row = compute(reading, self._last)
        except Exception:  # a chart must never take the broker down
            self._failed()
            return False
        self._last = reading
        self._append(now_ms, row)
        return True

    def _append(self, t_ms: int, row: dict[str, Any]) -> None:
        self._t_ms.append(t_ms)
        for column, values in self._columns.items():
            values.append(row[column])
        ops: dict[str, float] | None = row["s3_requests_per_s"]
        for op in (ops or {}).keys() - self._s3_ops.keys():
            self._s3_ops[op] = deque([None] * (len(self._t_ms) - 1), maxlen=self.capacity)
        for op, values in self._s3_ops.items():
            # An operation without requests this interval had none: 0, not unknown.
            values.append(None if ops is None else ops.get(op, 0.0))

    def _failed(self) -> None:
        self.failures += 1
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < FAILURE_LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failed since the last report)" if self._unlogged \
            else ""
        log.warning("console metrics sample failed; skipped%s", more, exc_info=True)
        self._logged_at, self._unlogged = now, 0

    def snapshot(self) -> dict[str, Any]:
        """The ring as JSON-able columns, oldest first: ``series`` maps each column to
        one value per sample (null where it has none), ``s3_requests_per_s`` to one
        such column per S3 operation."""
        series: dict[str, Any] = {"t_ms": list(self._t_ms)}
        for column in COLUMNS:
            if column == "s3_requests_per_s":
                series[column] = {op: list(v) for op, v in sorted(self._s3_ops.items())}
            else:
                series[column] = list(self._columns[column])
        return {"interval_s": self.interval_s, "capacity": self.capacity, "series": series}
