"""Race a long wait against the client going away, in one task group."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from fastapi import Request

T = TypeVar("T")


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]
                              ) -> tuple[T] | None:
    """``(result,)`` of ``work()``, or None if the client disconnected first (``work`` is
    then cancelled). Only for requests whose body has been read already."""
    done: list[T] = []
    try:
        await _race(request, work, done)
    except BaseExceptionGroup as group:
        # What ``work`` raised (a refusal, say), as itself: the group is the task
        # group's wrapping, which no error handler would recognise.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    return (done[0],) if done else None


async def _race(request: Request, work: Callable[[], Awaitable[T]], done: list[T]) -> None:
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            done.append(await work())
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        tg.start_soon(watch)
