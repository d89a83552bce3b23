"""Idempotent producers against real Oxia and MinIO: a producer's groups are appended
once and in order, whatever other producers and keyed appends do meanwhile
(docs/protocol.md, Idempotent producers)."""

from __future__ import annotations

import time
from typing import Any

import anyio

from app.batching.batcher import Batcher
from app.errors import (
    CommitInDoubt,
    DuplicateSequence,
    OutOfOrderSequence,
    ProduceExpired,
    UnknownProducer,
)
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage import producer_state
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult, ProducerSeq
from app.storage.idempotency import IDEMPOTENCY_WINDOW
from app.storage.keys import TopicPartition
from tests.helpers.held_commits import hold_first_commit
from tests.helpers.stack import Engine, make_settings, open_engine


def _seq(pid: str, n: int) -> ProducerSeq:
    return ProducerSeq(pid, n)


def _group(tp: TopicPartition, value: bytes, pid: str, n: int) -> AppendGroup:
    return AppendGroup(tp, [value], producer=_seq(pid, n))


async def _one(engine: Engine, group: AppendGroup) -> AppendOutcome:
    (outcome,) = await engine.writer.append_shared([group])
    return outcome


def _ok(outcome: AppendOutcome) -> AppendResult:
    assert isinstance(outcome, AppendResult), outcome
    return outcome


async def _values(engine: Engine, tp: TopicPartition) -> list[bytes]:
    got = await engine.reader.read(tp, 1, max_records=10_000)
    return [v for _, v in got.records]  # type: ignore[misc]


async def test_a_resend_is_answered_after_many_other_keyed_appends(
        engine: Engine, stack: LocalStack, tp: TopicPartition) -> None:
    """The idempotency window forgets a key after 64 other keyed appends; a producer's
    sequence is remembered whatever other keyed appends come: a resend from another
    process (no cache) gets the first offsets back, marked duplicate."""
    first = _ok(await _one(engine, AppendGroup(tp, [b"a", b"b"], producer=_seq("p1", 0))))
    for i in range(IDEMPOTENCY_WINDOW * 2):
        _ok(await _one(engine, AppendGroup(tp, [b"x"], f"other-{i}")))
    async with open_engine(make_settings(stack)) as fresh:
        again = _ok(await _one(fresh, AppendGroup(tp, [b"a", b"b"], producer=_seq("p1", 0))))
        following = _ok(await _one(fresh, _group(tp, b"c", "p1", 1)))
    assert (first.start_offset, first.end_offset) == (1, 2) and not first.duplicate
    assert (again.start_offset, again.end_offset, again.duplicate) == (1, 2, True)
    assert following.start_offset == IDEMPOTENCY_WINDOW * 2 + 3
    values = await _values(engine, tp)
    assert values.count(b"a") == 1 and values[-1] == b"c"


async def test_a_gap_is_refused_and_nothing_written(engine: Engine,
                                                    tp: TopicPartition) -> None:
    """Sequence 2 before 1 is refused (retriable, nothing written); once 1 is in, 2
    follows. A repeat of an older group is answered with its offsets."""
    zero = _ok(await _one(engine, _group(tp, b"0", "p", 0)))
    gap = await _one(engine, _group(tp, b"2", "p", 2))
    assert type(gap) is OutOfOrderSequence and gap.retriable and not gap.maybe_written
    one = _ok(await _one(engine, _group(tp, b"1", "p", 1)))
    two = _ok(await _one(engine, _group(tp, b"2", "p", 2)))
    again = _ok(await _one(engine, _group(tp, b"0", "p", 0)))
    assert (zero.start_offset, one.start_offset, two.start_offset) == (1, 2, 3)
    assert again.duplicate and again.start_offset == 1
    assert await _values(engine, tp) == [b"0", b"1", b"2"]


async def test_groups_of_one_append_are_judged_in_order(engine: Engine,
                                                        tp: TopicPartition) -> None:
    """In one append: a producer's 0 then 1 both go in; a repeat of 0 is its echo; a 3
    after them is a gap (refused, the rest committed without it); another producer's 1
    read before its 0 goes in after it; a third producer unknown at 1 is refused."""
    a0, a1, echo, a3, b1, b0, c1, plain = await engine.writer.append_shared([
        _group(tp, b"a0", "a", 0), _group(tp, b"a1", "a", 1), _group(tp, b"a0'", "a", 0),
        _group(tp, b"a3", "a", 3), _group(tp, b"b1", "b", 1), _group(tp, b"b0", "b", 0),
        _group(tp, b"c1", "c", 1), AppendGroup(tp, [b"plain"])])
    assert _ok(a0).start_offset == 1 and _ok(a1).start_offset == 2
    assert _ok(echo).duplicate and _ok(echo).start_offset == 1
    assert type(a3) is OutOfOrderSequence
    assert _ok(b0).start_offset == 3 and _ok(b1).start_offset == 4
    assert type(c1) is UnknownProducer and not c1.retriable
    assert _ok(plain).start_offset == 5
    assert await _values(engine, tp) == [b"a0", b"a1", b"b0", b"b1", b"plain"]


