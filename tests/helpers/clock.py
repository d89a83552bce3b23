"""A wall clock (milliseconds) that tests move by hand."""

from __future__ import annotations

from app.storage.metadata import now_ms


class FakeClock:
    def __init__(self, start_ms: int | None = None) -> None:
        self.now = now_ms() if start_ms is None else start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms
