"""The HTTP series every route records, as the instrumentator's ``metrics.default()``
defines them (the same names, help, labels and buckets), with each label set's children
kept.

``default()`` looks its children up by label values on every request (five
``labels()`` calls, each building tuples and taking a lock), from an ``Info`` built for
the purpose: about 35 µs of a produce request's 1,000 on this machine (py-spy,
docs/performance.md). Here the children of a (handler, method, status) are looked up
once, and the hot lane (app/routes/hot_lane.py) records its requests through
:meth:`HttpSeries.record` without building an ``Info`` at all; every other route goes
through the instrumentator's middleware, which calls the series as an instrumentation.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary
from prometheus_fastapi_instrumentator.metrics import Info

# Those of ``default()``, with +Inf as it appends it.
HIGHR_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5,
                 4, 4.5, 5, 7.5, 10, 30, 60, float("inf"))
LOWR_BUCKETS = (0.1, 0.5, 1, float("inf"))
# Label sets kept: handlers are route templates (or "none") and statuses a few codes, so
# this is never reached in practice; past it, children are looked up each time.
MAX_KEPT = 4096


class HttpSeries:
    """``default(metric_namespace=namespace, registry=registry)``'s series; call it as
    an instrumentation, or :meth:`record` a request directly."""

    def __init__(self, registry: CollectorRegistry, namespace: str,
                 highr_buckets: Sequence[float] = HIGHR_BUCKETS,
                 lowr_buckets: Sequence[float] = LOWR_BUCKETS) -> None:
        self._total = Counter(
            "http_requests_total", "Total number of requests by method, status and handler.",
            ("method", "status", "handler"), namespace=namespace, registry=registry)
        self._in = Summary(
            "http_request_size_bytes", "Content length of incoming requests by handler. "
            "Only value of header is respected. Otherwise ignored. "
            "No percentile calculated. ", ("handler",), namespace=namespace,
            registry=registry)
        self._out = Summary(
            "http_response_size_bytes", "Content length of outgoing responses by handler. "
            "Only value of header is respected. Otherwise ignored. "
            "No percentile calculated. ", ("handler",), namespace=namespace,
            registry=registry)
        self._highr = Histogram(
            "http_request_duration_highr_seconds", "Latency with many buckets but no API "
            "specific labels. Made for more accurate percentile calculations. ",
            buckets=highr_buckets, namespace=namespace, registry=registry)
        self._lowr = Histogram(
            "http_request_duration_seconds", "Latency with only few buckets by handler. "
            "Made to be only used if aggregation by handler is important. ",
            ("method", "handler"), buckets=lowr_buckets, namespace=namespace,
            registry=registry)
        self._kept: dict[tuple[str, str, str], tuple[Counter, Summary, Summary, Histogram]] = {}

    def __call__(self, info: Info) -> None:
        response = info.response
        out = (int(response.headers.get("Content-Length", 0))
               if response is not None and hasattr(response, "headers") else 0)
        self.record(info.modified_handler, info.method, info.modified_status,
                    int(info.request.headers.get("Content-Length", 0)), out,
                    info.modified_duration)

    def record(self, handler: str, method: str, status: str, in_bytes: int,
               out_bytes: int, seconds: float) -> None:
        """One request, as ``default()``'s instrumentation records it."""
        key = (handler, method, status)
        children = self._kept.get(key)
        if children is None:
            children = (self._total.labels(method, status, handler), self._in.labels(handler),
                        self._out.labels(handler), self._lowr.labels(method, handler))
            if len(self._kept) < MAX_KEPT:
                self._kept[key] = children
        total, in_size, out_size, lowr = children
        total.inc()
        in_size.observe(in_bytes)
        out_size.observe(out_bytes)
        self._highr.observe(seconds)
        lowr.observe(seconds)
