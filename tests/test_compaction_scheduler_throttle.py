"""The scheduler under the compaction throttle (LLOG_COMPACTION_MAX_BYTES_PER_S), on the
real Oxia and MinIO: a visit in debt lets go of its partition, waiting happens before a
claim and obeys stop(), and a throttled compactor still compacts everything."""

from __future__ import annotations

import uuid

import anyio
import anyio.lowlevel
from prometheus_client import CollectorRegistry

from app.compaction.metrics import CompactionMetrics
from app.compaction.scheduler import CompactionScheduler
from app.compaction.throttle import BURST_S, Throttle
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from tests.helpers.compaction import (
    Expected,
    append_batches,
    assert_compacted,
    index_entries,
    make_compactor,
)
from tests.helpers.stack import Engine, open_engine
from tests.test_compaction_scheduler import AllCaughtUp, isolated_settings

KIB = 1024
RATE = 64 * KIB  # the lowest rate the setting admits


class FrozenTime:
    """A clock that stands still unless a sleeper moves it; ``block``: sleeps never end
    by themselves. ``during_sleep`` runs at each sleep (to look at the store then)."""

    def __init__(self, *, block: bool = False) -> None:
        self.now = 0.0
        self.block = block
        self.sleeping = anyio.Event()
        self.seen_during_sleep: list[object] = []
        self.during_sleep: object = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if callable(self.during_sleep):
            self.seen_during_sleep.append(await self.during_sleep())
        self.sleeping.set()
        if self.block:
            await anyio.sleep_forever()
        self.now += seconds
        await anyio.lowlevel.checkpoint()


def _balance_spent(time: FrozenTime) -> Throttle:
    """A throttle whose burst is spent exactly: the next run's bytes put it in debt."""
    throttle = Throttle(RATE, clock=time.clock, sleep=time.sleep)
    throttle.pay(int(RATE * BURST_S))
    assert not throttle.in_debt
    return throttle


async def _append_big(e: Engine, tp: TopicPartition, appends: int, size: int) -> None:
    for n in range(appends):
        (result,) = await e.writer.append_shared([AppendGroup(tp, [bytes([65 + n]) * size])])
        assert isinstance(result, AppendResult), result


async def _claim_of(e: Engine, tp: TopicPartition) -> object:
    return await e.oxia.get(e.layout.compactor_claim(tp), tp.partition_key)


async def test_a_visit_in_debt_lets_go_of_its_partition(stack: LocalStack) -> None:
    settings = isolated_settings(stack)
    tp = TopicPartition(f"thr-{uuid.uuid4().hex[:8]}", 0)
    registry = CollectorRegistry()
    metrics = CompactionMetrics(registry)
    async with open_engine(settings) as e:
        await append_batches(e.writer, tp, 4, 2)  # two runs of two entries each
        throttle = _balance_spent(FrozenTime())
        scheduler = CompactionScheduler(make_compactor(e, max_entries=2), e.oxia, e.layout,
                                        settings, compactor_id="thr", metrics=metrics,
                                        throttle=throttle)
        visit = await scheduler.visit(tp)
        assert visit.error is None and visit.throttled
        # One run, then the claim went instead of the second run.
        assert [o.action for o in visit.outcomes] == ["compacted"]
        assert await _claim_of(e, tp) is None
        await assert_compacted(e, tp, Expected([(1, 4)], wal_after=2))
        paid = visit.outcomes[0].wal_bytes
    assert paid > 0 and throttle.statistics().bytes_paid == int(RATE * BURST_S) + paid
    assert registry.get_sample_value("llog_compaction_throttle_paid_bytes_total") == paid
    assert registry.get_sample_value("llog_compaction_throttle_visits_ended_total") == 1


async def test_the_pass_waits_out_the_debt_before_it_claims(stack: LocalStack) -> None:
    settings = isolated_settings(stack)
    tp = TopicPartition(f"thr-{uuid.uuid4().hex[:8]}", 0)
    registry = CollectorRegistry()
    async with open_engine(settings) as e:
        await append_batches(e.writer, tp, 2, 2)
        time = FrozenTime()
        time.during_sleep = lambda: _claim_of(e, tp)
        throttle = _balance_spent(time)
        throttle.pay(RATE)  # one second in debt
        scheduler = CompactionScheduler(make_compactor(e), e.oxia, e.layout, settings,
                                        compactor_id="thr", metrics=CompactionMetrics(registry),
                                        throttle=throttle)
        scheduler.add([tp])
        visits = await scheduler.run_pass()
        assert time.seen_during_sleep == [None]  # it waited, and held no claim meanwhile
        assert [o.action for v in visits for o in v.outcomes][:1] == ["compacted"]
        await assert_compacted(e, tp, Expected([(1, 4)]))
    assert registry.get_sample_value("llog_compaction_throttle_wait_seconds_total") == 1.0


async def test_stop_ends_a_wait_for_the_throttle_without_a_visit(stack: LocalStack) -> None:
    settings = isolated_settings(stack)
    tp = TopicPartition(f"thr-{uuid.uuid4().hex[:8]}", 0)
    async with open_engine(settings) as e:
        await append_batches(e.writer, tp, 2, 2)
        time = FrozenTime(block=True)
        throttle = _balance_spent(time)
        throttle.pay(RATE)
        scheduler = CompactionScheduler(make_compactor(e), e.oxia, e.layout, settings,
                                        compactor_id="thr", throttle=throttle)
        scheduler.add([tp])
        passes: list[int] = []

        async def one_pass() -> None:
            passes.append(len(await scheduler.run_pass()))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(one_pass)
                await time.sleeping.wait()
                scheduler.stop()
        assert passes == [0]  # no visit started after the stop
        assert await _claim_of(e, tp) is None
        entries = await index_entries(e, tp)  # the newest append may still be pending
        assert entries and all(entry.type == "WAL" for _, entry in entries)


async def test_a_throttled_compactor_still_compacts_everything(stack: LocalStack) -> None:
    """At the lowest rate, with runs larger than the burst: visits are cut short and
    wait for the budget on the real clock, and every partition is compacted in the end."""
    settings = isolated_settings(stack, compaction_max_bytes_per_s=RATE)
    topic = f"thr-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(2)]
    registry = CollectorRegistry()
    metrics = CompactionMetrics(registry)
    async with open_engine(settings) as e:
        for tp in tps:
            await _append_big(e, tp, 4, 40 * KIB)  # runs of two: 80 KiB each, over the burst
        caught_up = AllCaughtUp(set(tps))
        scheduler = CompactionScheduler(make_compactor(e, max_entries=2), e.oxia, e.layout,
                                        settings, compactor_id="thr", metrics=metrics,
                                        on_visit=caught_up)
        assert scheduler.throttle.statistics().max_bytes_per_s == RATE
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                await tg.start(scheduler.run)
                await caught_up.event.wait()
                scheduler.stop()
        for tp in tps:
            await assert_compacted(e, tp, Expected([(1, 2), (3, 4)]))
        assert any(v.throttled for v in caught_up.visits)
        assert all(v.error is None for v in caught_up.visits)
    paid = registry.get_sample_value("llog_compaction_throttle_paid_bytes_total")
    assert paid is not None and paid >= 4 * 80 * KIB
    assert registry.get_sample_value("llog_compaction_throttle_visits_ended_total")
