"""The web console every broker serves at ``/console`` (off with ``LLOG_CONSOLE=off``).

A small single-page app of plain ES modules (``assets/``), type-checked by TypeScript
through its JSDoc comments and shipped as written: no build step, no Node to install or
run the broker, nothing loaded from outside the broker. It reads and changes everything
through the broker's own HTTP API, with the person's token (kept in the tab's session
storage) as its bearer header and stream tickets for its live tails, so it holds exactly
the rights of whoever uses it and pages large reads as any client must. The server side
is what the API has no route for: the page and its assets, the broker's recent metrics
(sampled in process into a bounded ring, so no metrics token reaches the browser), the
partitions' preferred brokers, and the standalone compactor's health and figures when
the broker is told where it is (docs/console.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
from fastapi import FastAPI
from pydantic import SecretStr

from app.console.compactor import CompactorProbe
from app.console.routes import console_router
from app.console.series import MetricsRing
from app.telemetry.registry import ServiceRegistry

__all__ = ["install_console"]


def install_console(app: FastAPI, registry: ServiceRegistry, *, compactor_url: str | None,
                    metrics_token: SecretStr | None
                    ) -> contextlib.AbstractAsyncContextManager[None]:
    """Add the console's routes to ``app``; the returned context samples the metrics
    (and holds the compactor probe's connections) while it is entered (the app's
    lifespan enters it)."""
    ring = MetricsRing(registry)
    probe = CompactorProbe(compactor_url, metrics_token) if compactor_url else None
    app.router.routes.extend(console_router(ring, probe).routes)
    return _running(ring, probe)


@contextlib.asynccontextmanager
async def _running(ring: MetricsRing, probe: CompactorProbe | None) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        if probe is not None:
            await stack.enter_async_context(probe)
        group = await stack.enter_async_context(anyio.create_task_group())
        group.start_soon(ring.run)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
