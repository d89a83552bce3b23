"""Oxia puts started together share one request (group commit), on the real Oxia: the
partitions of one produce flush commit in one Write, and each keeps its own outcome; and
a put is never sent past its ``send_by``, however long it waited to go out, by either
write path."""

from __future__ import annotations

import time
import uuid

import anyio

from app.errors import VersionMismatch
from app.localstack.stack import LocalStack
from app.stores.metrics import StoreMetrics
from app.stores.oxia import store as oxia_store
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec, SendExpired
from tests.helpers.stack import make_settings


def _writes(metrics: StoreMetrics) -> float:
    value = metrics.registry.get_sample_value(
        "llog_oxia_requests_total", {"op": "write_batch", "outcome": "ok"})
    return value or 0.0


async def test_puts_started_together_share_one_request(stack: LocalStack) -> None:
    metrics = StoreMetrics()
    prefix = f"/group-commit/{uuid.uuid4().hex}"
    async with OxiaStore(make_settings(stack), metrics) as store:
        taken = f"{prefix}/taken"
        await store.put_group([PutSpec(taken, b"first", taken, EXPECT_NOT_EXISTS)])
        before = _writes(metrics)
        outcomes: dict[int, list[int | Exception]] = {}

        async def put(i: int) -> None:
            key = taken if i == 0 else f"{prefix}/{i}"
            outcomes[i] = await store.put_group([PutSpec(key, b"v", key, EXPECT_NOT_EXISTS)])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(put, i)
        assert _writes(metrics) - before == 1, "the four puts took several requests"
        assert isinstance(outcomes[0][0], VersionMismatch)  # its own outcome, not shared
        assert all(isinstance(outcomes[i][0], int) for i in (1, 2, 3))


async def test_a_group_whose_send_by_passed_while_it_waited_is_not_sent(
        stack: LocalStack) -> None:
    """The coalescer's one request in flight is held while two groups queue behind it:
    one whose ``send_by`` was already reached when it was queued (so is past it when
    its turn comes), one with time left. The first is answered SendExpired, whole, and
    nothing of it is written; the other is sent as always."""
    metrics = StoreMetrics()
    prefix = f"/send-by/{uuid.uuid4().hex}"
    keys = {name: f"{prefix}/{name}" for name in ("ahead", "late-1", "late-2", "timely")}
    settings = make_settings(stack, oxia_max_inflight_writes=1)
    async with OxiaStore(settings, metrics) as store:
        real, entered, gate = store._write_batch, anyio.Event(), anyio.Event()

        async def held(puts: list[PutSpec]) -> list[int | Exception]:
            entered.set()
            await gate.wait()
            return await real(puts)

        outcomes: dict[str, list[int | Exception]] = {}

        async def put(name: str, names: list[str], send_by: float | None) -> None:
            outcomes[name] = await store.put_group([
                PutSpec(keys[n], b"v", keys[n], EXPECT_NOT_EXISTS, send_by=send_by)
                for n in names])

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                store._write_batch = held  # type: ignore[method-assign]
                tg.start_soon(put, "ahead", ["ahead"], None)
                await entered.wait()  # the only request in flight, held
                store._write_batch = real  # type: ignore[method-assign]
                tg.start_soon(put, "late", ["late-1", "late-2"], time.monotonic())
                tg.start_soon(put, "timely", ["timely"], time.monotonic() + 3600)
                await anyio.wait_all_tasks_blocked()
                gate.set()
        assert isinstance(outcomes["ahead"][0], int)
        assert [type(o) for o in outcomes["late"]] == [SendExpired, SendExpired]
        assert isinstance(outcomes["timely"][0], int)
        found = {n: await store.get(k, k) for n, k in keys.items()}
    assert {n for n, record in found.items() if record is not None} == {"ahead", "timely"}
    assert metrics.registry.get_sample_value(
        "llog_oxia_puts_total", {"op": "cas", "outcome": "expired"}) == 2


async def test_both_write_paths_leave_out_a_put_past_its_send_by(stack: LocalStack) -> None:
    """Where each request goes out, on the event loop and through the package in a
    worker thread: a put past its ``send_by`` is left out (SendExpired), unwritten, and
    the puts beside it are sent."""
    prefix = f"/send-by/{uuid.uuid4().hex}"
    async with OxiaStore(make_settings(stack), StoreMetrics()) as store:
        assert store._writes is not None
        for path in ("loop", "thread"):
            late, timely = f"{prefix}/{path}-late", f"{prefix}/{path}-timely"
            puts = [PutSpec(late, b"v", late, EXPECT_NOT_EXISTS, send_by=time.monotonic()),
                    PutSpec(timely, b"v", timely, EXPECT_NOT_EXISTS)]
            if path == "loop":
                outcomes = await store._writes.write(puts)
            else:
                outcomes = await anyio.to_thread.run_sync(oxia_store._write, store.client,
                                                          puts)
            assert isinstance(outcomes[0], SendExpired), (path, outcomes)
            assert isinstance(outcomes[1], int), (path, outcomes)
            assert await store.get(late, late) is None
            assert await store.get(timely, timely) is not None
