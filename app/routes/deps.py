"""Access to the running broker from route handlers."""

from __future__ import annotations

from fastapi import Request

from app.broker.state import BrokerState


def broker_state(request: Request) -> BrokerState:
    state: BrokerState = request.app.state.broker
    return state
