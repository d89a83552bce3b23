"""SIGTERM drains before it stops (app/drain.py): the service turns not-ready while it
keeps serving for LLOG_DRAIN_S, answers parked long-polls at once, ignores repeated
SIGTERMs, then exits cleanly. The broker (one or several workers) and the standalone
compactor behave the same."""

from __future__ import annotations

import signal
from pathlib import Path

import anyio
import httpx
import pytest

from app.localstack.broker import wait_healthy
from app.localstack.processes import ManagedProcess, free_port
from app.localstack.stack import LocalStack
from tests.helpers.bodies import consume_body
from tests.helpers.long_polls import NEVER_MS, until_parked
from tests.helpers.stack import BrokerFactory, compactor_process

# A drain that outlasts every check made during it (the tests end it with SIGINT, which
# stops a service at once), and one that ends by itself before the service stops.
LONG_DRAIN_S = "600"
SHORT_DRAIN_S = "1"
# After its graceful shutdown uvicorn raises the signal it caught again, so a single
# server process ends "by SIGTERM" (or "by SIGINT"); the supervisor of several workers
# exits with 0.
CLEAN_EXIT = (0, -signal.SIGTERM)
STOPPED_EXIT = (0, -signal.SIGTERM, -signal.SIGINT)


async def _until_draining(url: str) -> httpx.Response:
    """Polled: another process's state (the caller's bound ends a wait for a service
    that never turns not-ready)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while True:
            r = await client.get("/health/ready")
            if r.status_code == 503:
                return r
            await anyio.sleep(0.05)


@pytest.mark.parametrize("workers", [1, 2])
async def test_sigterm_drains_a_broker_then_stops_it(brokers: BrokerFactory, topic: str,
                                                     workers: int) -> None:
    broker = brokers.start(workers=workers, drain_s=LONG_DRAIN_S,
                           max_wait_ms_ceiling=str(NEVER_MS))
    parked: dict[str, object] = {}
    signalled = anyio.Event()
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as client:

        async def park() -> None:
            r = await client.post("/consume", json=consume_body(topic, 1,
                                                                 max_wait_ms=NEVER_MS))
            parked.update(status=r.status_code, body=r.json(),
                          after_signal=signalled.is_set())

        # The parked long-poll's own deadline, and the drain, are far beyond this bound:
        # it only catches a long-poll the drain did not answer.
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(park)
                # With two workers, either one's answer counts the long-poll of both.
                await until_parked(client)
                signalled.set()
                broker.process.signal(signal.SIGTERM)
                not_ready = await _until_draining(broker.url)
            assert not_ready.json()["status"] == "stopping"
            # The parked long-poll was answered by the drain: empty, not cut.
            assert parked["status"] == 200 and parked["after_signal"] is True
            assert parked["body"]["results"][0]["records"] == []  # type: ignore[index]

            # Still serving, on fresh connections, and telling clients to go elsewhere.
            async with httpx.AsyncClient(base_url=broker.url, timeout=60) as fresh:
                assert (await fresh.get("/health/live")).status_code == 200
                broker.process.signal(signal.SIGTERM)  # a second one changes nothing
                r = await fresh.post("/produce", json={"topic_partitions": [
                    {"topic": topic, "partition": 0, "records": ["during-drain"]}]})
                assert r.status_code == 200 and r.json()["results"][0]["ok"]
                assert r.headers["connection"] == "close"
                assert (await fresh.get("/health/ready")).status_code == 503
    broker.process.signal(signal.SIGINT)  # ends the drain at once
    code = await anyio.to_thread.run_sync(broker.process.wait, 60.0)
    assert code in STOPPED_EXIT


def _compactor(stack: LocalStack, tmp_path: Path, drain_s: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    proc = compactor_process(stack, tmp_path / "compactor.log", port, LLOG_DRAIN_S=drain_s,
                             LLOG_BROKER_ID="compactor-drain")
    return proc, f"http://127.0.0.1:{port}"


async def test_sigterm_drains_the_compactor_then_stops_it(stack: LocalStack,
                                                          tmp_path: Path) -> None:
    proc, url = _compactor(stack, tmp_path, LONG_DRAIN_S)
    proc.start()
    try:
        wait_healthy(proc, url)
        with anyio.fail_after(60):  # only catches a compactor that never turns not-ready
            proc.signal(signal.SIGTERM)
            not_ready = await _until_draining(url)
            assert not_ready.json()["status"] == "stopping"
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                assert (await client.get("/health/live")).status_code == 200
        proc.signal(signal.SIGINT)  # ends the drain at once
        assert await anyio.to_thread.run_sync(proc.wait, 60.0) in STOPPED_EXIT
    finally:
        proc.stop()


@pytest.mark.parametrize("service", ["broker", "broker-2-workers", "compactor"])
async def test_the_drain_ends_by_itself_then_the_service_stops_cleanly(
        brokers: BrokerFactory, stack: LocalStack, tmp_path: Path, service: str) -> None:
    """After LLOG_DRAIN_S the SIGTERM goes on to the server, which shuts down cleanly."""
    if service == "compactor":
        proc, url = _compactor(stack, tmp_path, SHORT_DRAIN_S)
        proc.start()
    else:
        proc = brokers.start(workers=2 if service.endswith("workers") else 1,
                             drain_s=SHORT_DRAIN_S).process
    try:
        if service == "compactor":
            wait_healthy(proc, url)
        proc.signal(signal.SIGTERM)
        # The bound only catches a drain that never ends (or a shutdown that hangs).
        assert await anyio.to_thread.run_sync(proc.wait, 60.0) in CLEAN_EXIT
    finally:
        proc.stop()
