"""A broker app in the test's own process, spoken to through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import FastAPI

from app.factory import create_app
from app.localstack.stack import LocalStack
from tests.helpers.stack import make_settings


@contextlib.asynccontextmanager
async def in_process_broker(stack: LocalStack, **overrides: Any
                            ) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a broker on ``stack`` (settings ``overrides``), started and stopped
    with the context; a fresh one has an empty tail cache, so it reads from the store."""
    app = create_app(make_settings(stack, **overrides))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``, its lifespan entered within a minute, each request bounded."""
    with anyio.fail_after(60):
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://broker",
                timeout=30) as client:
            yield client
