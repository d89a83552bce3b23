"""SIGTERM drains before it stops (app/drain.py): the service turns not-ready while it
keeps serving for LLOG_DRAIN_S, answers parked long-polls at once, ignores repeated
SIGTERMs, then exits cleanly. The broker (one or several workers) and the standalone
compactor behave the same."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import httpx
import pytest

from app.localstack.broker import wait_healthy
from app.localstack.processes import ManagedProcess, free_port
from app.localstack.stack import LocalStack
from tests.helpers.bodies import consume_body
from tests.helpers.stack import BrokerFactory

DRAIN_S = "4"
# After its graceful shutdown uvicorn raises the signal it caught again, so a single
# server process ends "by SIGTERM"; the supervisor of several workers exits with 0.
CLEAN_EXIT = (0, -signal.SIGTERM)


async def _gauge(client: httpx.AsyncClient, name: str) -> float:
    text = (await client.get("/metrics/prometheus")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " "))


# Another process's state is polled: there is no event to wait on across processes.
async def _until_parked(client: httpx.AsyncClient) -> None:
    for _ in range(400):
        if await _gauge(client, "llog_consume_long_polls") >= 1:
            return
        await anyio.sleep(0.05)
    raise AssertionError("the long-poll never parked")


async def _until_draining(url: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=5) as client:
        for _ in range(400):
            r = await client.get("/health/ready")
            if r.status_code == 503:
                return r
            await anyio.sleep(0.05)
    raise AssertionError(f"{url} never turned not-ready")


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_a_broker_then_stops_it(brokers: BrokerFactory, topic: str,
                                                     workers: int) -> None:
    broker = brokers.start(workers=workers, drain_s=DRAIN_S)
    parked: dict[str, object] = {}
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:

        async def park() -> None:
            r = await client.post("/consume", json=consume_body(topic, 1,
                                                                 max_wait_ms=25_000))
            parked.update(status=r.status_code, body=r.json(), at=anyio.current_time())

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(park)
                # With two workers, either one's answer counts the long-poll of both.
                await _until_parked(client)
                broker.process.signal(signal.SIGTERM)
                signalled = anyio.current_time()
                not_ready = await _until_draining(broker.url)
            assert not_ready.json()["status"] == "stopping"
            # The parked long-poll was answered long before its 25 s: empty, not cut.
            assert parked["status"] == 200 and parked["at"] - signalled < 10  # type: ignore[operator]
            assert parked["body"]["results"][0]["records"] == []  # type: ignore[index]

            # Still serving, on fresh connections, and telling clients to go elsewhere.
            async with httpx.AsyncClient(base_url=broker.url, timeout=10) as fresh:
                assert (await fresh.get("/health/live")).status_code == 200
                broker.process.signal(signal.SIGTERM)  # a second one changes nothing
                r = await fresh.post("/produce", json={"topic_partitions": [
                    {"topic": topic, "partition": 0, "records": ["during-drain"]}]})
                assert r.status_code == 200 and r.json()["results"][0]["ok"]
                assert r.headers["connection"] == "close"
    code = await anyio.to_thread.run_sync(broker.process.wait, 60.0)
    assert code in CLEAN_EXIT


async def test_sigterm_drains_the_compactor_then_stops_it(stack: LocalStack,
                                                          tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ManagedProcess(
        "compactor",
        [sys.executable, "-m", "app.cli", "compactor", "--port", str(port),
         "--log-level", "warning"],
        tmp_path / "compactor.log",
        env={**os.environ, **stack.settings_env(), "LLOG_DRAIN_S": DRAIN_S,
             "LLOG_BROKER_ID": "compactor-drain"},
    )
    proc.start()
    try:
        wait_healthy(proc, url)
        with anyio.fail_after(60):
            proc.signal(signal.SIGTERM)
            not_ready = await _until_draining(url)
            assert not_ready.json()["status"] == "stopping"
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                assert (await client.get("/health/live")).status_code == 200
        assert await anyio.to_thread.run_sync(proc.wait, 60.0) in CLEAN_EXIT
    finally:
        proc.stop()
