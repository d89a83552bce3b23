"""The batcher's sequence gate (app/batching/sequence_gate.py): a producer's group read
before the group ahead of it waits for that one to be taken, briefly and boundedly."""

from __future__ import annotations

import time

import anyio

from app.batching.sequence_gate import SequenceGate
from app.storage.appends import AppendGroup, ProducerSeq
from app.storage.keys import TopicPartition

TP = TopicPartition("t", 0)
OTHER = TopicPartition("t", 1)


def _g(n: int, pid: str = "p", tp: TopicPartition = TP) -> AppendGroup:
    return AppendGroup(tp, [b"v"], producer=ProducerSeq(pid, n))


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
        gate.took([_g(3, pid="q")])  # another producer's group wakes it: not its turn
        await anyio.wait_all_tasks_blocked()
        assert order == []
        with anyio.fail_after(5):
            await gate.wait([_g(1)])  # its predecessor (0) is taken: no wait
        gate.took([_g(1)])
        order.append(1)
    assert order == [1, 2]
    assert held == [True]


async def test_groups_in_order_unknown_producers_and_resends_never_wait() -> None:
    held: list[bool] = []
    gate = SequenceGate(hold_s=30.0, held=held.append)
    with anyio.fail_after(5):
        await gate.wait([_g(7)])  # a producer never seen here: nothing to expect
        gate.took([_g(7)])
        await gate.wait([_g(8)])  # the next one
        gate.took([_g(8)])
        await gate.wait([_g(5)])  # a resend of one taken before
        await gate.wait([_g(0, pid="new")])
        # A request holding a producer's next group and the one after it: only its first
        # group needs the one before.
        await gate.wait([_g(10), _g(9)])
    assert gate.ahead([_g(10), _g(9)]) == []
    assert held == []


async def test_a_wait_ends_after_the_hold_and_the_pair_is_not_held_again_for_a_while(
        ) -> None:
    held: list[bool] = []
    clock = _Clock()
    gate = SequenceGate(hold_s=0.05, quiet_s=10.0, clock=clock, held=held.append)
    gate.took([_g(0)])
    started = time.monotonic()
    with anyio.fail_after(5):
        await gate.wait([_g(2)])  # 1 went to another broker: it never comes here
    assert time.monotonic() - started >= 0.04
    assert held == [False]
    gate.took([_g(2)])
    # Its groups go elsewhere too: the next gap on this pair passes at once...
    assert gate.ahead([_g(5)]) == []
    # ...while another pair of the same producer is still held, and this one again once
    # the quiet time is over.
    gate.took([_g(0, tp=OTHER)])
    assert gate.ahead([_g(3, tp=OTHER)]) != []
    clock.now += 10.0
    assert gate.ahead([_g(5)]) == [((TP, "p"), 5)]


async def test_a_wait_never_outlasts_the_requests_deadline() -> None:
    gate = SequenceGate(hold_s=30.0)
    gate.took([_g(0)])
    with anyio.fail_after(5):
        await gate.wait([_g(2)], until=time.monotonic() - 1)  # past already
        await gate.wait([_g(2)], until=time.monotonic() + 0.02)


async def test_the_gate_remembers_a_bounded_number_of_pairs_and_a_forgotten_one_is_not_waited_for(
        ) -> None:
    gate = SequenceGate(hold_s=30.0, capacity=2)
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
        gate.took([_g(0, pid="c")])  # "a" is the least recently taken: forgotten
        with anyio.fail_after(5):
            await done.wait()
    assert len(gate) == 2
    assert gate.ahead([_g(9, pid="a")]) == []


async def test_a_cancelled_wait_leaves_the_pair_as_it_was() -> None:
    """A request abandoned while it waits (its caller gone) takes nothing and marks
    nothing: the pair is held as before."""
    gate = SequenceGate(hold_s=30.0)
    gate.took([_g(0)])
    with anyio.move_on_after(0.01):
        await gate.wait([_g(2)])
    assert gate.ahead([_g(2)]) == [((TP, "p"), 2)]
    gate.took([_g(1)])
    with anyio.fail_after(5):
        await gate.wait([_g(2)])
