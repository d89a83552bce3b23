"""The compaction throttle alone (app/compaction/throttle.py): pay after, wait before,
on a clock the test moves by hand."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.lowlevel
import pytest

from app.compaction.throttle import BURST_S, Throttle

MIB = 1024 * 1024


class FakeTime:
    """A clock that only moves when a sleeper sleeps (each sleep is recorded), or, with
    ``block``, sleeps that never end by themselves (for stop and cancel)."""

    def __init__(self, *, block: bool = False) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.block = block
        self.sleeping = anyio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.sleeping.set()
        if self.block:
            await anyio.sleep_forever()
        self.now += seconds
        await anyio.lowlevel.checkpoint()


def _throttle(rate: int | None, time: FakeTime) -> Throttle:
    return Throttle(rate, clock=time.clock, sleep=time.sleep)


async def test_unlimited_never_waits_but_counts() -> None:
    time = FakeTime()
    throttle = _throttle(None, time)
    throttle.pay(100 * MIB)
    assert not throttle.limited and not throttle.in_debt
    assert await throttle.wait()
    stats = throttle.statistics()
    assert (stats.max_bytes_per_s, stats.bytes_paid, stats.seconds_waited) == (
        None, 100 * MIB, 0.0)
    assert time.sleeps == []


async def test_a_run_within_the_burst_does_not_wait() -> None:
    time = FakeTime()
    throttle = _throttle(MIB, time)
    throttle.pay(int(MIB * BURST_S) // 2)
    assert not throttle.in_debt
    assert await throttle.wait()
    assert time.sleeps == []


async def test_debt_is_paid_off_at_the_rate() -> None:
    time = FakeTime()
    throttle = _throttle(MIB, time)
    throttle.pay(int(MIB * BURST_S) + MIB // 2)  # half a second beyond the burst
    assert throttle.in_debt
    assert throttle.seconds_owed() == pytest.approx(0.5)
    assert throttle.statistics().balance_bytes == pytest.approx(-MIB / 2)
    assert await throttle.wait()
    assert not throttle.in_debt
    assert time.sleeps == [pytest.approx(0.5)]
    stats = throttle.statistics()
    assert stats.seconds_waited == pytest.approx(0.5) and stats.tasks_waiting == 0
    assert stats.bytes_paid == int(MIB * BURST_S) + MIB // 2


async def test_a_run_larger_than_any_budget_goes_through_and_leaves_a_longer_debt() -> None:
    time = FakeTime()
    throttle = _throttle(MIB, time)
    throttle.pay(64 * MIB)  # paid after: the run itself was never held back
    assert throttle.seconds_owed() == pytest.approx(64 - BURST_S)
    assert await throttle.wait()
    assert time.now == pytest.approx(64 - BURST_S)


async def test_idle_time_banks_at_most_the_burst() -> None:
    time = FakeTime()
    throttle = _throttle(MIB, time)
    throttle.pay(2 * MIB)
    time.now += 3600
    assert throttle.statistics().balance_bytes == pytest.approx(MIB * BURST_S)
    throttle.pay(int(MIB * BURST_S) + MIB)
    assert throttle.seconds_owed() == pytest.approx(1.0)


async def test_a_waiter_waits_for_what_others_pay_meanwhile() -> None:
    time = FakeTime()
    throttles: list[Throttle] = []

    async def sleep_while_another_visit_pays(seconds: float) -> None:
        if not time.sleeps:
            throttles[0].pay(MIB)  # a concurrent visit's run finishes during the first sleep
        await time.sleep(seconds)

    throttle = Throttle(MIB, clock=time.clock, sleep=sleep_while_another_visit_pays)
    throttles.append(throttle)
    throttle.pay(int(MIB * BURST_S) + MIB)
    assert await throttle.wait()
    assert time.sleeps == [pytest.approx(1.0), pytest.approx(1.0)]
    assert not throttle.in_debt


async def _a_waiter_ended_by(end: Callable[[Throttle, anyio.CancelScope], None]
                             ) -> tuple[Throttle, FakeTime, list[bool]]:
    """A waiter in debt on a sleep that never ends by itself, ended by ``end`` once it
    sleeps; the throttle, the time, and what ``wait`` returned (nothing if cancelled)."""
    time = FakeTime(block=True)
    throttle = _throttle(MIB, time)
    throttle.pay(10 * MIB)
    results: list[bool] = []

    async def waiter() -> None:
        results.append(await throttle.wait())

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await time.sleeping.wait()
            assert throttle.statistics().tasks_waiting == 1
            end(throttle, tg.cancel_scope)
    assert throttle.statistics().tasks_waiting == 0
    return throttle, time, results


async def test_close_wakes_a_waiter_and_refuses_later_waits() -> None:
    throttle, time, results = await _a_waiter_ended_by(lambda t, _: t.close())
    assert results == [False]
    assert not await throttle.wait()  # closed: returns at once
    assert len(time.sleeps) == 1


async def test_cancelling_a_waiter_propagates_and_leaves_no_waiter() -> None:
    throttle, _, results = await _a_waiter_ended_by(lambda _, scope: scope.cancel())
    assert results == []  # cancelled, not returned
    assert throttle.in_debt  # nothing was paid off by cancelling


def test_the_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Throttle(0)
