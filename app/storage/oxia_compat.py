"""A fix for a start-up race in the ``oxia`` Python client (0.2.x).

``ServiceDiscovery.__init__`` starts its shard-assignment thread before it creates the
barrier that thread signals; when the first assignments arrive quickly, the thread hits
a missing attribute and dies, and the constructor then waits its full 30 s and fails.
Making the barrier a lazily created, first-wins attribute closes the race without
touching anything else. :func:`install` is idempotent and runs when this module loads.
"""

from __future__ import annotations

import threading
from typing import Any

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


def install() -> None:
    if not isinstance(ServiceDiscovery.__dict__.get("_init_barrier"), _FirstWinsBarrier):
        ServiceDiscovery._init_barrier = _FirstWinsBarrier()


install()
