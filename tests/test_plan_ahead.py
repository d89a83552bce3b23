"""Lookups made ahead of a catch-up consumer's next read (app/storage/plan_ahead.py):
taken only by a read of that very offset, only while recent, never at the tail; bounded,
and a failed one is dropped. On the real store, a catch-up's next read makes no Oxia
read of its own, and still reads every record once."""

from __future__ import annotations

import anyio
import pytest

from app.errors import StorageUnavailable
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.metadata import Control
from app.storage.plan_ahead import MAX_AGE_S, Lookup, PlanAhead, Taken
from app.storage.reader import LogReader
from tests.helpers.stack import make_settings, open_engine

TP = TopicPartition("t", 0)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _found(high_watermark: int) -> Lookup:
    return Control(sequence_counter=high_watermark), []


async def _returning(result: Lookup) -> Lookup:
    return result


async def _failing() -> Lookup:
    raise StorageUnavailable("Oxia is away")


async def test_a_lookup_is_taken_once_by_a_read_of_its_offset() -> None:
    plans = PlanAhead(4)
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        assert plans.start(TP, 11, lambda: _returning(_found(50)))
        assert not plans.start(TP, 11, lambda: _returning(_found(50)))  # already kept
        assert await plans.take(TP, 12) is None
        assert await plans.take(TopicPartition("u", 0), 11) is None
        taken = await plans.take(TP, 11)
        assert taken is not None and taken.result[0] is not None
        assert taken.result[0].sequence_counter == 50
        assert await plans.take(TP, 11) is None  # once
    stats = plans.statistics()
    assert (stats.started, stats.taken, stats.failed, stats.kept) == (1, 1, 0, 0)


async def test_a_read_waits_for_a_lookup_under_way() -> None:
    release = anyio.Event()

    async def slow() -> Lookup:
        await release.wait()
        return _found(50)

    plans = PlanAhead(4)
    got: list[Taken | None] = []
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        plans.start(TP, 11, slow)

        async def read() -> None:
            got.append(await plans.take(TP, 11))

        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        assert got == []
        release.set()
    assert len(got) == 1 and got[0] is not None


@pytest.mark.parametrize("high_watermark", [10, 0])
async def test_a_lookup_at_the_tail_is_never_taken(high_watermark: int) -> None:
    plans = PlanAhead(4)
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        plans.start(TP, 11, lambda: _returning(_found(high_watermark)))
        assert await plans.take(TP, 11) is None  # the read must see newer commits
        plans.start(TP, 11, lambda: _returning((None, None)))  # no log yet
        assert await plans.take(TP, 11) is None


async def test_an_old_lookup_is_not_taken() -> None:
    clock = _Clock()
    plans = PlanAhead(4, clock=clock)
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        plans.start(TP, 11, lambda: _returning(_found(50)))
        plans.start(TP, 21, lambda: _returning(_found(50)))
        clock.now += MAX_AGE_S / 2
        assert await plans.take(TP, 11) is not None
        clock.now += MAX_AGE_S
        assert await plans.take(TP, 21) is None


async def test_a_failed_lookup_is_counted_and_dropped() -> None:
    plans = PlanAhead(4)
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        plans.start(TP, 11, _failing)
        assert await plans.take(TP, 11) is None
    assert plans.statistics().failed == 1


async def test_lookups_kept_are_bounded_the_oldest_dropped() -> None:
    plans = PlanAhead(2)
    async with anyio.create_task_group() as tg:
        plans.run_in(tg)
        for offset in (11, 21, 31):
            plans.start(TP, offset, lambda: _returning(_found(50)))
        assert plans.statistics().kept == 2
        assert await plans.take(TP, 11) is None
        assert await plans.take(TP, 21) is not None
        assert await plans.take(TP, 31) is not None


def test_without_a_task_group_or_a_budget_nothing_is_looked_up() -> None:
    assert not PlanAhead(4).start(TP, 11, lambda: _returning(_found(50)))
    assert not PlanAhead(0).start(TP, 11, lambda: _returning(_found(50)))


# -- on the real store ---------------------------------------------------------------


def _oxia_gets(registry: object) -> float:
    value = registry.get_sample_value(  # type: ignore[attr-defined]
        "llog_oxia_requests_total", {"op": "get", "outcome": "ok"})
    return value or 0.0


async def test_a_catch_up_reads_on_without_waiting_for_oxia(stack: LocalStack,
                                                            topic: str) -> None:
    tp = TopicPartition(topic, 0)
    async with open_engine(make_settings(stack)) as e:
        written: dict[int, bytes] = {}
        for batch in range(12):
            values = [f"{batch}-{i}".encode() * 20 for i in range(10)]
            (result,) = await e.writer.append_shared([AppendGroup(tp, values)])
            assert isinstance(result, AppendResult)
            written.update(zip(range(result.start_offset, result.end_offset + 1), values,
                               strict=True))
        reader = LogReader(e.oxia, e.s3, e.layout, read_ahead=4)
        read: dict[int, bytes] = {}
        looked_up_by_reads = 0.0
        async with anyio.create_task_group() as tg:
            reader.run_ahead_in(tg)
            offset = 1
            while offset <= max(written):
                pending = reader.plans._kept.get((tp, offset))
                if pending is not None:  # made ahead: let it land, then read
                    await pending.done.wait()
                before = _oxia_gets(e.metrics.registry)
                page = await reader.read(tp, offset, max_bytes=600)
                if offset > 1:
                    looked_up_by_reads += _oxia_gets(e.metrics.registry) - before
                read.update((o, bytes(v)) for o, v in page.records)
                offset = page.next_offset
            tg.cancel_scope.cancel()
        stats = reader.plans.statistics()
    assert read == written
    assert stats.started == stats.taken > 8 and stats.failed == 0
    # Every read after the first took the control record read ahead (its own get
    # counted before it began).
    assert looked_up_by_reads == 0


async def test_a_reads_own_lookup_is_kept_for_the_next_read_of_its_offset() -> None:
    now = [100.0]
    plans = PlanAhead(4, clock=lambda: now[0])
    async with anyio.create_task_group() as tg:
        assert not plans.keep(TP, 11, _found(50), 99.5)  # no task group: never kept
        plans.run_in(tg)
        assert plans.keep(TP, 11, _found(50), 99.5)
        assert not plans.keep(TP, 11, _found(50), 99.9)  # one per offset
        taken = await plans.take(TP, 11)
        assert taken is not None and taken.started == 99.5  # its age is the lookup's
        assert plans.keep(TP, 11, _found(50), 99.5)
        now[0] = 99.5 + MAX_AGE_S + 0.1
        assert await plans.take(TP, 11) is None  # too old, whoever kept it
        assert plans.keep(TP, 11, _found(10), now[0])
        assert await plans.take(TP, 11) is None  # no records at 11: never for the tail
    assert plans.statistics().reused == 3
