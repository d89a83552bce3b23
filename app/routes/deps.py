"""Access to the running broker from route handlers."""

from __future__ import annotations

from fastapi import Request

from app.broker.state import BrokerState


async def broker_state(request: Request) -> BrokerState:
    # async on purpose: FastAPI runs a plain-def dependency in a worker thread.
    state: BrokerState = request.app.state.broker
    return state

