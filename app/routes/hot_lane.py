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
  tests/test_ways_in.py checks that every way in passes every middleware;
- Starlette's ``ExceptionMiddleware`` with the app's exception handlers (all but the
  500 one, which the app gives to the server's error middleware, as here), around the
  handler served by Starlette's ``request_response``: an exception no handler takes
  propagates to the server's error middleware, which answers 500 as for any route.

Any other request goes on through the app unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import request_response
from starlette.types import ASGIApp, Receive, Scope, Send

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
            chain = _chain(row.lane, inside, handlers, debug=served.debug)
            for method in row.methods:
                self.lanes[(method, row.path)] = chain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            lane = self.lanes.get((scope["method"], scope["path"]))
            if lane is not None:
                await lane(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _inside(middleware: Sequence[Middleware], lane: object) -> list[Middleware]:
    """The entries of the app's middleware list inside the lane's own (outermost first)."""
    own = [i for i, entry in enumerate(middleware) if entry.cls is lane]
    if len(own) != 1:
        raise ValueError("the hot lane must be among the middlewares of the app it "
                         f"serves, once (found {len(own)})")
    return list(middleware[own[0] + 1:])


def _chain(handler: Handler, inside: Sequence[Middleware],
           handlers: Mapping[Any, Any], *, debug: bool) -> ASGIApp:
    """``inside`` (outermost first) -> the exception handlers -> the handler, as in the
    app's stack."""
    app: ASGIApp = ExceptionMiddleware(request_response(handler), handlers=handlers,
                                       debug=debug)
    for cls, args, kwargs in reversed(inside):
        app = cls(app, *args, **kwargs)
    return app
