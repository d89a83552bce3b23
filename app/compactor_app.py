"""The standalone compactor service's app: ``create_compactor_app(settings)``.

It serves the same ``/health`` (``/ready``, ``/live``) and ``/metrics`` routes as the
broker, over the compaction scheduler that its lifespan runs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

from app.compaction.service import CompactorService, run_compactor
from app.drain import drain_on_sigterm as draining
from app.gc_policy import collector_policy, own_process
from app.routes import table
from app.routes.openapi import install_openapi
from app.routes.openapi_auth import declare_metrics_token
from app.settings import Settings
from app.telemetry.request_id import RequestIdMiddleware


def create_compactor_app(settings: Settings, *, drain_on_sigterm: bool = False) -> FastAPI:
    service = CompactorService.create(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with run_compactor(service), draining(drain_on_sigterm, service.drain):
            yield

    app = FastAPI(title="leaderless-log compactor", version="0.1.0", lifespan=lifespan,
                  description="Compacts the WAL entries of topic-partitions "
                              "(docs/protocol.md, Compaction and recovery).")
    app.state.compactor = service
    app.state.service = service
    app.state.metrics_token = settings.metrics_token
    app.router.routes.extend(row.route for row in table.compactor_routes())
    install_openapi(app, finish=functools.partial(declare_metrics_token, settings=settings))
    app.add_middleware(RequestIdMiddleware, max_length=settings.request_id_max_length)
    return app


def create_compactor_app_from_env() -> FastAPI:
    """Entry point for uvicorn's ``--factory``."""
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings.from_env()
    app = create_compactor_app(settings, drain_on_sigterm=True)
    return own_process(app, collector_policy(settings), app.state.compactor.registry)
