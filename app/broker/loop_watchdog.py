"""Ends a broker worker whose event loop has stopped running.

The Oxia client keeps this worker's session alive from threads of its own, so a worker
whose event loop hangs (a blocking call, a deadlock, a stall of the whole process but
those threads) would stay in every peer's view, and in every partition's preferred
appender, and keep receiving forwards it cannot answer. Membership must follow the
loop: the loop stamps a clock every ``STAMP_S``; a thread of ours reads the stamp, and
once the loop has not run for ``LLOG_LOOP_STALL_S`` it closes the Oxia client, which
ends the session and with it this worker's member record at once (peers drop it on
their next listing), and exits the process. A worker without its session can commit
nothing, and nothing it acknowledged is lost: acknowledged means durable. Its
supervisor (``llog serve --workers N``, or the orchestrator) starts a fresh one, and
what was in flight on it is answered by the clients' retries, as for a crash.

``LLOG_TEST_LOOP_BLOCKER=1`` (not a setting: absent unless a test sets it) makes
SIGUSR2 block the loop for ``LLOG_TEST_LOOP_BLOCK_S`` seconds, so a test can hang a
real worker's loop on purpose.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import anyio
import anyio.abc

log = logging.getLogger(__name__)
STAMP_S = 0.25
# The exit status of a worker ended by the watchdog (EX_SOFTWARE).
STALLED_EXIT = 70
# How long closing the Oxia client may take before the process exits regardless.
CLOSE_BOUND_S = 5.0
BLOCKER_ENV = "LLOG_TEST_LOOP_BLOCKER"
BLOCK_S_ENV = "LLOG_TEST_LOOP_BLOCK_S"


class LoopWatchdog:
    """Stamps from the loop (:meth:`run`), watches from a thread (:meth:`start_watching`);
    ``on_stall`` runs on the watching thread once the stamp is older than ``stall_s``."""

    def __init__(self, stall_s: float, on_stall: Callable[[float], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_s = stall_s
        self._on_stall = on_stall
        self._clock = clock
        self._stamp = clock()
        self.loop_stamp = self._stamp  # written by the loop alone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Stamp the clock every STAMP_S while the loop runs; the watching thread runs
        for as long as this does."""
        global _RUNNING
        _RUNNING = self
        self._stamp = self._clock()
        self.start_watching()
        task_status.started()
        try:
            while True:
                self._stamp = self.loop_stamp = self._clock()
                await anyio.sleep(STAMP_S)
        finally:
            self.stop()
            if _RUNNING is self:  # a stopped watchdog's stamp says nothing of the loop
                _RUNNING = None

    def start_watching(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="llog-loop-watchdog",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def arrival_floor(self, seen: float) -> float:
        """The earliest a request first seen at ``seen`` may have arrived: ``seen``,
        unless the loop had stopped stamping before (a stall, a paused process), in
        which case the request may have waited since the stall began."""
        return min(seen, self.loop_stamp + STAMP_S)

    def stalled_for(self) -> float:
        return self._clock() - self._stamp

    def _watch(self) -> None:
        every = min(1.0, self.stall_s / 4)
        checked = self._clock()
        while not self._stop.wait(every):
            now = self._clock()
            if now - checked > every + self.stall_s / 2:
                # This thread overslept too: the whole process was frozen (SIGSTOP, a
                # paused container or VM, swapping), not the loop alone. The loop gets
                # its time to run again before it is judged.
                self._stamp = now
            checked = now
            stalled = self.stalled_for()
            if stalled >= self.stall_s:
                self._on_stall(stalled)
                return


_RUNNING: LoopWatchdog | None = None  # this process's, while it runs
# The ASGI scope key of a request's arrival at the app (time.monotonic(), floored).
ARRIVED = "llog.arrived"


def arrival_floor(seen: float) -> float:
    """:meth:`LoopWatchdog.arrival_floor` of this process's watchdog (``seen`` without
    one). Called as a request is first seen, before the loop's stamp can catch up."""
    return seen if _RUNNING is None else _RUNNING.arrival_floor(seen)


def end_the_process(close_session: Callable[[], None]) -> Callable[[float], None]:
    """The broker's ``on_stall``: log, close the Oxia session (bounded), exit."""

    def on_stall(stalled_s: float) -> None:
        # Each step in a daemon thread of its own, all within one bound: the loop may
        # be stuck holding a lock of the logging handlers (a full stderr pipe), or in
        # the Oxia client, and the process must exit whatever either does.
        def say() -> None:
            log.critical("the event loop has not run for %.1f s: ending this worker's "
                         "Oxia session and exiting (status %d) so that peers stop "
                         "routing to it", stalled_s, STALLED_EXIT)

        steps = [threading.Thread(target=close_session, name="llog-session-close",
                                  daemon=True),
                 threading.Thread(target=say, name="llog-stall-log", daemon=True)]
        for step in steps:
            step.start()
        deadline = time.monotonic() + CLOSE_BOUND_S
        for step in steps:
            step.join(max(0.0, deadline - time.monotonic()))
        os._exit(STALLED_EXIT)

    return on_stall


def install_test_blocker() -> None:
    """With LLOG_TEST_LOOP_BLOCKER=1, SIGUSR2 blocks the loop (signal handlers run on
    the main thread, the loop's) for LLOG_TEST_LOOP_BLOCK_S seconds (default 60)."""
    if os.environ.get(BLOCKER_ENV) != "1":
        return
    block_s = float(os.environ.get(BLOCK_S_ENV, "60"))

    def block(_signum: int, _frame: FrameType | None) -> None:
        time.sleep(block_s)

    signal.signal(signal.SIGUSR2, block)
