"""The start-up race fix for the oxia client's service discovery."""

from __future__ import annotations

import threading

from oxia.internal.service_discovery import ServiceDiscovery

from app.stores.oxia import patches as oxia_patches


def test_the_assignment_thread_may_touch_the_barrier_before_init_creates_it() -> None:
    oxia_patches.install()
    discovery = object.__new__(ServiceDiscovery)
    seen_by_thread = discovery._init_barrier  # the thread got there first
    discovery._init_barrier = threading.Barrier(2)  # __init__ assigns later: first wins
    assert discovery._init_barrier is seen_by_thread
    assert seen_by_thread.parties == 2


def test_install_is_idempotent() -> None:
    oxia_patches.install()
    descriptor = ServiceDiscovery.__dict__["_init_barrier"]
    oxia_patches.install()
    assert ServiceDiscovery.__dict__["_init_barrier"] is descriptor


def test_close_marks_the_discovery_closed_before_the_channels() -> None:
    from oxia.client import Client

    oxia_patches.install()
    order: list[str] = []

    class Discovery:
        _closed = False

        def close(self) -> None:
            order.append("discovery.close")

    class Closeable:
        def __init__(self, name: str, discovery: Discovery) -> None:
            self.name, self.discovery = name, discovery

        def close(self) -> None:
            order.append(f"{self.name} (discovery closed: {self.discovery._closed})")

    client = object.__new__(Client)
    discovery = Discovery()
    client._service_discovery = discovery
    client._session_manager = Closeable("sessions", discovery)
    client._connections = Closeable("connections", discovery)
    client.close()
    assert "connections (discovery closed: True)" in order
