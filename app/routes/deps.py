"""The running broker, as route handlers receive it."""

from __future__ import annotations

from fastapi import Request

from app.broker.assembly import Broker


async def running_broker(request: Request) -> Broker:
    # async on purpose: FastAPI runs a plain-def dependency in a worker thread.
    # The app's lifespan assembled it (app/broker/assembly.py) before any request.
    broker: Broker = request.app.state.broker
    return broker
