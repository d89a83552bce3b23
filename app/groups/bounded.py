"""Per-partition work of one request, a bounded number at once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

import anyio

from app.errors import LlogError

A = TypeVar("A")
T = TypeVar("T")
CONCURRENCY = 16


async def each(items: Sequence[A], work: Callable[[A], Awaitable[T]]) -> list[T | LlogError]:
    """``work`` on every item, at most CONCURRENCY at once: its result or its error."""
    out: list[T | LlogError | None] = [None] * len(items)
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def run(i: int, item: A) -> None:
        async with limiter:
            try:
                out[i] = await work(item)
            except LlogError as exc:
                out[i] = exc

    async with anyio.create_task_group() as tg:
        for i, item in enumerate(items):
            tg.start_soon(run, i, item)
    return cast(list[T | LlogError], out)


def first_error(outcomes: Sequence[T | LlogError]) -> LlogError | None:
    return next((o for o in outcomes if isinstance(o, LlogError)), None)
