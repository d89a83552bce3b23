"""A process-wide bound on the bytes held by consume answers in flight.

Each consume request may read up to its ``max_bytes`` (64 MiB at most), and a broker
serves a thousand long-polls at once: without a bound, a burst of catch-up reads holds
their product in memory (64 GiB) and the process is killed. Every answer instead holds a
:class:`Reservation` of this budget: room for what it is about to read is reserved before
the read, cut to what the read returned once it has, and given back when the answer
has been sent. A reservation that does not fit waits, first come first served (so a
large request is not overtaken for ever by small ones), for at most ``max_wait_s``, and
is then refused with :class:`~app.errors.Unavailable` (503, ``Retry-After``): the client
retries, the broker does not run out of memory.

Only growth *before* a read waits. Bytes a request already holds (records read, an
answer encoded) are recorded with :meth:`Reservation.hold` without waiting: waiting
while holding memory is how a full budget would deadlock. Such overshoot is bounded by
the request's own answer (a first record larger than ``max_bytes``, the encoding of a
JSON answer) and new reservations wait until the budget is back under its limit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from app.errors import Unavailable


@dataclass(frozen=True)
class AnswerBudgetStats:
    bytes_in_flight: int
    max_bytes_in_flight: int
    peak_bytes_in_flight: int
    waiting: int
    refused: int


class _Waiter:
    __slots__ = ("granted", "need", "ready")

    def __init__(self, need: int) -> None:
        self.need = need
        self.granted = False
        self.ready = anyio.Event()


class AnswerBudget:
    def __init__(self, limit_bytes: int, *, max_wait_s: float) -> None:
        if limit_bytes < 1:
            raise ValueError("the answer budget must be at least one byte")
        self.limit = limit_bytes
        self.max_wait_s = max_wait_s
        self._in_flight = 0
        self._peak = 0
        self._refused = 0
        self._queue: deque[_Waiter] = deque()

    def statistics(self) -> AnswerBudgetStats:
        return AnswerBudgetStats(self._in_flight, self.limit, self._peak, len(self._queue),
                                 self._refused)

    def reservation(self) -> Reservation:
        """An empty reservation (holds nothing until it grows)."""
        return Reservation(self)

    def try_hold(self, n: int) -> Callable[[], None] | None:
        """Take ``n`` bytes now if they fit and nobody is waiting, for work worth doing
        only when there is room (reading ahead): the function returned gives them back
        (once). None: no room now, nothing taken."""
        if self._queue or self._in_flight + n > self.limit:
            return None
        self._take(n)
        held = [n]

        def give_back() -> None:
            if held:
                self._give(held.pop())

        return give_back

    async def _acquire(self, need: int) -> None:
        """Take ``need`` bytes, waiting in line for at most ``max_wait_s``; raises
        :class:`~app.errors.Unavailable` after that. A cancelled wait takes nothing."""
        if not self._queue and self._in_flight + need <= self.limit:
            self._take(need)
            return
        waiter = _Waiter(need)
        self._queue.append(waiter)
        try:
            with anyio.move_on_after(self.max_wait_s):
                await waiter.ready.wait()
        except BaseException:  # cancelled from outside: leave the line, or give back
            if waiter.granted:
                self._give(need)
            else:
                self._leave(waiter)
            raise
        if not waiter.granted:
            self._leave(waiter)
            self._refused += 1
            raise Unavailable(
                f"answers in flight hold {self._in_flight} of the {self.limit} bytes "
                "LLOG_MAX_ANSWER_BYTES_IN_FLIGHT allows; retry shortly")

    def _leave(self, waiter: _Waiter) -> None:
        self._queue.remove(waiter)
        self._grant()  # the line may have been held up by this waiter

    def _take(self, n: int) -> None:
        self._in_flight += n
        self._peak = max(self._peak, self._in_flight)

    def _give(self, n: int) -> None:
        self._in_flight -= n
        self._grant()

    def _grant(self) -> None:
        """Wake the waiters at the head of the line that now fit, in order."""
        while self._queue and self._in_flight + self._queue[0].need <= self.limit:
            waiter = self._queue.popleft()
            waiter.granted = True
            self._take(waiter.need)
            waiter.ready.set()


class Reservation:
    """The bytes one answer holds of the budget; release it however the answer ends."""

    __slots__ = ("_budget", "held")

    def __init__(self, budget: AnswerBudget) -> None:
        self._budget = budget
        self.held = 0

    async def reserve(self, n: int) -> None:
        """Hold at least ``n`` bytes (at most the whole budget: a request larger than the
        budget runs alone), waiting for them; raises :class:`~app.errors.Unavailable`."""
        need = min(n, self._budget.limit) - self.held
        if need > 0:
            await self._budget._acquire(need)
            self.held += need  # no checkpoint since the grant: nothing can be lost

    def hold(self, n: int) -> None:
        """Hold exactly ``n`` bytes from now on, without waiting: bytes already in memory
        (what a read returned, an encoded answer); less gives the rest back."""
        n = max(0, n)
        if n > self.held:
            self._budget._take(n - self.held)
        elif n < self.held:
            self._budget._give(self.held - n)
        self.held = n

    def release(self) -> None:
        self.hold(0)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()
