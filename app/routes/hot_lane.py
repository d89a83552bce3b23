"""The hot lane: ``POST /produce`` and ``POST /consume`` served by short chains instead of
the whole stack.

A request to the app passes about fifteen ASGI layers: the framework's error, exception,
exit-stack, body-limit and telemetry middlewares, the router (which matches the path
against every route), FastAPI's request handler, and the HTTP metrics middleware, which
matches the route once more to name it. For produce, the request the broker serves most,
they cost about a third of its CPU (docs/performance.md), and about as much of a small
consume answer's.

:class:`HotLane` sits outside them and serves the hot routes itself, through a chain
built from the same pieces the stack uses, in the same order:

- the edge middlewares (request id, body limit, ``Connection: close`` while draining),
  the very classes and settings of the main stack (``edge``);
- the HTTP metrics, observed by the instrumentator's own instrumentation functions with
  the route's path as the handler label (:class:`HttpMetrics`);
- access control, when it is on (``access``);
- the app's exception handlers, looked up by the exception's class as the framework
  does (:class:`Endpoint`); an exception no handler takes propagates to the server's
  error middleware, which answers 500 as it does for any route.

Any other method or path goes through the app unchanged. The routes stay registered in
the app as well, so the OpenAPI document describes them as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from timeit import default_timer
from typing import Any

from prometheus_fastapi_instrumentator.metrics import Info
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Handler = Callable[[Request], Awaitable[Response]]
Instrumentation = Callable[[Info], None]


class Endpoint:
    """``handler`` as an ASGI app, its exceptions answered by the app's handlers."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await self.handler(request)
        except Exception as exc:
            answer = _exception_handler(scope, exc)
            if answer is None:
                raise
            response = await answer(request, exc)
        await response(scope, receive, send)


def _exception_handler(scope: Scope, exc: Exception) -> Any:
    """The app's handler for ``exc``'s class or its nearest base, None if there is none."""
    handlers = scope["app"].exception_handlers
    for cls in type(exc).__mro__:
        if cls in handlers:
            return handlers[cls]
    return None


class _Answer:
    """What an instrumentation reads of a response: its headers."""

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.headers = Headers(raw=raw)


class HttpMetrics:
    """The HTTP request metrics, as the instrumentator's middleware records them, for a
    route known in advance (no route matching per request)."""

    def __init__(self, app: ASGIApp, *, handler: str,
                 instrumentations: Sequence[Instrumentation]) -> None:
        self.app = app
        self.handler = handler
        self.instrumentations = instrumentations

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = default_timer()
        status = 500
        headers: list[tuple[bytes, bytes]] = []

        async def observing_send(message: Message) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            info = Info(request=Request(scope), response=_Answer(headers),  # type: ignore[arg-type]
                        method=scope["method"], modified_handler=self.handler,
                        modified_status=str(status),
                        modified_duration=max(default_timer() - started, 0.0))
            for instrumentation in self.instrumentations:
                instrumentation(info)


class HotLane:
    """Serves ``routes`` (``POST`` path -> handler) through their own short chains; passes
    everything else to ``app``."""

    def __init__(self, app: ASGIApp, *, routes: dict[str, Handler],
                 edge: Sequence[Middleware], access: Middleware | None,
                 instrumentations: Sequence[Instrumentation]) -> None:
        self.app = app
        self.routes = {path: _chain(path, handler, edge, access, instrumentations)
                       for path, handler in routes.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            lane = self.routes.get(scope["path"])
            if lane is not None:
                await lane(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _chain(path: str, handler: Handler, edge: Sequence[Middleware],
           access: Middleware | None, instrumentations: Sequence[Instrumentation]
           ) -> ASGIApp:
    """edge (outermost first) -> metrics -> access -> the handler, as in the stack."""
    app: ASGIApp = Endpoint(handler)
    if access is not None:
        app = _wrap(access, app)
    app = HttpMetrics(app, handler=path, instrumentations=instrumentations)
    for middleware in reversed(edge):
        app = _wrap(middleware, app)
    return app


def _wrap(middleware: Middleware, app: ASGIApp) -> ASGIApp:
    wrapped: ASGIApp = middleware.cls(app, *middleware.args, **middleware.kwargs)
    return wrapped
