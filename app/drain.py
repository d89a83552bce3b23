"""A drain that load balancers understand: not ready first, then stop.

Without it, SIGTERM makes uvicorn close its listening socket at once; a load balancer
that has not yet seen the process go unhealthy keeps sending it requests, and the ones
queued to it are dropped unanswered (the client sees a 502 it did nothing to cause).

So the first SIGTERM only *starts* a drain: the service turns not-ready
(``/health/ready`` answers 503, ``/health/live`` still 200), answers its parked
long-polls at once, and keeps serving for ``LLOG_DRAIN_S`` while health checks notice.
Then the signal goes on to the server, which stops accepting, finishes the requests in
flight and runs the shutdown (the broker flushes what is buffered and answers every
waiter). More SIGTERMs during the drain change nothing (a supervisor that signals the
whole process group, and uvicorn's parent passing the signal on, both send one); SIGINT
stops the server at once.

Every uvicorn worker installs this in its own lifespan (signal handlers are per process
and uvicorn installs its own before the lifespan starts), so ``llog serve --workers N``
drains every worker the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from types import FrameType
from typing import Any

import anyio

log = logging.getLogger(__name__)
Handler = Callable[[int, FrameType | None], Any] | int | None


class _Hook:
    """Takes over SIGTERM from whoever handled it (uvicorn) and hands it back later."""

    def __init__(self, loop: asyncio.AbstractEventLoop, requested: anyio.Event) -> None:
        self._loop = loop
        self._requested = requested
        self._previous: Handler = None
        self._draining = False

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        if not self._draining:
            self._draining = True
            self._loop.call_soon_threadsafe(self._requested.set)

    def proceed(self, frame: FrameType | None = None) -> None:
        """Hand SIGTERM to the previous handler (the server's shutdown)."""
        if callable(self._previous):
            self._previous(signal.SIGTERM, frame)
        else:
            signal.raise_signal(signal.SIGTERM)


@contextlib.asynccontextmanager
async def drain_on_sigterm(enabled: bool, drain: Callable[[], Awaitable[None]]
                           ) -> AsyncIterator[None]:
    """While inside, the first SIGTERM runs ``drain`` and only then stops the server."""
    if not enabled:
        yield
        return
    requested = anyio.Event()
    hook = _Hook(asyncio.get_running_loop(), requested)

    async def wait_and_drain() -> None:
        await requested.wait()
        log.info("SIGTERM: draining before shutdown")
        try:
            await drain()
        finally:
            hook.proceed()

    hook.install()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_and_drain)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
    finally:
        hook.uninstall()
