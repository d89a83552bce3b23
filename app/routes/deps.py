"""Access to the running broker from route handlers."""

from __future__ import annotations

from fastapi import Request

from app.broker.state import BrokerState
from app.errors import RoleDisabled
from app.groups.service import GroupService


async def broker_state(request: Request) -> BrokerState:
    # async on purpose: FastAPI runs a plain-def dependency in a worker thread.
    state: BrokerState = request.app.state.broker
    return state


def groups_of(state: BrokerState) -> GroupService:
    """The broker's consumer groups (a broker without the read role has none)."""
    if state.groups is None:
        raise RoleDisabled("this broker does not serve consumer groups (it needs the read "
                           "role)")
    return state.groups
