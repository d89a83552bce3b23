"""Long-polls parked in a broker process, as its metrics report them (the only window
into another process: there is no event to wait on), so that a test writes only once
its long-poll has looked, found nothing and waits."""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from tests.helpers.bodies import consume_body, produce_body

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


async def woken_by_a_write(poller: httpx.AsyncClient, writer: httpx.AsyncClient,
                           topic: str, value: str) -> dict[str, Any]:
    """Park a long-poll of ``topic`` at offset 1 on ``poller``, then write ``value``
    through ``writer``; the poll's result. Its own deadline is far beyond this bound,
    which only catches a poll that was never woken."""
    got: dict[str, Any] = {}

    async def poll() -> None:
        r = await poller.post("/consume", json=consume_body(topic, 1, max_wait_ms=NEVER_MS))
        got.update(r.json()["results"][0])

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)
            await until_parked(poller)
            r = await writer.post("/produce", json=produce_body(topic, value))
            assert r.status_code == 200
    return got
