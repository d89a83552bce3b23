"""The hot lane: the hot routes of the route table (app/routes/table.py: ``POST /produce``
and ``POST /consume``) served by short chains instead of the whole stack.

A request to the app passes about fifteen ASGI layers: the framework's error,
exception-telemetry and body-limit middlewares, the app's own, the exception middleware,
FastAPI's exit stack, the router (which matches the path against every route) and
FastAPI's request handler (dependencies, body parsing). For produce, the request the
broker serves most, they cost about a third of its CPU (docs/performance.md), and about
as much of a small consume answer's.

:class:`HotLane` is one of the app's middlewares. It serves the hot routes itself,
through a chain made of the framework's own pieces:

- every middleware of the app inside the lane: the very entries (classes and
  arguments) the app builds its stack from, in the same order, read from the app when
  the stack is built. A middleware added to the app is in the lane too;
  tests/test_ways_in.py checks that every way in passes every middleware. One stands
  in for another: the instrumentator's HTTP metrics middleware, whose arguments are
  given to :class:`HttpMetrics` (a copy, kept for its cost: see there);
- Starlette's ``ExceptionMiddleware`` with the app's exception handlers (all but the
  500 one, which the app gives to the server's error middleware, as here), around the
  handler served by Starlette's ``request_response``: an exception no handler takes
  propagates to the server's error middleware, which answers 500 as for any route.

Any other request goes on through the app unchanged.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from timeit import default_timer
from typing import Any

from prometheus_fastapi_instrumentator.metrics import Info
from prometheus_fastapi_instrumentator.middleware import PrometheusInstrumentatorMiddleware
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.routing import request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.broker.loop_watchdog import ARRIVED, arrival_floor
from app.routes.http_series import HttpSeries
from app.routes.table import Handler, Route


class HotLane:
    """Serves the hot rows of ``routes`` (those with a lane handler) through their own
    short chains; passes everything else to ``app``. ``served``: the app this is a
    middleware of, whose middlewares and exception handlers the chains are built from."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[Route], served: Starlette) -> None:
        self.app = app
        inside = _inside(served.user_middleware, type(self))
        handlers = {key: handler for key, handler in served.exception_handlers.items()
                    if key not in (500, Exception)}  # as Starlette splits them
        self.lanes: dict[tuple[str, str], ASGIApp] = {}
        for row in routes:
            if row.lane is None:
                continue
            if "{" in row.path:  # matched by equality, not by the route's pattern
                raise ValueError(f"{row.path}: the hot lane serves fixed paths only")
            chain = _chain(row.path, row.lane, inside, handlers, debug=served.debug)
            for method in row.methods:
                self.lanes[(method, row.path)] = chain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # When the request reached the app, before any middleware (an auth key
            # fetch) runs: a produce's commit deadline counts from here.
            # A loop that had stalled (a paused process) may have left it waiting since
            # the stall began: counted from then (app/broker/loop_watchdog.py).
            scope.setdefault(ARRIVED, arrival_floor(time.monotonic()))
            lane = self.lanes.get((scope["method"], scope["path"]))
            if lane is not None:
                await lane(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _is(entry: Middleware, cls: object) -> bool:
    """Whether ``entry`` makes ``cls`` (its ``cls`` is typed as a factory protocol, which
    a type checker sees no class as)."""
    found: object = entry.cls
    return found is cls


def _inside(middleware: Sequence[Middleware], lane: object) -> list[Middleware]:
    """The entries of the app's middleware list inside the lane's own (outermost first)."""
    own = [i for i, entry in enumerate(middleware) if _is(entry, lane)]
    if len(own) != 1:
        raise ValueError("the hot lane must be among the middlewares of the app it "
                         f"serves, once (found {len(own)})")
    return list(middleware[own[0] + 1:])


def _chain(path: str, handler: Handler, inside: Sequence[Middleware],
           handlers: Mapping[Any, Any], *, debug: bool) -> ASGIApp:
    """``inside`` (outermost first) -> the exception handlers -> the handler, as in the
    app's stack; the instrumentator's metrics recorded by :class:`HttpMetrics`."""
    app: ASGIApp = ExceptionMiddleware(request_response(handler), handlers=handlers,
                                       debug=debug)
    for entry in reversed(inside):
        if _is(entry, PrometheusInstrumentatorMiddleware):
            metrics = HttpMetrics.standing_in(entry, path)
            if metrics is None:  # the route is excluded: nothing is recorded
                continue
            entry = metrics
        cls, args, kwargs = entry
        app = cls(app, *args, **kwargs)
    return app


Instrumentation = Callable[[Info], None]
# Options of the instrumentator's middleware HttpMetrics does not implement; each is off
# (falsy) unless set. An app that sets one is refused when its stack is built, rather
# than served by a lane whose metrics differ from its routes'.
UNSUPPORTED = ("should_include_root_path", "should_round_latency_decimals",
               "should_instrument_requests_inprogress", "body_handlers",
               "async_instrumentations")


class _Answer:
    """What an instrumentation reads of a response: its headers."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.headers = Headers(raw=raw)


class HttpMetrics:
    """The instrumentator's middleware (``PrometheusInstrumentatorMiddleware``) for a
    route known in advance: the same instrumentations given the same figures, without
    matching the request against every route to name it and without the response object
    it builds for each request.

    A copy, kept for its cost (bench/hot_lane_cost.py: the broker's app called in
    process, a trivial handler, 7 rows of 20,000 requests alternating, on a shared
    2-core machine): with this copy the lane costs 72.8-95.0 µs of CPU per produce
    request (median 73.9) and 72.2-106.6 per consume (76.7); with the instrumentator's
    middleware, 101.5-116.8 (109.5) and 106.2-131.4 (119.5), about half of the
    difference its matching the request against every route. Starlette's exception
    handling, which replaced the lane's own copy of it, measured within the noise of
    the same bench (median +5-10 µs). End to end a produce of 4 x 25 x 1 KiB costs
    1,500-2,300 µs there, a spread that hides either.
    """

    def __init__(self, app: ASGIApp, *, handler: str,
                 instrumentations: Sequence[Instrumentation],
                 group_status_codes: bool) -> None:
        self.app = app
        self.handler = handler
        self.instrumentations = instrumentations
        self.group_status_codes = group_status_codes
        # The app's own series alone (app/routes/http_series.py): recorded directly,
        # without the Info, request and headers objects built for an instrumentation.
        only = instrumentations[0] if len(instrumentations) == 1 else None
        self.series = only if isinstance(only, HttpSeries) else None

    @classmethod
    def standing_in(cls, entry: Middleware, route: str) -> Middleware | None:
        """This middleware for ``route`` with the arguments of the app's instrumentator
        middleware ``entry``; None when they exclude the route."""
        options: dict[str, Any] = entry.kwargs
        unsupported = [name for name in UNSUPPORTED if options.get(name)]
        if entry.args or unsupported:
            raise ValueError(f"the hot lane's HTTP metrics do not implement {unsupported}")
        if not options.get("instrumentations"):  # each chain would register its own
            raise ValueError("give the instrumentator its instrumentations "
                             "(Instrumentator.add) for the hot lane to record them")
        if any(re.compile(p).search(route) for p in options.get("excluded_handlers", ())):
            return None
        instrumentations: Sequence[Instrumentation] = options["instrumentations"]
        group: bool = options.get("should_group_status_codes", True)
        return Middleware(cls, handler=route, instrumentations=instrumentations,
                          group_status_codes=group)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = default_timer()
        answered: float | None = None
        status = 500
        headers: list[tuple[bytes, bytes]] = []

        async def observing_send(message: Message) -> None:
            nonlocal answered, status, headers
            if message["type"] == "http.response.start":
                answered = default_timer()
                status = message["status"]
                headers = list(message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            self._record(scope, status, headers, started, answered)

    def _record(self, scope: Scope, status: int, headers: list[tuple[bytes, bytes]],
                started: float, answered: float | None) -> None:
        code = str(status)
        label = code[0] + "xx" if self.group_status_codes else code
        duration = max(default_timer() - started, 0.0)
        if self.series is not None:
            self.series.record(self.handler, scope["method"], label,
                               _content_length(scope["headers"]),
                               _content_length(headers), duration)
            return
        info = Info(request=Request(scope), response=_Answer(headers),  # type: ignore[arg-type]
                    method=scope["method"], modified_handler=self.handler,
                    modified_status=label, modified_duration=duration,
                    modified_duration_without_streaming=max(
                        (answered or started) - started, 0.0))
        for instrumentation in self.instrumentations:
            instrumentation(info)


def _content_length(headers: Sequence[tuple[bytes, bytes]]) -> int:
    """A Content-Length among raw ASGI headers, as ``Headers.get`` finds it (0 if none)."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value)
    return 0