async def test_an_unknown_producer_must_start_at_zero(engine: Engine,
                                                      tp: TopicPartition) -> None:
    refused = await _one(engine, _group(tp, b"x", "new", 5))
    assert type(refused) is UnknownProducer and not refused.maybe_written
    assert _ok(await _one(engine, _group(tp, b"x", "new", 0))).start_offset == 1


async def test_a_producer_is_forgotten_only_after_many_other_producers(
        engine: Engine, tp: TopicPartition) -> None:
    """The partition remembers the last PRODUCER_WINDOW producers: the oldest is
    forgotten by the one after them (counted), and its next sequence is refused as
    unknown, never appended blind."""
    window = producer_state.PRODUCER_WINDOW
    _ok(await _one(engine, _group(tp, b"first", "first", 0)))
    for i in range(window - 1):
        _ok(await _one(engine, _group(tp, b"x", f"p{i}", 0)))
    remembered = _ok(await _one(engine, _group(tp, b"first", "first", 0)))
    assert remembered.duplicate and remembered.start_offset == 1
    _ok(await _one(engine, _group(tp, b"x", "pushes-out", 0)))
    control = await engine.reader.read_control(tp)
    assert control is not None and producer_state.evictions(control) == 1
    assert "first" not in control.extra[producer_state.PRODUCERS_FIELD]
    assert type(await _one(engine, _group(tp, b"next", "first", 1))) is UnknownProducer


async def test_a_repeat_older_than_the_groups_remembered(engine: Engine,
                                                         tp: TopicPartition) -> None:
    kept = producer_state.PRODUCER_BATCHES
    for n in range(kept + 1):
        _ok(await _one(engine, _group(tp, b"%d" % n, "p", n)))
    oldest_kept = _ok(await _one(engine, _group(tp, b"1", "p", 1)))
    assert oldest_kept.duplicate and oldest_kept.start_offset == 2
    too_old = await _one(engine, _group(tp, b"0", "p", 0))
    assert type(too_old) is DuplicateSequence and too_old.maybe_written
    assert len(await _values(engine, tp)) == kept + 1


async def _lose_the_race(engine: Engine, settings: Settings, tp: TopicPartition,
                         others: int) -> tuple[AppendOutcome, AppendOutcome, AppendResult]:
    """Broker B's commit of ("p", 0) beside a plain group is held after its read; A
    commits ("p", 0) (the client's resend) and then ``others`` other producers. B's
    commit conflicts and reads again."""
    held, release, answers = anyio.Event(), anyio.Event(), []
    async with open_engine(settings) as b, anyio.create_task_group() as tg:
        await b.writer.ensure_partition(tp)
        hold_first_commit(b, held, release)

        async def append_on_b() -> None:
            answers.extend(await b.writer.append_shared(
                [_group(tp, b"P0", "p", 0), AppendGroup(tp, [b"no producer"])]))

        tg.start_soon(append_on_b)
        with anyio.fail_after(60):
            await held.wait()
        first = _ok(await _one(engine, _group(tp, b"P0", "p", 0)))
        for i in range(others):
            _ok(await _one(engine, _group(tp, b"x", f"o{i}", 0)))
        release.set()
    sequenced, plain = answers
    return sequenced, plain, first


async def test_a_commit_that_lost_to_its_own_resend_answers_the_duplicate(
        engine: Engine, settings: Settings, tp: TopicPartition) -> None:
    sequenced, plain, first = await _lose_the_race(engine, settings, tp, 3)
    assert _ok(sequenced).duplicate and _ok(sequenced).start_offset == first.start_offset
    assert _ok(plain).start_offset == 5
    assert (await _values(engine, tp)).count(b"P0") == 1


async def test_a_commit_whose_producer_may_have_been_forgotten_meanwhile_is_in_doubt(
        engine: Engine, settings: Settings, tp: TopicPartition) -> None:
    """As above, with enough producers after the resend to push "p" out: B does not find
    it, and other producers were forgotten since it looked, so it answers in doubt
    rather than appending sequence 0 again; the plain group is appended."""
    others = producer_state.PRODUCER_WINDOW
    sequenced, plain, _ = await _lose_the_race(engine, settings, tp, others)
    assert type(sequenced) is CommitInDoubt and sequenced.maybe_written
    assert _ok(plain).start_offset == others + 2
    assert (await _values(engine, tp)).count(b"P0") == 1


