"""The one compare-and-set retry loop of the engine.

Every change to a coordination record is "read, decide, CAS on the version read"; when
another process wins, read again and decide again. What differs between callers (the
commit of an append, clearing a pending append, moving the compaction cursor, ...) is
only the step itself, so each caller writes one attempt and :func:`cas_loop` drives it:

- :class:`Done` ends the loop with a value;
- :class:`Retry` asks for another attempt (a version conflict, or an unanswered request
  whose outcome the next attempt settles), after a short jittered pause once
  conflicts repeat, so contending processes stop colliding in lock step.

After ``attempts`` attempts without a :class:`Done` the loop raises
:class:`~app.errors.CommitConflict`. Attempts and retries are counted per operation.

:class:`Outage` paces the attempts of a step that Oxia does not answer (a shard electing
a new leader), within a time budget.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
from prometheus_client import Counter

from app.errors import CommitConflict

T = TypeVar("T")

# Conflicts beyond this many attempts pause before retrying, up to MAX_BACKOFF_S.
_BACKOFF_AFTER = 2
_BACKOFF_STEP_S = 0.002
MAX_BACKOFF_S = 0.05


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


@dataclass(frozen=True)
class Retry:
    """Try again; ``reason`` labels the retry in metrics (``conflict``, ``in_doubt``...)."""

    reason: str = "conflict"


Attempt = Callable[[int], Awaitable["Done[T] | Retry"]]


async def cas_loop(attempt: Attempt[T], *, attempts: int, what: str,
                   retries: Counter | None = None, op: str = "cas") -> T:
    """Call ``attempt(n)`` for n = 0, 1, ... until it returns :class:`Done`."""
    for n in range(attempts):
        outcome = await attempt(n)
        if isinstance(outcome, Done):
            return outcome.value
        if retries is not None:
            retries.labels(op, outcome.reason).inc()
        if n + 1 >= _BACKOFF_AFTER:
            await anyio.sleep(random.uniform(0, min(MAX_BACKOFF_S, _BACKOFF_STEP_S * n)))
    raise CommitConflict(f"{what}: gave up after {attempts} compare-and-set attempts "
                         "(other writers kept changing the record)")


@dataclass
class Outage:
    """Paces retries while a store does not answer: :meth:`pause` after each failure
    sleeps a growing pause and says whether to try again, until ``budget_s`` has passed
    since the first failure."""

    budget_s: float
    first_pause_s: float = 0.05
    max_pause_s: float = 1.0
    since: float | None = None
    _pause: float = field(default=0.0, repr=False)

    async def pause(self) -> bool:
        now = time.monotonic()
        if self.since is None:
            self.since, self._pause = now, self.first_pause_s
        left = self.since + self.budget_s - now
        if left <= 0:
            return False
        await anyio.sleep(min(self._pause, left))
        self._pause = min(self._pause * 2, self.max_pause_s)
        return True
