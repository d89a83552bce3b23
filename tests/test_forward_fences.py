"""Forward fences on the real Oxia: one claim of a frame wins, whichever side makes it
first; a claim whose answer was lost is settled by reading the key back; claims past the
take window write nothing; a sweep deletes old fences only."""

from __future__ import annotations

import time
import uuid
from typing import Any

import anyio
from prometheus_client import CollectorRegistry

from app.cli import GRACEFUL_SHUTDOWN_S
from app.cluster.fences import (
    ANSWER_MARGIN_S,
    SWEEP_AFTER_MS,
    TAKE_WINDOW_MS,
    Fence,
    FenceMetrics,
    ForwardFences,
    claim_budget_for,
)
from app.errors import StorageUnavailable
from app.settings_groups import ClusterSettings, OxiaSettings
from app.storage.keys import FENCES_PARTITION_KEY, KeyLayout
from app.stores.oxia.store import OxiaStore
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


def test_an_answer_in_doubt_comes_before_a_shutdown_or_the_client_gives_up() -> None:
    """With the default settings, the longest a forwarder takes to answer in doubt a
    frame its peer took: its wait for an answer, its claim on the fence, then the
    frame's commit window (that wait again) and the margin. A server that shuts down
    lets requests in flight finish for GRACEFUL_SHUTDOWN_S, before the broker's own
    shutdown (which answers none), and the Python client waits as long by default
    (clients/python): cut short, the client would see no answer and might send the
    records again while the peer may still read a version to commit them with."""
    oxia, cluster = OxiaSettings(), ClusterSettings()
    wait_s = (cluster.forward_deadline_ms + cluster.forward_answer_timeout_ms) / 1000
    longest = (wait_s + claim_budget_for(oxia.oxia_request_timeout_s) + wait_s
               + ANSWER_MARGIN_S)
    assert longest < GRACEFUL_SHUTDOWN_S


async def test_the_receiver_that_takes_first_wins_and_the_forwarder_cannot_abandon(
        engine: Engine) -> None:
    layout = _layout(engine)
    fences, _ = _fences(engine, layout)
    fence = fences.stamp(_token())
    assert await fences.take(fence)
    assert await fences.abandon(fence) == "taken"
    assert await fences.take(fence)  # the receiver's own claim, read back, still holds
    assert await _holder(engine, layout, fence) == b"taken"


async def test_the_forwarder_that_abandons_first_wins_and_the_receiver_cannot_take(
        engine: Engine) -> None:
    layout = _layout(engine)
    fences, registry = _fences(engine, layout)
    fence = fences.stamp(_token())
    assert await fences.abandon(fence) == "abandoned"
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
    assert await fences.abandon(fence) == "abandoned"  # its put landed: the key says so
    assert not await other.take(fence)
    lossy.lose = 1
    second = fences.stamp(_token())
    assert await fences.take(second)
    assert await other.abandon(second) == "taken"


async def test_no_side_claims_a_frame_past_the_take_window(engine: Engine) -> None:
    layout = _layout(engine)
    fences, registry = _fences(engine, layout)
    old = Fence(_now_ms() - TAKE_WINDOW_MS - 1, _token())
    assert not await fences.take(old)
    assert await fences.abandon(old) == "late"  # who holds it, if anyone, is unknown
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
    assert await fences.abandon(fence) == "error"  # not "taken": no bound on the receiver
    for side in ("receiver", "forwarder"):
        assert registry.get_sample_value("llog_forward_fences_total", {
            "member": "", "side": side, "outcome": "error"}) == 1
