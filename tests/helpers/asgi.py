"""A broker app in the test's own process, spoken to through httpx's ASGI transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import FastAPI

from app.broker.assembly import Broker, compose
from app.broker.process import BrokerProcess
from app.broker.read_side import ReadSide
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


def roleless_broker(process: BrokerProcess) -> Broker:
    """A broker of no role, composed without store clients: every service it has is a
    stand-in that refuses (app/broker/roles.py), and the parts every broker has are
    missing. For an app whose lifespan does not run, given to it as ``app.state.broker``,
    where no request reaches a service."""
    missing: Any = None
    return compose(process, missing, missing, missing, missing, missing, None, None,
                   ReadSide.disabled(), None)
