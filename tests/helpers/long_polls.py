"""Long-polls parked in a broker process, as its metrics report them (the only window
into another process: there is no event to wait on), so that a test writes only once
its long-poll has looked, found nothing and waits."""

from __future__ import annotations

import anyio
import httpx

# Far beyond any bound a test waits with: a long-poll that answers within one was woken,
# it did not run out (the broker has to allow it: LLOG_MAX_WAIT_MS_CEILING).
NEVER_MS = 600_000


async def parked(client: httpx.AsyncClient) -> float:
    """The broker's ``llog_consume_long_polls`` gauge (with several workers, any one
    answers for all of them)."""
    text = (await client.get("/metrics/prometheus")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("llog_consume_long_polls "))


async def until_parked(client: httpx.AsyncClient, count: int = 1) -> None:
    """Until ``count`` long-polls wait; the caller's bound ends a wait for ones that
    never park."""
    while True:  # polled: another process's state
        if await parked(client) >= count:
            return
        await anyio.sleep(0.05)
