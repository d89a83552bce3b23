"""The broker application: ``create_app(settings)``; nothing is built at import time."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from prometheus_fastapi_instrumentator import Instrumentator
from pydantic.json_schema import models_json_schema

from app.auth.control import AccessControl, run_access_control
from app.broker.state import BrokerState, run_broker
from app.drain import drain_on_sigterm as draining
from app.routes import consume, groups, health, metrics, offsets, produce, stream, topics
from app.routes.access import AccessMiddleware
from app.routes.errors import BodyLimitMiddleware, CloseWhileDraining, install_error_handlers
from app.routes.models import ProduceRequest
from app.routes.openapi_auth import declare_bearer_auth
from app.settings import Settings
from app.telemetry.request_id import RequestIdMiddleware

API_DESCRIPTION = """Leaderless log broker: append records to topic-partitions with
`POST /produce`, read them with long-polling `POST /consume`. Any broker serves any
partition. See docs/http-api.md."""


def create_app(settings: Settings, *, drain_on_sigterm: bool = False) -> FastAPI:
    """The broker app. ``drain_on_sigterm``: the first SIGTERM drains before the server
    stops (app/drain.py); set where uvicorn serves it, not for apps run in tests."""
    state = BrokerState.create(settings)
    control = AccessControl(settings, state.registry) if settings.auth_enabled else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if control is not None:  # first: a broken auth file stops the start
                await stack.enter_async_context(
                    run_access_control(control, sighup=drain_on_sigterm))
            await stack.enter_async_context(run_broker(state))
            await stack.enter_async_context(draining(drain_on_sigterm, state.drain))
            yield

    app = FastAPI(
        title="leaderless-log broker",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.broker = state
    app.state.service = state
    app.state.auth = control
    install_error_handlers(app)
    # The routes are added to the app's own router rather than include_router()-ed:
    # an included router costs a route-resolution layer on every request.
    for module in (produce, consume, stream, offsets, topics, groups, health, metrics):
        app.router.routes.extend(module.router.routes)
    if control is not None:  # innermost: the HTTP metrics count its refusals
        app.add_middleware(AccessMiddleware, control=control, log_requests=settings.access_log)
    Instrumentator(
        registry=state.registry,
        excluded_handlers=["/metrics", "/metrics/prometheus", "/health"],
        should_group_status_codes=False,
    ).instrument(app, metric_namespace="llog")
    _customise_openapi(app, settings)
    app.add_middleware(CloseWhileDraining, draining=lambda: state.status == "stopping")
    # Outside the rest, so an oversized body is refused before anything reads it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Every answer, refusals included, carries the request's id.
    app.add_middleware(RequestIdMiddleware, max_length=settings.request_id_max_length)
    if settings.cors_allow_origins:  # outermost: preflights and refusals carry CORS headers
        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_allow_origins),
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["retry-after", "www-authenticate", "x-request-id"],
            max_age=settings.cors_max_age_s)
    return app


def _customise_openapi(app: FastAPI, settings: Settings) -> None:
    """Validation failures answer 400 with ErrorResponse: drop FastAPI's default 422.
    With auth on, declare the bearer scheme and the refusals it brings."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            # Bodies a route parses itself (so FastAPI does not see them) are named here.
            _, extra = models_json_schema([(ProduceRequest, "validation")],
                                          ref_template="#/components/schemas/{model}")
            for name, model_schema in extra.get("$defs", {}).items():
                schemas.setdefault(name, model_schema)
            if settings.auth_enabled:
                declare_bearer_auth(schema, settings)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn's ``--factory`` (each worker builds its own app)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return create_app(Settings.from_env(), drain_on_sigterm=True)
