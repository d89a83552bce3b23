"""The broker application: ``create_app(settings)``; nothing is built at import time."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_fastapi_instrumentator import Instrumentator

from app.broker.state import BrokerState, run_broker
from app.drain import drain_on_sigterm as draining
from app.routes import consume, health, metrics, offsets, produce, topics
from app.routes.errors import BodyLimitMiddleware, CloseWhileDraining, install_error_handlers
from app.routes.openapi import install_openapi
from app.settings import Settings

API_DESCRIPTION = """Leaderless log broker: append records to topic-partitions with
`POST /produce`, read them with long-polling `POST /consume`. Any broker serves any
partition. See docs/http-api.md."""


def create_app(settings: Settings, *, drain_on_sigterm: bool = False) -> FastAPI:
    """The broker app. ``drain_on_sigterm``: the first SIGTERM drains before the server
    stops (app/drain.py); set where uvicorn serves it, not for apps run in tests."""
    state = BrokerState.create(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with run_broker(state), draining(drain_on_sigterm, state.drain):
            yield

    app = FastAPI(
        title="leaderless-log broker",
        version="0.1.0",
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.broker = state
    app.state.service = state
    install_error_handlers(app)
    # The routes are added to the app's own router rather than include_router()-ed:
    # an included router costs a route-resolution layer on every request.
    for module in (produce, consume, offsets, topics, health, metrics):
        app.router.routes.extend(module.router.routes)
    Instrumentator(
        registry=state.registry,
        excluded_handlers=["/metrics", "/metrics/prometheus", "/health"],
        should_group_status_codes=False,
    ).instrument(app, metric_namespace="llog")
    install_openapi(app)
    app.add_middleware(CloseWhileDraining, draining=lambda: state.status == "stopping")
    # Outermost, so an oversized body is refused before anything reads it.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn's ``--factory`` (each worker builds its own app)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    return create_app(Settings.from_env(), drain_on_sigterm=True)
