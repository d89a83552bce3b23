"""Errors of the produce batcher (part of the engine's :class:`LogError` hierarchy)."""

from __future__ import annotations

from app.storage.errors import LogError


class BackPressureRejected(LogError):
    """The produce buffer is full: nothing was written; retry after a short pause."""


class BatcherClosed(BackPressureRejected):
    """The broker is shutting down: nothing was written; retry on another broker.

    Reported with ``error_type`` BackPressureRejected, since clients treat it the same.
    """

    @property
    def error_type(self) -> str:
        return "BackPressureRejected"
