"""The start-up race fix for the oxia client's service discovery."""

from __future__ import annotations

import threading

from oxia.internal.service_discovery import ServiceDiscovery

from app.storage import oxia_compat


def test_the_assignment_thread_may_touch_the_barrier_before_init_creates_it() -> None:
    oxia_compat.install()
    discovery = object.__new__(ServiceDiscovery)
    seen_by_thread = discovery._init_barrier  # the thread got there first
    discovery._init_barrier = threading.Barrier(2)  # __init__ assigns later: first wins
    assert discovery._init_barrier is seen_by_thread
    assert seen_by_thread.parties == 2


def test_install_is_idempotent() -> None:
    oxia_compat.install()
    descriptor = ServiceDiscovery.__dict__["_init_barrier"]
    oxia_compat.install()
    assert ServiceDiscovery.__dict__["_init_barrier"] is descriptor
