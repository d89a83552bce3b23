"""Forward fences on the real Oxia: one claim of a frame wins, whichever side makes it
first; a claim whose answer was lost is settled by reading the key back; claims past the
take window write nothing; a sweep deletes old fences only."""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from app.cluster.fences import (
    SWEEP_AFTER_MS,
    TAKE_WINDOW_MS,
    Fence,
    FenceMetrics,
    ForwardFences,
)
from app.errors import StorageUnavailable
from app.storage.keys import FENCES_PARTITION_KEY, KeyLayout
from app.storage.oxia_store import OxiaStore
from tests.helpers.stack import Engine


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _token() -> str:
    return f"m.w0.{uuid.uuid4().hex}.1"


def _layout(engine: Engine) -> KeyLayout:
    # A root of the test's own, so that its sweeps touch no other test's fences.
    return KeyLayout(f"{engine.layout.root}-{uuid.uuid4().hex[:8]}", engine.layout.bucket)


def _fences(engine: Engine, layout: KeyLayout, store: Any = None, **kw: Any
            ) -> tuple[ForwardFences, CollectorRegistry]:
    registry = CollectorRegistry()
    return ForwardFences(store or engine.oxia, layout, FenceMetrics(registry), **kw), registry


async def _holder(engine: Engine, layout: KeyLayout, fence: Fence) -> bytes | None:
    record = await engine.oxia.get(layout.forward_fence(fence.minute, fence.token),
                                   FENCES_PARTITION_KEY)
    return None if record is None else bytes(record.value)


async def test_the_receiver_that_takes_first_wins_and_the_forwarder_cannot_abandon(
        engine: Engine) -> None:
    layout = _layout(engine)
    fences, _ = _fences(engine, layout)
    fence = fences.stamp(_token())
    assert await fences.take(fence)
    assert not await fences.abandon(fence)
    assert await fences.take(fence)  # the receiver's own claim, read back, still holds
    assert await _holder(engine, layout, fence) == b"taken"


async def test_the_forwarder_that_abandons_first_wins_and_the_receiver_cannot_take(
        engine: Engine) -> None:
    layout = _layout(engine)
    fences, registry = _fences(engine, layout)
    fence = fences.stamp(_token())
    assert await fences.abandon(fence)
    assert not await fences.take(fence)
    assert await _holder(engine, layout, fence) == b"abandoned"
    assert registry.get_sample_value("llog_forward_fences_total", {
        "member": "", "side": "receiver", "outcome": "abandoned"}) == 1


async def test_racing_claims_of_one_frame_have_exactly_one_winner(engine: Engine) -> None:
    layout = _layout(engine)
    fences, _ = _fences(engine, layout)
    for _ in range(20):
        fence = fences.stamp(_token())
        won: dict[str, bool] = {}

        async def claim(side: str, fence: Fence = fence, won: dict[str, bool] = won
                        ) -> None:
            won[side] = await (fences.take if side == "take" else fences.abandon)(fence)

        async with anyio.create_task_group() as tg:
            tg.start_soon(claim, "take")
            tg.start_soon(claim, "abandon")
        assert won["take"] != won["abandon"], won


class _LostAnswers:
    """The real Oxia store, whose first ``lose`` puts are applied but answered as if
    the connection had dropped (what a client sees when Oxia's answer is lost)."""

    def __init__(self, store: OxiaStore, lose: int) -> None:
        self._store = store
        self.lose = lose

    async def put(self, *args: Any, **kw: Any) -> int:
        version = await self._store.put(*args, **kw)
        if self.lose > 0:
            self.lose -= 1
            raise StorageUnavailable("Oxia put failed: the answer was lost")
        return version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_claim_whose_answer_was_lost_is_settled_by_reading_the_key_back(
        engine: Engine) -> None:
    layout = _layout(engine)
    lossy = _LostAnswers(engine.oxia, lose=1)
    fences, _ = _fences(engine, layout, lossy)
    other, _ = _fences(engine, layout)
    fence = fences.stamp(_token())
    assert await fences.abandon(fence)  # its put landed: the key says it won
    assert not await other.take(fence)
    lossy.lose = 1
    second = fences.stamp(_token())
    assert await fences.take(second)
    assert not await other.abandon(second)


async def test_no_side_claims_a_frame_past_the_take_window(engine: Engine) -> None:
    layout = _layout(engine)
    fences, registry = _fences(engine, layout)
    old = Fence(_now_ms() - TAKE_WINDOW_MS - 1, _token())
    assert not await fences.take(old)
    assert not await fences.abandon(old)
    assert await _holder(engine, layout, old) is None  # nothing was written
    for side in ("receiver", "forwarder"):
        assert registry.get_sample_value("llog_forward_fences_total", {
            "member": "", "side": side, "outcome": "late"}) == 1


async def test_a_sweep_deletes_the_fences_older_than_its_horizon_only(
        engine: Engine) -> None:
    layout = _layout(engine)
    now = _now_ms()
    claimed = {}
    for age_min in (75, 61, 50, 0):  # each claimed when it was sent, by a clock then
        sent_at = now - age_min * 60_000
        at_the_time, _ = _fences(engine, layout, clock_ms=lambda t=sent_at: t)
        fence = Fence(sent_at, _token())
        assert await at_the_time.take(fence)
        claimed[age_min] = fence
    sweeper, _ = _fences(engine, layout, clock_ms=lambda: now)
    await sweeper.sweep()
    kept = {age for age, fence in claimed.items()
            if await _holder(engine, layout, fence) is not None}
    assert SWEEP_AFTER_MS == 60 * 60_000
    assert kept == {50, 0}


async def test_a_fence_holding_a_value_no_broker_writes_is_lost_on_both_sides(
        engine: Engine) -> None:
    layout = _layout(engine)
    fences, registry = _fences(engine, layout)
    fence = fences.stamp(_token())
    await engine.oxia.put(layout.forward_fence(fence.minute, fence.token), b"committed",
                          FENCES_PARTITION_KEY)
    assert not await fences.take(fence)
    assert not await fences.abandon(fence)
    for side in ("receiver", "forwarder"):
        assert registry.get_sample_value("llog_forward_fences_total", {
            "member": "", "side": side, "outcome": "error"}) == 1
