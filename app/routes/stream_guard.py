"""Keeps an event stream's access current for as long as it runs.

A stream is one request that may last for hours, so the check its request passed at the
start is not enough: the API key may be removed from the auth file, the principal's
rights narrowed, its JWT may expire. :class:`StreamGuard` re-checks the principal each
time the auth file is loaded (it waits on the generation the loader bumps, beside the
stream's own read, so nothing is polled per record) and when its credential expires,
which every batch also checks against the clock before it is sent; the stream then
ends with an ``error`` event naming the refusal, as the HTTP API would have answered it
(``Unauthenticated``, ``Forbidden``).

Each read after the first is charged to the principal's request quota, as the
``POST /consume`` that would read the same records is: a stream is not a way around the
quota. Over it, the stream waits for as long as a 429's ``Retry-After`` would say
(sending heartbeats) instead of ending, which is what a consumer honouring the 429 does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from app.auth.control import AccessControl, Principal
from app.auth.rights import Right
from app.clock import wall_s
from app.errors import AccessError, QuotaExceeded

T = TypeVar("T")


class StreamGuard:
    def __init__(self, control: AccessControl, principal: Principal, topic: str) -> None:
        self.control = control
        self.principal = principal
        self._topic = topic
        self._generation = control.generation

    def refusal(self) -> AccessError | None:
        """Why the principal may no longer read the topic, or None while it may."""
        try:
            self.control.recheck(self.principal, Right.CONSUME, [self._topic])
        except AccessError as exc:
            return exc
        return None

    def throttle(self) -> int:
        """Charge one read to the principal's request quota, as a POST /consume would
        be: 0 when granted, else the seconds the 429 would have said to wait."""
        try:
            self.control.charge_request(self.principal)
        except QuotaExceeded as exc:
            return exc.retry_after_s
        return 0

    async def revoked(self) -> AccessError:
        """Return the refusal once a load of the auth file, or the credential's expiry,
        takes the stream's access away."""
        while True:
            expires_at = self.principal.expires_at
            wait_s = float("inf") if expires_at is None else expires_at - wall_s()
            with anyio.move_on_after(max(0.0, wait_s)):
                await self.control.changed(self._generation)
            self._generation = self.control.generation
            refused = self.refusal()
            if refused is not None:
                return refused

    async def unless_revoked(self, work: Callable[[], Awaitable[T]]
                             ) -> tuple[T] | AccessError:
        """``(result,)`` of ``work()``, or the refusal if access was taken away first
        (``work`` is then cancelled; a refusal wins over a read that ended with it)."""
        done: list[T] = []
        refused: list[AccessError] = []
        try:
            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    done.append(await work())
                    tg.cancel_scope.cancel()

                async def watch() -> None:
                    refused.append(await self.revoked())
                    tg.cancel_scope.cancel()

                tg.start_soon(run)
                tg.start_soon(watch)
        except BaseExceptionGroup as group:
            # A refusal wins over what the read raised: the stream ends saying why.
            revoked = refused[0] if refused else self.refusal_now()
            if revoked is not None:
                return revoked
            # What ``work`` raised (the answer budget full, say), as itself: the caller
            # handles errors it knows, not the task group's wrapping of them.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        if refused:
            return refused[0]
        # The watch runs only when the loop schedules it, and a read that never waits
        # (a backlog in the cache) ends the race before it does: the clock decides, so
        # no batch read at or past the credential's end is sent.
        revoked = self.refusal_now()
        return revoked if revoked is not None else (done[0],)

    def refusal_now(self) -> AccessError | None:
        """The refusal if the credential has expired by the clock or the auth file was
        loaded again since the last check (without waiting: before each event that
        carries records)."""
        expires_at = self.principal.expires_at
        expired = expires_at is not None and wall_s() >= expires_at
        if not expired and self.control.generation == self._generation:
            return None
        self._generation = self.control.generation
        return self.refusal()
