"""What a test needs of the session's ``brokers`` fixture, as types: a test module names
these instead of importing the fixture's class."""

from __future__ import annotations

from typing import Protocol


class RunningBroker(Protocol):
    url: str


class StartsBrokers(Protocol):
    def start(self, *, workers: int = 1, **settings: str) -> RunningBroker:
        """A `llog serve` process with ``settings`` as LLOG_* variables, healthy."""
        ...
