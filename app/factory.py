"""The broker application: ``create_app(settings)``; nothing is built at import time.

``create_app`` makes the process-level part (app/broker/process.py: settings, metrics,
status), which the health and metrics routes serve from the start; the lifespan
assembles the broker's services (app/broker/assembly.py) and hands them to the routes
as ``app.state.broker`` before the first request.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from prometheus_fastapi_instrumentator import Instrumentator

from app.auth.control import AccessControl, run_access_control
from app.auth.exposure import announce
from app.broker.assembly import assemble
from app.broker.process import BrokerProcess
from app.console import install_console
from app.drain import drain_on_sigterm as draining
from app.gc_policy import collector_policy, own_process
from app.routes import table
from app.routes.access import AccessMiddleware
from app.routes.errors import BodyLimitMiddleware, CloseWhileDraining, install_error_handlers
from app.routes.hot_lane import HotLane
from app.routes.http_series import HttpSeries
from app.routes.models import ProduceRequest
from app.routes.openapi import install_openapi
from app.routes.openapi_auth import declare_bearer_auth, declare_metrics_token
from app.routes.openapi_limits import declare_limits
from app.settings import Settings
from app.telemetry.request_id import RequestIdMiddleware

API_DESCRIPTION = """Leaderless log broker: append records to topic-partitions with
`POST /produce`, read them with long-polling `POST /consume`. Any broker serves any
partition. See docs/http-api.md."""


def create_app(settings: Settings, *, drain_on_sigterm: bool = False) -> FastAPI:
    """The broker app. ``drain_on_sigterm``: the first SIGTERM drains before the server
    stops (app/drain.py); set where uvicorn serves it, not for apps run in tests."""
    process = BrokerProcess.create(settings)
    control = (AccessControl(settings.access, process.registry) if settings.auth_enabled
               else None)
    process.registry.register(announce(settings))

    console: contextlib.AbstractAsyncContextManager[None] | None = None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if control is not None:  # first: a broken auth file stops the start
                await stack.enter_async_context(
                    run_access_control(control, sighup=drain_on_sigterm))
            broker = await stack.enter_async_context(assemble(process))
            app.state.broker = broker  # what the routes are handed (app/routes/deps.py)
            if console is not None:
                await stack.enter_async_context(console)
            await stack.enter_async_context(draining(drain_on_sigterm, broker.drain))
            yield

    app = FastAPI(
        title="leaderless-log broker",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.service = process
    app.state.auth = control
    app.state.metrics_token = settings.metrics_token
    install_error_handlers(app)
    routes = table.broker_routes(tickets=control is not None)
    # The routes are added to the app's own router rather than include_router()-ed:
    # an included router costs a route-resolution layer on every request.
    app.router.routes.extend(row.route for row in routes)
    if settings.console == "on":  # not in the API's document: the console is its client
        console = install_console(app, process.registry, compactor_url=settings.compactor_url,
                                  metrics_token=settings.metrics_token)
    # The produce route parses its body itself, so FastAPI does not name its model.
    install_openapi(app, extra_models=[ProduceRequest],
                    finish=functools.partial(_finish_openapi, settings=settings))
    _install_middleware(app, settings, process, control, routes)
    return app


def _finish_openapi(schema: dict[str, Any], settings: Settings) -> None:
    """This broker's limits in its document; its security: the bearer scheme with auth
    on, the metrics token when one is set."""
    declare_limits(schema, settings)
    if settings.auth_enabled:
        declare_bearer_auth(schema, settings)
    declare_metrics_token(schema, settings)


def _install_middleware(app: FastAPI, settings: Settings, process: BrokerProcess,
                        control: AccessControl | None, routes: list[table.Route]) -> None:
    """From the innermost: access control, HTTP metrics, draining, the body limit, the
    request id, the hot lane (app/routes/hot_lane.py: produce and consume served through
    every middleware added before it, without the framework's layers), CORS."""
    if control is not None:  # innermost: the HTTP metrics count its refusals
        app.add_middleware(AccessMiddleware, control=control, log_requests=settings.access_log)
    instrumentator = Instrumentator(
        registry=process.registry,
        excluded_handlers=["/metrics", "/metrics/prometheus", "/health"],
        should_group_status_codes=False,
    )
    # Made here rather than by the middleware: the hot lane builds the middleware once
    # more per route, and each would register the same series again.
    instrumentator.add(HttpSeries(process.registry, namespace="llog"))
    instrumentator.instrument(app, metric_namespace="llog")
    app.add_middleware(CloseWhileDraining,
                       draining=lambda: process.health.status == "stopping")
    # Outside the rest, so an oversized body is refused before anything reads it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Every answer, refusals included, carries the request's id.
    app.add_middleware(RequestIdMiddleware, max_length=settings.request_id_max_length)
    app.add_middleware(HotLane, routes=routes, served=app)
    if settings.cors_allow_origins:  # outermost: preflights and refusals carry CORS headers
        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_allow_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["authorization", "content-encoding", "content-type", "x-request-id",
                           "llog-commit-deadline-ms"],
            expose_headers=["retry-after", "www-authenticate", "x-request-id"],
            max_age=settings.cors_max_age_s)


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn's ``--factory`` (each worker builds its own app)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings.from_env()
    app = create_app(settings, drain_on_sigterm=True)
    return own_process(app, collector_policy(settings), app.state.service.registry)
