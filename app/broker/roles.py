"""The services of a role this broker process does not have refuse when called.

A broker runs the roles LLOG_ROLES names; the services of the others are never built.
Asking :class:`~app.broker.state.BrokerState` for one of those (``consume_service``,
``log_reader``, ``group_service``, ``topic_admin``, ``write_topics``, or appending)
raises :class:`~app.errors.RoleDisabled` with the refusal below, as a closed stream
raises its own error when used: no handler checks for a missing service, and the
refusal of each role is written once.
"""

from __future__ import annotations

from typing import TypeVar

from app.errors import RoleDisabled

T = TypeVar("T")

READ = "this broker does not have the read role"
WRITE = "this broker does not have the write role"
GROUPS = "this broker does not serve consumer groups (it needs the read role)"
ADMIN = "this broker does not serve topic administration (it needs the read role)"


def required(service: T | None, refusal: str) -> T:
    """``service``, or :class:`RoleDisabled` with ``refusal`` when the role is off."""
    if service is None:
        raise RoleDisabled(refusal)
    return service
