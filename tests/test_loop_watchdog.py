"""The loop watchdog (app/broker/loop_watchdog.py), as logic: it reports a loop that has
not run for its bound, from its own thread, and nothing while the loop runs."""

from __future__ import annotations

import threading
import time

import anyio

from app.broker.loop_watchdog import LoopWatchdog


async def test_a_blocked_loop_is_reported_from_the_watching_thread_and_a_running_one_not(
        ) -> None:
    reported: list[float] = []
    seen = threading.Event()

    def on_stall(stalled_s: float) -> None:
        reported.append(stalled_s)
        seen.set()

    watchdog = LoopWatchdog(0.4, on_stall)
    async with anyio.create_task_group() as tg:
        await tg.start(watchdog.run)
        await anyio.sleep(1.0)  # the loop runs: stamped every 0.25 s
        assert reported == []
        time.sleep(1.5)  # noqa: ASYNC251 (the loop blocked on purpose)
        assert seen.is_set() and reported[0] >= 0.4  # reported while it was blocked
        tg.cancel_scope.cancel()
