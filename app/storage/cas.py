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
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
