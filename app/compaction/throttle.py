"""A byte-rate throttle for compaction (``LLOG_COMPACTION_MAX_BYTES_PER_S``).

Compaction is background work: every byte produced is read again and rewritten once it
is old enough, and on a shared machine that work (the compactor's own, and that of the
S3 and Oxia servers it calls) competes with produce and consume. The throttle lets it
run at most at a set byte rate, so the foreground keeps its share and the backlog is
caught up when load falls (its size is the compaction lag metric).

One throttle per compactor process, shared by its concurrent visits. The model is a
debt: a run is paid for after it is done, with the WAL bytes it rewrote (as
decompressed, as ``select_run`` counts them), because its size is only known once
selected and a run larger than any budget must still go through: it just leaves a
longer debt. The balance refills at the rate up to one second's worth (a small run
does not wait at all), goes negative when a run costs more than it holds, and new work
waits until it is back at zero. Waiting never happens under a partition's claim: the
scheduler waits before it claims (app/compaction/scheduler.py).

Clock and sleep are injected, so tests drive time by hand.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from app.auth.quotas import TokenBucket

# How much unspent budget the balance keeps: one second at the rate. A pause in the
# load banks no more than that, so a burst after it stays near the rate.
BURST_S = 1.0


@dataclass(frozen=True)
class ThrottleStatistics:
    """What the throttle holds and has done (anyio's ``statistics()`` style)."""

    max_bytes_per_s: int | None  # None: unlimited
    balance_bytes: float  # negative: the debt still to be paid off
    bytes_paid: int
    seconds_waited: float
    tasks_waiting: int


class Throttle:
    """Pay after, wait before: ``pay(n)`` once a run is done, ``await wait()`` before
    starting the next one. With ``max_bytes_per_s`` None it never waits."""

    def __init__(self, max_bytes_per_s: int | None, *,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] | None = None) -> None:
        if max_bytes_per_s is not None and max_bytes_per_s <= 0:
            raise ValueError("max_bytes_per_s must be positive (or None: unlimited)")
        self._rate = max_bytes_per_s
        self._clock = clock or time.monotonic
        self._sleep = sleep or anyio.sleep
        # The balance: the project's token bucket, charged after the work (a debt).
        self._bucket = None if max_bytes_per_s is None else TokenBucket(
            max_bytes_per_s, max_bytes_per_s * BURST_S, self._clock())
        self._bytes_paid = 0
        self._seconds_waited = 0.0
        self._waiting = 0
        self._closed = False
        self._closing: anyio.Event | None = None  # created by a waiter, inside the loop

    @property
    def limited(self) -> bool:
        return self._rate is not None

    @property
    def in_debt(self) -> bool:
        """True while new work should wait (never when unlimited)."""
        return self._settle() < 0

    def pay(self, nbytes: int) -> None:
        """Charge a finished run's bytes; the balance may go as negative as it takes."""
        if nbytes <= 0:
            return
        self._bytes_paid += nbytes
        if self._bucket is not None:
            self._bucket.charge(nbytes, self._clock())

    def seconds_owed(self) -> float:
        """How long until the balance is back at zero (0 when not in debt)."""
        balance = self._settle()
        if balance >= 0 or self._rate is None:
            return 0.0
        return -balance / self._rate

    async def wait(self) -> bool:
        """Return once out of debt: True, or False if :meth:`close` was called (before or
        meanwhile). Cancellation propagates as usual."""
        if self._closed:
            return False
        owed = self.seconds_owed()
        if owed <= 0:
            return True
        if self._closing is None:
            self._closing = anyio.Event()
        closing = self._closing
        started = self._clock()
        self._waiting += 1
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._cancel_on, closing, tg.cancel_scope)
                # Other visits may pay while this one sleeps: wait until out of debt.
                while owed > 0:
                    await self._sleep(owed)
                    owed = self.seconds_owed()
                tg.cancel_scope.cancel()
        finally:
            self._waiting -= 1
            self._seconds_waited += max(0.0, self._clock() - started)
        return not self._closed

    def close(self) -> None:
        """Wake every waiter (their ``wait`` returns False) and refuse later waits: the
        owner is stopping and starts no new work."""
        self._closed = True
        if self._closing is not None:
            self._closing.set()

    def statistics(self) -> ThrottleStatistics:
        return ThrottleStatistics(self._rate, self._settle() if self._rate else 0.0,
                                  self._bytes_paid, self._seconds_waited, self._waiting)

    @staticmethod
    async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
        await event.wait()
        scope.cancel()

    def _settle(self) -> float:
        """The balance now (0 when unlimited)."""
        return 0.0 if self._bucket is None else self._bucket.level_at(self._clock())
