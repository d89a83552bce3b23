"""The answer budget (app/broker/answer_budget.py): reservations within the limit go at
once, others wait in line for bytes given back, a wait ends in 503 after its bound, and
a cancelled wait or an ended answer leaves nothing taken."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from app.broker.answer_budget import AnswerBudget, Reservation
from app.errors import Unavailable
from app.factory import create_app
from app.settings import Settings

LONG = 30.0  # a wait no test should reach: the test ends it through an event


async def _waiting(budget: AnswerBudget, n: int) -> None:
    """Until ``n`` reservations wait in line (the tasks that wait get there within a few
    scheduling rounds: nothing else runs)."""
    for _ in range(100):
        if budget.statistics().waiting == n:
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError(f"{budget.statistics().waiting} waiting, not {n}")


async def test_reserve_hold_and_release_count_what_is_held() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    a = budget.reservation()
    await a.reserve(60)
    assert (a.held, budget.statistics().bytes_in_flight) == (60, 60)
    await a.reserve(40)  # grows by what is missing
    assert budget.statistics().bytes_in_flight == 60
    a.hold(10)  # cut to what the read returned
    assert budget.statistics().bytes_in_flight == 10
    with budget.reservation() as b:
        await b.reserve(90)
        assert budget.statistics().bytes_in_flight == 100
    assert budget.statistics().bytes_in_flight == 10  # given back on leaving
    a.release()
    a.release()  # twice is harmless
    stats = budget.statistics()
    assert (stats.bytes_in_flight, stats.peak_bytes_in_flight, stats.refused) == (0, 100, 0)


async def test_a_hold_tried_without_waiting_takes_room_only_when_it_fits_now() -> None:
    """What reads ahead takes the budget only when there is room at once: never past the
    limit, never ahead of a reservation waiting in line, and given back once."""
    budget = AnswerBudget(100, max_wait_s=LONG)
    give_back = budget.try_hold(70)
    assert give_back is not None and budget.statistics().bytes_in_flight == 70
    assert budget.try_hold(31) is None  # past the limit: nothing taken
    assert budget.statistics().bytes_in_flight == 70
    async with anyio.create_task_group() as tg:
        waiting = budget.reservation()
        tg.start_soon(waiting.reserve, 50)
        await _waiting(budget, 1)
        assert budget.try_hold(10) is None  # it fits, but a read waits in line first
        give_back()
        give_back()  # twice gives back once
    assert budget.statistics().bytes_in_flight == 50 == waiting.held
    waiting.release()
    assert budget.statistics().bytes_in_flight == 0


async def test_a_request_larger_than_the_budget_takes_all_of_it() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    with budget.reservation() as r:
        await r.reserve(10_000)
        assert r.held == 100 == budget.statistics().bytes_in_flight


async def test_a_reservation_waits_for_bytes_given_back_in_line() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    first = budget.reservation()
    await first.reserve(80)
    big, small = budget.reservation(), budget.reservation()
    order: list[str] = []

    async def take(name: str, r: Reservation, n: int) -> None:
        await r.reserve(n)
        order.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, "big", big, 50)
        await _waiting(budget, 1)
        # 20 bytes are free and would fit, but the line is first come, first served:
        # a large request is not overtaken for ever by small ones.
        tg.start_soon(take, "small", small, 20)
        await _waiting(budget, 2)
        assert order == []
        first.hold(30)  # 50 given back: the head of the line fits, then the next
    assert order == ["big", "small"]
    assert budget.statistics().bytes_in_flight == 100
    for r in (first, big, small):
        r.release()
    assert budget.statistics().bytes_in_flight == 0


async def test_a_wait_past_its_bound_is_refused_and_takes_nothing() -> None:
    budget = AnswerBudget(100, max_wait_s=0.05)
    with budget.reservation() as full:
        await full.reserve(100)
        late = budget.reservation()
        with pytest.raises(Unavailable) as refused:
            await late.reserve(1)
        assert refused.value.retriable and refused.value.http_status == 503
        stats = budget.statistics()
        assert (late.held, stats.bytes_in_flight, stats.waiting, stats.refused) == (
            0, 100, 0, 1)
    assert budget.statistics().bytes_in_flight == 0


async def test_a_cancelled_wait_leaves_the_line_and_lets_the_next_in() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    full = budget.reservation()
    await full.reserve(90)
    head, after = budget.reservation(), budget.reservation()
    async with anyio.create_task_group() as tg, anyio.create_task_group() as inner:
        inner.start_soon(head.reserve, 50)
        await _waiting(budget, 1)
        tg.start_soon(after.reserve, 10)  # would fit, but waits behind the head
        await _waiting(budget, 2)
        assert after.held == 0
        inner.cancel_scope.cancel()  # the head gives up: the next goes in
    assert (head.held, after.held) == (0, 10)
    stats = budget.statistics()
    assert (stats.bytes_in_flight, stats.waiting, stats.refused) == (100, 0, 0)
    full.release()
    after.release()
    assert budget.statistics().bytes_in_flight == 0


async def test_a_grant_that_races_a_cancellation_is_never_lost() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    full = budget.reservation()
    await full.reserve(100)
    waiting = budget.reservation()
    async with anyio.create_task_group() as tg:
        tg.start_soon(waiting.reserve, 60)
        await _waiting(budget, 1)
        full.release()  # grants the waiter (its bytes are taken for it) ...
        tg.cancel_scope.cancel()  # ... which is cancelled before it runs again
    # Either the grant reached the reservation (whose owner releases it on its way out)
    # or it was given back: the bytes are never taken for nobody.
    assert budget.statistics().bytes_in_flight == waiting.held
    waiting.release()
    assert budget.statistics().bytes_in_flight == 0


async def test_holding_more_than_was_reserved_is_counted_and_holds_the_line() -> None:
    budget = AnswerBudget(100, max_wait_s=LONG)
    over = budget.reservation()
    over.hold(150)  # an answer larger than its reservation (bytes already in memory)
    assert budget.statistics().bytes_in_flight == 150
    nxt = budget.reservation()
    async with anyio.create_task_group() as tg:
        tg.start_soon(nxt.reserve, 10)
        await _waiting(budget, 1)
        over.hold(90)  # back under the limit, with room for the next
    assert budget.statistics().bytes_in_flight == 100
    over.release()
    nxt.release()


def test_the_consume_route_declares_the_refusal_with_retry_after() -> None:
    doc = create_app(Settings(broker_id="budget")).openapi()
    refused = doc["paths"]["/consume"]["post"]["responses"]["503"]
    assert "Unavailable" in refused["content"]["application/json"]["examples"]
    assert "LLOG_MAX_ANSWER_BYTES_IN_FLIGHT" in refused["description"]
    assert refused["headers"]["Retry-After"]["required"] is True


async def test_a_stream_that_waits_to_read_again_holds_none_of_the_budget() -> None:
    """The read of a stream found the budget full (a retriable refusal) while its hold
    still had the batch it sent before: the hold is given back before the stream sleeps
    to retry, so waiting streams cannot keep the budget full between them."""
    from typing import Any

    from prometheus_client import CollectorRegistry

    from app.broker.answering import AnswerHold
    from app.broker.event_stream import EventStream, Streaming
    from app.broker.metrics import ConsumeMetrics
    from app.service_health import ServiceHealth
    from app.settings import Settings
    from app.storage.keys import TopicPartition

    budget = AnswerBudget(10_000, max_wait_s=LONG)

    class FullBudget:
        released = False

        def answer(self, factor: float) -> AnswerHold:
            return AnswerHold(budget.reservation(), factor)

        async def consume(self, *args: object, hold: AnswerHold, **kwargs: object
                          ) -> object:
            hold.hold(4_000)  # what the batch sent before still held
            raise Unavailable("the answer budget is full")

    class Readable:
        async def check_readable(self, tp: TopicPartition) -> None:
            return None

    health = ServiceHealth()
    health.serving()  # the stream reads while its broker takes work
    stand_in: Any = FullBudget()
    broker = Streaming(Settings(broker_id="stream").limits, health, stand_in,
                       positions=stand_in,  # the stream's start is given below
                       topics=Readable(),  # type: ignore[arg-type]
                       metrics=ConsumeMetrics(CollectorRegistry()))
    stream = EventStream(broker, "orders", encoding="auto", max_bytes=1000,
                         heartbeat_ms=1000, guard=None, consumed=lambda _: None)
    stream.offsets = {0: 1}
    events = stream.events()
    with anyio.fail_after(10):
        assert await events.__anext__() == b"retry: 1000\n\n"
        assert await events.__anext__() == b": heartbeat\n\n"  # it sleeps next
        assert budget.statistics().bytes_in_flight == 0
        await events.aclose()
