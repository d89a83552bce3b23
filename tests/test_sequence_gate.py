"""The batcher's sequence gate (app/batching/sequence_gate.py): a producer's request read
before the one holding the group ahead of its own waits for that one to be taken,
briefly and boundedly; frames, lanes and a closing batcher never wait."""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio

from app.batching.batcher import Batcher
from app.batching.sequence_gate import SequenceGate
from app.errors import ShuttingDown
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult, ProducerSeq
from app.storage.keys import TopicPartition

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def _g(n: int, pid: str = "p", tp: TopicPartition = TP,
       commit_by: float | None = None) -> AppendGroup:
    return AppendGroup(tp, [b"v"], producer=ProducerSeq(pid, n), commit_by=commit_by)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_group_read_before_the_one_ahead_of_it_waits_until_that_one_is_taken(
        ) -> None:
    held: list[bool] = []
    gate = SequenceGate(hold_s=30.0, held=held.append)
    gate.took([_g(0)])
    order: list[int] = []

    async def later() -> None:
        await gate.wait([_g(2)])
        gate.took([_g(2)])
        order.append(2)

    async with anyio.create_task_group() as tg:
        tg.start_soon(later)
        await anyio.wait_all_tasks_blocked()
        assert order == []  # 1 not taken yet: 2 waits
        gate.took([_g(3, pid="q")])  # another producer's group: not its turn
        await anyio.wait_all_tasks_blocked()
        assert order == []
        with anyio.fail_after(5):
            await gate.wait([_g(1)])  # its predecessor (0) is taken: no wait
        gate.took([_g(1)])
        order.append(1)
    assert order == [1, 2]
    assert held == [True]


async def test_a_new_producers_first_groups_wait_for_its_group_0() -> None:
    """Read before the producer's 0, its 1 would be refused as from an unknown
    producer."""
    gate = SequenceGate(hold_s=30.0)
    assert gate.ahead([_g(1, pid="new")]) == [((TP, "new"), 1, False)]
    gate.took([_g(0, pid="new")])
    assert gate.ahead([_g(1, pid="new")]) == []


async def test_groups_in_order_resends_and_far_gaps_never_wait() -> None:
    held: list[bool] = []
    gate = SequenceGate(hold_s=30.0, held=held.append)
    with anyio.fail_after(5):
        gate.took([_g(7)])
        await gate.wait([_g(8)])  # the next one
        gate.took([_g(8)])
        await gate.wait([_g(5)])  # a resend of one taken before
        await gate.wait([_g(0, pid="new")])
        await gate.wait([_g(40, pid="late")])  # past any group a producer keeps in flight
        await gate.wait([_g(9 + 5)])  # 9 .. 13 missing: more than five in flight
        # A request holding a producer's next group and the one after it: only its first
        # group needs the one before.
        await gate.wait([_g(10), _g(9)])
    assert held == []


async def test_a_pair_not_taken_lately_is_not_waited_for() -> None:
    clock = _Clock()
    gate = SequenceGate(hold_s=30.0, recent_s=2.0, clock=clock)
    gate.took([_g(0)])
    assert gate.ahead([_g(2)]) != []
    clock.now += 2.5  # its 1 went another way (a reconnect, a failover)
    assert gate.ahead([_g(2)]) == []


async def test_a_wait_ends_after_the_hold_and_the_producer_is_not_held_again_for_a_while(
        ) -> None:
    held: list[bool] = []
    clock = _Clock()
    gate = SequenceGate(hold_s=0.05, quiet_s=10.0, clock=clock, held=held.append)
    gate.took([_g(0), _g(0, tp=OTHER)])
    started = time.monotonic()
    with anyio.fail_after(5):
        await gate.wait([_g(2)])  # 1 went to another broker: it never comes here
    assert time.monotonic() - started >= 0.04
    assert held == [False]
    gate.took([_g(2)])
    # Its groups go elsewhere too: its next gap passes at once, on every partition...
    assert gate.ahead([_g(4)]) == []
    assert gate.ahead([_g(2, tp=OTHER)]) == []
    # ...another producer's is still held, and this one's again once the quiet is over.
    gate.took([_g(0, pid="q")])
    assert gate.ahead([_g(2, pid="q")]) != []
    clock.now += 10.0
    gate.took([_g(2)])
    assert gate.ahead([_g(4)]) == [((TP, "p"), 4, True)]