async def test_a_writer_behind_other_brokers_commits_judges_refusals_afresh(
        engine: Engine, settings: Settings, tp: TopicPartition) -> None:
    """B commits the producer's 0 and keeps the control record it wrote; A commits 1
    (the producer's next request went there). B's cached record calls 2 a gap; read
    again, it is the next: appended, not refused."""
    async with open_engine(settings) as b:
        _ok(await _one(b, _group(tp, b"0", "p", 0)))
        _ok(await _one(engine, _group(tp, b"1", "p", 1)))
        cached = await b.writer._controls.current(tp)
        assert cached.cached, "B no longer serves its own record: the test shows nothing"
        two = _ok(await _one(b, _group(tp, b"2", "p", 2)))
    assert two.start_offset == 3
    assert await _values(engine, tp) == [b"0", b"1", b"2"]


async def test_a_writer_whose_record_says_fenced_judges_on_the_record_it_commits_on(
        engine: Engine, settings: Settings, tp: TopicPartition) -> None:
    """A fenced the partition and keeps that record; B lifts the fence and commits the
    producer's 3. The client's resend of 3 through A: A reads again for the fence and
    judges on what it read, so 3 is a duplicate, not a second copy that would also move
    the producer's sequence back."""
    for n in range(3):
        _ok(await _one(engine, _group(tp, b"%d" % n, "p", n)))
    await engine.writer.fence(tp)
    async with open_engine(settings) as b:
        await b.writer.unfence(tp)
        three = _ok(await _one(b, _group(tp, b"3", "p", 3)))
    again = _ok(await _one(engine, _group(tp, b"3", "p", 3)))
    assert again.duplicate and again.start_offset == three.start_offset == 4
    _ok(await _one(engine, _group(tp, b"4", "p", 4)))
    assert await _values(engine, tp) == [b"0", b"1", b"2", b"3", b"4"]


async def test_a_repeat_beside_the_next_group_is_answered_as_the_repeat(
        engine: Engine, tp: TopicPartition) -> None:
    """One append holding the producer's next group and then a resend of its last one:
    the resend is the duplicate it is, not a gap after the next."""
    last = _ok(await _one(engine, _group(tp, b"0", "p", 0)))
    following, repeat = await engine.writer.append_shared(
        [_group(tp, b"1", "p", 1), _group(tp, b"0", "p", 0)])
    assert _ok(following).start_offset == 2
    assert _ok(repeat).duplicate and _ok(repeat).start_offset == last.start_offset


async def test_a_producers_groups_read_out_of_order_are_appended_in_its_order(
        engine: Engine, tp: TopicPartition) -> None:
    """Requests of one producer read in another order than sent (2, 0, 1), beside
    another producer's and a plain group: each producer's groups take their places in
    the order of their sequence, none is refused."""
    outcomes = await engine.writer.append_shared([
        _group(tp, b"a2", "a", 2), AppendGroup(tp, [b"plain"]), _group(tp, b"a0", "a", 0),
        _group(tp, b"b0", "b", 0), _group(tp, b"a1", "a", 1)])
    offsets = [_ok(o).start_offset for o in outcomes]
    assert offsets == [5, 2, 1, 4, 3]
    assert await _values(engine, tp) == [b"a0", b"plain", b"a1", b"b0", b"a2"]


async def test_a_later_flush_commits_after_an_earlier_one_holding_the_group_before(
        engine: Engine, tp: TopicPartition) -> None:
    """Two flushes of one writer under way: the first holds the producer's 0 and its
    upload is held; the second holds its 1 and uploads at once. The second's commit
    waits for the first's (it would otherwise refuse 1 as out of order): released only
    once the second is seen waiting, both are committed, in order."""
    writer = engine.writer
    real_put, real_wait = writer._s3.put, writer._turns.wait
    first_held, release, second_waits = anyio.Event(), anyio.Event(), anyio.Event()

    async def put(key: str, body: bytes) -> None:
        if not first_held.is_set():
            first_held.set()
            await release.wait()
        await real_put(key, body)

    async def wait(number: int, tp: TopicPartition, producers: Any) -> None:
        producers = list(producers)
        if any(p.sequence == 1 for p in producers):
            second_waits.set()
        await real_wait(number, tp, producers)

    writer._s3.put = put  # type: ignore[method-assign]
    writer._turns.wait = wait  # type: ignore[method-assign]
    outcomes: dict[int, AppendOutcome] = {}
    async with anyio.create_task_group() as tg:

        async def flush(n: int) -> None:
            outcomes[n] = await _one(engine, _group(tp, b"%d" % n, "p", n))

        tg.start_soon(flush, 0)
        with anyio.fail_after(10):
            await first_held.wait()
        tg.start_soon(flush, 1)
        with anyio.fail_after(10):
            await second_waits.wait()  # uploaded, at its commit's turn
        release.set()
    assert _ok(outcomes[0]).start_offset == 1 and _ok(outcomes[1]).start_offset == 2
    assert await _values(engine, tp) == [b"0", b"1"]


