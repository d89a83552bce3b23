"""The routes of each app, in one table that both ways in read.

A row is one route as its module declares it (path, methods, the OpenAPI description
and the handler the framework serves it with) and, for a hot route, the handler the
hot lane serves it with (app/routes/hot_lane.py): an ``async (Request) -> Response``.
The app adds every row to its router, so the OpenAPI document describes them all; the
hot lane serves the hot rows at the row's own path and methods. A hot path is thus
declared once, by its module's decorator.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from app.routes import (
    cluster,
    consume,
    groups,
    health,
    metrics,
    offsets,
    produce,
    stream,
    stream_tickets,
    topics,
    whoami,
)

Handler = Callable[[Request], Awaitable[Response]]

# The framework's handler of each hot route -> the handler the hot lane serves it with.
HOT: dict[Callable[..., Any], Handler] = {
    produce.produce: produce.produce,  # parses its own body: the same function
    consume.consume: consume.consume_in_lane,  # its body read as FastAPI reads it
}


@dataclass(frozen=True)
class Route:
    route: APIRoute
    lane: Handler | None = None  # served by the hot lane with this handler

    @property
    def path(self) -> str:
        return self.route.path

    @property
    def methods(self) -> frozenset[str]:
        return frozenset(self.route.methods or ())


def broker_routes(*, tickets: bool) -> list[Route]:
    """The broker's routes; ``tickets``: stream tickets too (they stand in for a token,
    so there are none with access control off)."""
    routers = [produce.router, consume.router, stream.router, offsets.router,
               topics.router, groups.router, cluster.router, health.router, metrics.router,
               whoami.router]
    if tickets:
        routers.append(stream_tickets.router)
    table = [Route(route, HOT.get(route.endpoint)) for route in _routes(routers)]
    served = {row.route.endpoint for row in table if row.lane is not None}
    missing = [f"{h.__module__}.{h.__qualname__}" for h in HOT if h not in served]
    if missing:  # renamed or unregistered: the lane would silently not serve it
        raise LookupError(f"hot routes that no router registers: {missing}")
    return table


def compactor_routes() -> list[Route]:
    """The standalone compactor's routes: health and metrics, as the broker's."""
    return [Route(route) for route in _routes([health.router, metrics.router])]


def _routes(routers: Sequence[APIRouter]) -> list[APIRoute]:
    routes = []
    for route in (route for router in routers for route in router.routes):
        if not isinstance(route, APIRoute):
            raise TypeError(f"{route!r}: the table holds the routes of APIRouters")
        routes.append(route)
    return routes
