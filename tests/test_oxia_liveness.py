"""Every Oxia call ends: a paused server fails calls within their deadline, and an
unexpected error in a coalesced write fails its callers instead of stranding them."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import psutil
import pytest

from app.errors import StorageUnavailable
from app.localstack.stack import LocalStack, StackConfig
from app.stores.metrics import StoreMetrics
from app.stores.oxia import store as oxia_store
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from app.stores.oxia.writes import EventLoopWrites
from tests.helpers.selection import starts_servers
from tests.helpers.stack import make_settings


def _wait_stopped(pid: int) -> None:
    """SIGSTOP takes effect asynchronously: wait until every thread is stopped."""
    deadline = time.monotonic() + 60  # only catches a server that never stops
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.01)


@pytest.fixture(scope="module")
@starts_servers(slow=True)
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack of its own: pausing the session's Oxia would stall every other test."""
    with LocalStack(StackConfig.ephemeral(tmp_path_factory.mktemp("paused"))) as running:
        yield running


async def test_calls_to_a_paused_oxia_end_at_their_deadline(own_stack: LocalStack,
                                                            tmp_path: Path) -> None:
    settings = make_settings(own_stack, oxia_request_timeout_s=1.0)
    assert own_stack.oxia is not None
    pid = own_stack.oxia.pid
    async with OxiaStore(settings, StoreMetrics()) as store:
        await store.put("deadline/a", b"1", "pk")  # connected, shard known
        assert await store.get("deadline/a", "pk") is not None  # gets' channel too
        os.kill(pid, signal.SIGSTOP)
        try:
            _wait_stopped(pid)
            for call in (lambda: store.get("deadline/a", "pk"),
                         lambda: store.put("deadline/b", b"2", "pk"),
                         lambda: store.range_scan("deadline/", "deadline/~", "pk")):
                # Each call ends while the server is still paused (it stays paused until
                # all three have), and the bound here only catches a hang.
                with anyio.fail_after(60), pytest.raises(StorageUnavailable) as failed:
                    await call()
                # Ended by the call's own gRPC deadline, not by the store's outer bound
                # (which fires only once a worker thread fails to come back).
                assert not isinstance(failed.value.__cause__, TimeoutError), failed.value
                assert "DEADLINE_EXCEEDED" in str(failed.value), failed.value
        finally:
            os.kill(pid, signal.SIGCONT)
        with anyio.fail_after(30):
            while True:  # the server catches up; the same client works again
                try:
                    record = await store.get("deadline/a", "pk")
                    break
                except StorageUnavailable:
                    await anyio.sleep(0.2)
        assert record is not None and record.value == b"1"


@pytest.mark.parametrize("path", ["package", "loop"])
async def test_an_unexpected_write_error_fails_every_waiter(
        own_stack: LocalStack, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    settings = make_settings(own_stack, oxia_event_loop_writes=path == "loop")
    broken = {"on": True}
    if path == "package":
        real_write = oxia_store._write

        def flaky_write(client: object, batch: list[PutSpec]) -> list[int | Exception]:
            if broken["on"]:
                raise Exception("No shard found for key")  # what the client raises
            return real_write(client, batch)

        monkeypatch.setattr(oxia_store, "_write", flaky_write)
    else:
        real_loop_write = EventLoopWrites.write

        async def flaky_loop_write(self: EventLoopWrites, puts: list[PutSpec]
                                   ) -> list[int | Exception]:
            if broken["on"]:
                raise RuntimeError("a bug of the loop's writer")
            return await real_loop_write(self, puts)

        monkeypatch.setattr(EventLoopWrites, "write", flaky_loop_write)
    async with OxiaStore(settings, StoreMetrics()) as store:
        outcomes: list[object] = []

        async def put(i: int) -> None:
            try:
                outcomes.append(await store.put(f"coalesce/{i}", b"x", "pk",
                                                expected_version=EXPECT_NOT_EXISTS))
            except StorageUnavailable as exc:
                outcomes.append(exc)

        with anyio.fail_after(60):  # only catches a stranded waiter
            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(put, i)
        assert len(outcomes) == 16
        assert all(isinstance(o, StorageUnavailable) for o in outcomes)
        broken["on"] = False
        with anyio.fail_after(60):
            version = await store.put("coalesce/after", b"y", "pk")
        assert version >= 0