def _hold_commits_of(engine: Engine, held_tp: TopicPartition
                     ) -> tuple[anyio.Event, anyio.Event]:
    """The writer's first commit of ``held_tp`` waits for the second event (the first
    says it is waiting): an Oxia shard that does not answer, for that partition."""
    writer = engine.writer
    real = writer._commit
    held, release = anyio.Event(), anyio.Event()

    async def commit(c: Any) -> Any:
        if c.tp == held_tp and not held.is_set():
            held.set()
            await release.wait()
        return await real(c)

    writer._commit = commit  # type: ignore[method-assign]
    return held, release


async def test_a_later_flush_waits_for_the_partitions_commit_not_the_whole_flush(
        engine: Engine, tp: TopicPartition) -> None:
    """The first flush holds the producer's 0 on P and a group of Q, whose commit does
    not end (Q's shard is away). Its commit of P is done: the second flush's 1 on P is
    committed while Q is still held."""
    other = TopicPartition(tp.topic + "-other", 0)
    await engine.writer.ensure_partition(other)
    held, release = _hold_commits_of(engine, other)
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            await engine.writer.append_shared([_group(tp, b"0", "p", 0),
                                               AppendGroup(other, [b"q"])])

        tg.start_soon(first)
        with anyio.fail_after(10):
            await held.wait()
            second = _ok(await _one(engine, _group(tp, b"1", "p", 1)))
        release.set()
    assert second.start_offset == 2
    assert await _values(engine, tp) == [b"0", b"1"]


async def test_a_wait_for_an_earlier_flush_ends_at_the_groups_deadline(
        engine: Engine, tp: TopicPartition) -> None:
    """The first flush holds the producer's 0 on P, whose commit does not end; the
    second flush's 1 on P, due in 0.3 s, waits for it no longer than that: it is
    answered (nothing written: late, or its 0 not in) while the first is still held."""
    held, release = _hold_commits_of(engine, tp)
    async with anyio.create_task_group() as tg:

        async def first() -> None:
            await _one(engine, _group(tp, b"0", "p", 0))

        tg.start_soon(first)
        with anyio.fail_after(10):
            await held.wait()
            late = await _one(engine, AppendGroup(tp, [b"1"], producer=ProducerSeq("p", 1),
                                                  commit_by=time.monotonic() + 0.3))
        release.set()
    assert type(late) in (ProduceExpired, UnknownProducer) and not late.maybe_written
    assert await _values(engine, tp) == [b"0"]


async def test_a_request_read_before_the_one_ahead_of_it_waits_for_it_at_the_batcher(
        engine: Engine, tp: TopicPartition) -> None:
    """The producer's group 2 reaches the batcher before its 1 (a broker reads requests
    in turns): alone in a flush it would be refused out of order. It waits, unbuffered,
    until 1 is taken (app/batching/sequence_gate.py); both are appended in order, none
    refused."""
    batcher = Batcher(engine.writer.append_shared, max_bytes=1 << 20, max_delay_s=0.001,
                      buffer_max_bytes=1 << 24, sequence_hold_s=30.0)
    outcomes: dict[int, AppendOutcome] = {}
    answered = {n: anyio.Event() for n in range(3)}

    async def produce(n: int) -> None:
        (outcomes[n],) = await batcher.enqueue([_group(tp, b"%d" % n, "p", n)], take_by=None)
        answered[n].set()

    async with anyio.create_task_group() as tg:
        await tg.start(batcher.run)
        with anyio.fail_after(20):
            await produce(0)
            tg.start_soon(produce, 2)
            await anyio.wait_all_tasks_blocked()
            assert 2 not in outcomes and batcher.statistics().buffered_waiters == 0
            await produce(1)
            await answered[2].wait()  # its flush, after 1 was taken
        batcher.close()
    assert [_ok(outcomes[n]).start_offset for n in range(3)] == [1, 2, 3]
    assert await _values(engine, tp) == [b"0", b"1", b"2"]