async def test_a_wait_never_outlasts_the_requests_deadline_nor_a_closed_gate() -> None:
    gate = SequenceGate(hold_s=30.0)
    gate.took([_g(0)])
    with anyio.fail_after(5):
        await gate.wait([_g(2)], until=time.monotonic() - 1)  # past already
        await gate.wait([_g(2)], until=time.monotonic() + 0.02)
    assert gate.ahead([_g(2)]) != []  # a deadline is not the producer's fault

    async def closing() -> None:
        await anyio.wait_all_tasks_blocked()
        gate.close()

    held: list[bool] = []
    gate._held = held.append
    async with anyio.create_task_group() as tg:
        tg.start_soon(closing)
        with anyio.fail_after(5):
            await gate.wait([_g(2)])
    assert gate.ahead([_g(2)]) == []
    assert held == []  # refused by the batcher, not a hold that ended


async def test_the_gate_remembers_a_bounded_number_of_pairs_and_lets_a_forgotten_one_go(
        ) -> None:
    held: list[bool] = []
    gate = SequenceGate(hold_s=30.0, capacity=2, held=held.append)
    gate.took([_g(0, pid="a")])
    done = anyio.Event()

    async def waiting() -> None:
        await gate.wait([_g(2, pid="a")])
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        gate.took([_g(0, pid="b")])
        gate.took([_g(0, pid="c")])  # "a", the least recently taken, is forgotten
        with anyio.fail_after(5):
            await done.wait()
    assert len(gate) == 2
    assert held == [True]  # nothing left to wait for: not a producer to quiet
    # A forgotten pair is new again: its 2 waits for a 0 (one of its first groups).
    assert gate.ahead([_g(2, pid="a")]) == [((TP, "a"), 2, False)]


async def test_a_cancelled_wait_leaves_the_pair_as_it_was() -> None:
    """A request abandoned while it waits (its caller gone) takes nothing and marks
    nothing: the pair is held as before."""
    gate = SequenceGate(hold_s=30.0)
    gate.took([_g(0)])
    with anyio.move_on_after(0.01):
        await gate.wait([_g(2)])
    assert gate.ahead([_g(2)]) == [((TP, "p"), 2, True)]
    gate.took([_g(1)])
    with anyio.fail_after(5):
        await gate.wait([_g(2)])


class _Log:
    """An append that answers every group at once and keeps them in order."""

    def __init__(self) -> None:
        self.groups: list[AppendGroup] = []

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        start = len(self.groups) + 1
        self.groups += list(groups)
        return [AppendResult(g.tp, start + i, start + i + 1, 1, "", "")
                for i, g in enumerate(groups)]


async def _batcher_run(batcher: Batcher, body: object) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(batcher.run)
        with anyio.fail_after(10):
            await body()  # type: ignore[operator]
        batcher.close()


async def test_a_batcher_holds_a_producers_request_but_never_a_frame_or_a_lanes() -> None:
    for kind in ("frame", "lane"):
        log = _Log()
        batcher = Batcher(log.append, max_bytes=1 << 20, max_delay_s=0.001,
                          buffer_max_bytes=1 << 24, sequence_hold_s=30.0,
                          sequence_gate=kind == "frame")

        async def body(batcher: Batcher = batcher, kind: str = kind) -> None:
            await batcher.submit([_g(0)])
            take_by = time.monotonic() + 20 if kind == "frame" else None
            await batcher.enqueue([_g(2)], take_by=take_by)  # at once, not held

        await _batcher_run(batcher, body)
        assert [g.producer.sequence for g in log.groups if g.producer] == [0, 2]


async def test_a_held_request_is_answered_at_once_when_the_batcher_closes() -> None:
    log = _Log()
    batcher = Batcher(log.append, max_bytes=1 << 20, max_delay_s=0.001,
                      buffer_max_bytes=1 << 24, sequence_hold_s=30.0)
    refused: list[Exception] = []

    async def held() -> None:
        try:
            await batcher.submit([_g(2)])
        except ShuttingDown as exc:
            refused.append(exc)

    async with anyio.create_task_group() as tg:
        await tg.start(batcher.run)
        with anyio.fail_after(10):
            await batcher.submit([_g(0)])
            tg.start_soon(held)
            await anyio.wait_all_tasks_blocked()
            assert not refused
            batcher.close()
    assert len(refused) == 1
    assert [g.producer.sequence for g in log.groups if g.producer] == [0]


async def test_a_hold_ends_a_batch_window_before_the_requests_commit_deadline() -> None:
    log = _Log()
    batcher = Batcher(log.append, max_bytes=1 << 20, max_delay_s=0.2,
                      buffer_max_bytes=1 << 24, sequence_hold_s=30.0)

    async def body() -> None:
        await batcher.submit([_g(0)])
        started = time.monotonic()
        await batcher.submit([_g(2, commit_by=time.monotonic() + 0.3)])
        # Held about 0.1 s (0.3 less the 0.2 s window and a flush's usual time, near
        # nothing here), then flushed within the window.
        assert 0.05 <= time.monotonic() - started < 5

    await _batcher_run(batcher, body)
    assert [g.producer.sequence for g in log.groups if g.producer] == [0, 2]
