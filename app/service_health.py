"""Where a service process stands, for ``/health`` and the readiness figure: the one
status the broker and the compactor service both keep.

A service is ``starting`` until it takes work (``ok``), ``stopping`` from its drain or
shutdown on, and ``failed`` once a background loop crashed, with why in ``failure``. A
crashed loop does not take the process down: it keeps answering ``/health`` (503), so
an orchestrator replaces it, rather than the loop dying unseen or the HTTP server with
it. ``failed`` is final: neither the end of the start nor the shutdown hides it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import anyio
import anyio.abc

log = logging.getLogger(__name__)

Status = Literal["starting", "ok", "stopping", "failed"]
# A background loop: runs until cancelled, and tells ``task_status`` once it has started.
Loop = Callable[..., Awaitable[None]]


class ServiceHealth:
    """The status of one service process, and the loops it watches."""

    def __init__(self) -> None:
        self.status: Status = "starting"
        self.failure: str | None = None  # repr of the crash, once failed
        self.started_at_ms = int(time.time() * 1000)

    @property
    def ready(self) -> bool:
        """Whether the service takes work (``/health/ready`` answers 200)."""
        return self.status == "ok"

    def serving(self) -> None:
        """Started: it takes work from now on (unless a loop failed meanwhile)."""
        if self.status == "starting":
            self.status = "ok"

    def not_ready(self) -> None:
        """A drain's first step: not ready from now on, so load balancers stop sending
        work, while still live (app/drain.py)."""
        if self.status == "ok":
            self.status = "stopping"

    def stopping(self) -> None:
        """The shutdown has begun (a failed service stays failed)."""
        if self.status != "failed":
            self.status = "stopping"

    def fail(self, exc: BaseException) -> None:
        self.status = "failed"
        self.failure = repr(exc)

    async def watched(self, run: Loop, *,
                      task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                      ) -> None:
        """Run a background loop; if it crashes, the service is failed (not ready, not
        live) and the crash logged, and the loop's task group goes on."""
        try:
            await run(task_status=task_status)
        except Exception as exc:
            self.fail(exc)
            log.exception("background loop %s crashed", getattr(run, "__qualname__", run))
