"""Fixes for two races in the ``oxia`` Python client (0.2.x).

- Start-up: ``ServiceDiscovery.__init__`` starts its shard-assignment thread before it
  creates the barrier that thread signals; when the first assignments arrive quickly,
  the thread hits a missing attribute and dies, and the constructor then waits its full
  30 s and fails. The barrier becomes a lazily created, first-wins attribute.
- Shutdown: ``Client.close`` closes the channels before it marks the discovery closed,
  so the assignment thread may retry on a closed channel and die with "Channel closed!".
  The discovery is marked closed first.

:func:`install` is idempotent and runs when this module loads.
"""

from __future__ import annotations

import threading
from typing import Any

from oxia.client import Client
from oxia.internal.service_discovery import ServiceDiscovery

_LOCK = threading.Lock()
_SLOT = "_llog_init_barrier"


class _FirstWinsBarrier:
    """Data descriptor: whoever touches ``_init_barrier`` first creates it."""

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        with _LOCK:
            barrier = obj.__dict__.get(_SLOT)
            if barrier is None:
                barrier = obj.__dict__[_SLOT] = threading.Barrier(2)
            return barrier

    def __set__(self, obj: Any, value: Any) -> None:
        with _LOCK:
            obj.__dict__.setdefault(_SLOT, value)


def _closing_discovery_first(close: Any) -> Any:
    def wrapper(self: Any) -> Any:
        discovery = getattr(self, "_service_discovery", None)
        if discovery is not None:
            discovery._closed = True  # the assignment thread then exits instead of retrying
        return close(self)

    wrapper._llog_fixed = True  # type: ignore[attr-defined]
    return wrapper


def install() -> None:
    if not isinstance(ServiceDiscovery.__dict__.get("_init_barrier"), _FirstWinsBarrier):
        ServiceDiscovery._init_barrier = _FirstWinsBarrier()
    if not getattr(Client.close, "_llog_fixed", False):
        Client.close = _closing_discovery_first(Client.close)


install()
