"""The produce batcher's logic, with a fake append in place of storage."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.abc
import pytest

from app.batching.batcher import Batcher, BatcherState, BatcherStats, ClaimFn, paced_for
from app.errors import (
    BackPressureRejected,
    CommitInDoubt,
    ForwardExpired,
    LlogError,
    PartitionFenced,
    ShuttingDown,
    StorageUnavailable,
    Unavailable,
)
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition

A, B = TopicPartition("a", 0), TopicPartition("b", 1)


class FakeLog:
    """Assigns offsets like the writer; can be held (to fill the buffer) or broken."""

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, int] = {}
        self.calls: list[list[AppendGroup]] = []
        self.release = anyio.Event()
        self.hold = False
        self.entered = anyio.Event()
        self.fail_with: BaseException | None = None

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendResult | LlogError]:
        self.calls.append(list(groups))
        self.entered.set()
        if self.hold:
            await self.release.wait()
        if self.fail_with is not None:
            raise self.fail_with
        out: list[AppendResult | LlogError] = []
        for g in groups:
            start = self.offsets.get(g.tp, 0) + 1
            end = start + len(g.records) - 1
            self.offsets[g.tp] = end
            out.append(AppendResult(g.tp, start, end, len(g.records), f"idx/{end}", "s3://b/k"))
        return out


def batcher(log: FakeLog, **kw: object) -> Batcher:
    options: dict[str, object] = {"max_bytes": 1 << 20, "max_delay_s": 0.05,
                                  "buffer_max_bytes": 1 << 20}
    options.update(kw)
    return Batcher(log.append, **options)  # type: ignore[arg-type]


async def test_concurrent_requests_share_one_flush_and_get_their_own_offsets() -> None:
    log = FakeLog()
    b = batcher(log, max_delay_s=1.0, max_bytes=10)
    answers: dict[str, list[AppendResult | LlogError]] = {}
    all_answered = anyio.Event()

    async def submit(name: str, groups: list[AppendGroup]) -> None:
        answers[name] = await b.submit(groups)
        if len(answers) == 3:
            all_answered.set()

    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        tg.start_soon(submit, "one", [AppendGroup(A, [b"a1", b"a2"]), AppendGroup(B, [b"b1"])])
        tg.start_soon(submit, "two", [AppendGroup(A, [b"a3"])])
        tg.start_soon(submit, "three", [AppendGroup(A, [b"a4", b"a5"])])  # reaches max_bytes
        with anyio.fail_after(5):
            await all_answered.wait()
        b.close()

    assert len(log.calls) == 1  # one flush holding every group, in arrival order
    assert [(g.tp, list(g.records)) for g in log.calls[0]] == [
        (A, [b"a1", b"a2"]), (B, [b"b1"]), (A, [b"a3"]), (A, [b"a4", b"a5"])]
    one_a, one_b = answers["one"]
    assert isinstance(one_a, AppendResult) and (one_a.start_offset, one_a.end_offset) == (1, 2)
    assert isinstance(one_b, AppendResult) and (one_b.start_offset, one_b.end_offset) == (1, 1)
    (two,) = answers["two"]
    assert isinstance(two, AppendResult) and (two.start_offset, two.end_offset) == (3, 3)
    (three,) = answers["three"]
    assert isinstance(three, AppendResult) and (three.start_offset, three.end_offset) == (4, 5)


async def test_a_full_buffer_refuses_new_work() -> None:
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, buffer_max_bytes=4)
    results: list[object] = []
    answered = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)

        async def first() -> None:
            results.append(await b.submit([AppendGroup(A, [b"1234"])]))
            answered.set()

        tg.start_soon(first)
        with anyio.fail_after(5):
            await log.entered.wait()  # the first flush holds 4 bytes in flight
        with pytest.raises(BackPressureRejected):
            await b.submit([AppendGroup(A, [b"x"])])
        log.release.set()
        with anyio.fail_after(5):
            await answered.wait()
        b.close()
    assert isinstance(results[0], list) and isinstance(results[0][0], AppendResult)


async def test_close_flushes_what_is_buffered_and_then_refuses() -> None:
    log = FakeLog()
    b = batcher(log, max_delay_s=60)  # only close() can make it flush now
    got: list[list[AppendResult | LlogError]] = []
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)

        async def submit() -> None:
            got.append(await b.submit([AppendGroup(A, [b"last"])]))

        tg.start_soon(submit)
        await anyio.wait_all_tasks_blocked()
        b.close()
    assert len(got) == 1 and isinstance(got[0][0], AppendResult)
    with pytest.raises(ShuttingDown) as excinfo:
        await b.submit([AppendGroup(A, [b"late"])])
    assert excinfo.value.error_type == "ShuttingDown" and excinfo.value.retriable


async def test_a_failed_append_fails_that_flush_only() -> None:
    log = FakeLog()
    log.fail_with = StorageUnavailable("S3 is down")
    b = batcher(log, max_delay_s=0)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        (outcome,) = await b.submit([AppendGroup(A, [b"x"])])
        assert isinstance(outcome, StorageUnavailable)
        log.fail_with = None
        (outcome,) = await b.submit([AppendGroup(A, [b"y"])])
        assert isinstance(outcome, AppendResult)
        b.close()


async def test_an_unexpected_error_fails_that_flush_as_in_doubt_and_the_flusher_lives_on(
) -> None:
    log = FakeLog()
    log.fail_with = RuntimeError("bug")
    b = batcher(log, max_delay_s=0)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(b.run)
            with pytest.raises(CommitInDoubt) as excinfo:
                await b.submit([AppendGroup(A, [b"x"])])
            assert excinfo.value.maybe_written
            log.fail_with = None
            (outcome,) = await b.submit([AppendGroup(A, [b"after"])])
            assert isinstance(outcome, AppendResult)
            assert b.state is BatcherState.OPEN
            b.close()
    assert b.state is BatcherState.CLOSED


async def test_each_waiter_gets_its_partitions_outcome() -> None:
    """A partition that fails fails only the groups that named it."""
    log = FakeLog()
    original = log.append

    async def append(groups: Sequence[AppendGroup]) -> list[AppendResult | LlogError]:
        out = await original(groups)
        return [PartitionFenced("b is fenced") if g.tp == B else o
                for g, o in zip(groups, out, strict=True)]

    b = Batcher(append, max_bytes=1 << 20, max_delay_s=0.2, buffer_max_bytes=1 << 20)
    got: dict[str, list[AppendResult | LlogError]] = {}
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)

        async def submit(name: str, groups: list[AppendGroup]) -> None:
            got[name] = await b.submit(groups)

        tg.start_soon(submit, "ab", [AppendGroup(A, [b"1"]), AppendGroup(B, [b"2"])])
        tg.start_soon(submit, "a", [AppendGroup(A, [b"3"])])
        await anyio.wait_all_tasks_blocked()
        b.close()
    assert isinstance(got["ab"][0], AppendResult) and isinstance(got["ab"][1], PartitionFenced)
    assert isinstance(got["a"][0], AppendResult) and got["a"][0].start_offset == 2


async def test_a_failing_commit_report_never_fails_committed_records() -> None:
    async def broken(committed: object) -> None:
        raise RuntimeError("tail cache is broken")

    log = FakeLog()
    b = batcher(log, max_delay_s=0, on_committed=broken)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        (outcome,) = await b.submit([AppendGroup(A, [b"x"])])
        assert isinstance(outcome, AppendResult)
        b.close()


async def test_statistics_in_flight() -> None:
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_inflight_flushes=1)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        assert b.statistics() == BatcherStats("open", 0, 0, 0, 0)
        tg.start_soon(b.submit, [AppendGroup(A, [b"12345"])])
        with anyio.fail_after(5):
            await log.entered.wait()
        assert b.statistics() == BatcherStats("open", 0, 0, 5, 1)
        tg.start_soon(b.submit, [AppendGroup(B, [b"12"]), AppendGroup(A, [b"3"])])
        await anyio.wait_all_tasks_blocked()  # buffered: the only slot is busy
        assert b.statistics() == BatcherStats("open", 3, 1, 5, 1)
        b.close()
        assert b.statistics().state == "closing"
        log.release.set()
    assert b.statistics() == BatcherStats("closed", 0, 0, 0, 0)


async def test_a_dead_flusher_fails_every_waiter_and_refuses_new_work() -> None:
    """Also the waiters buffered while the flusher waited for a flush slot."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_inflight_flushes=1)
    failures: list[BaseException] = []

    async def submit(groups: list[AppendGroup]) -> None:
        try:
            await b.submit(groups)
        except LlogError as exc:
            failures.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as outer:
            outer.start_soon(submit, [AppendGroup(A, [b"in-flight"])])
            async with anyio.create_task_group() as tg:
                await tg.start(b.run)
                await log.entered.wait()
                outer.start_soon(submit, [AppendGroup(A, [b"waiting-for-a-slot"])])
                await anyio.wait_all_tasks_blocked()
                tg.cancel_scope.cancel()  # the flusher dies (here: cancelled)
    assert b.state is BatcherState.FAILED
    assert sorted(type(f).__name__ for f in failures) == ["CommitInDoubt", "Unavailable"]
    with pytest.raises(Unavailable):
        await b.submit([AppendGroup(A, [b"after"])])


async def test_a_waiter_whose_take_by_passes_in_the_buffer_is_answered_expired_unwritten(
) -> None:
    """A forwarded waiter still buffered at its take-by time is in no flush: it is
    answered ForwardExpired at once (while the only slot is still busy), and the flush
    that later takes the buffer holds only the others."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_inflight_flushes=1)
    got: dict[str, list[AppendResult | LlogError]] = {}
    expired_answered = anyio.Event()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(b.run)

            async def enqueue(name: str, groups: list[AppendGroup],
                              take_by: float | None) -> None:
                got[name] = await b.enqueue(groups, take_by=take_by)
                if name == "expired":
                    expired_answered.set()

            tg.start_soon(enqueue, "first", [AppendGroup(A, [b"first"])], None)
            await log.entered.wait()  # the only slot is busy: what follows is buffered
            tg.start_soon(enqueue, "patient", [AppendGroup(A, [b"patient"])],
                          time.monotonic() + 3600)
            tg.start_soon(enqueue, "expired", [AppendGroup(A, [b"x"]), AppendGroup(B, [b"y"])],
                          time.monotonic())
            tg.start_soon(enqueue, "plain", [AppendGroup(B, [b"plain"])], None)
            await expired_answered.wait()
            assert len(log.calls) == 1  # answered before any flush took it
            assert b.statistics().buffered_bytes == len(b"patient") + len(b"plain")
            log.release.set()
            await anyio.wait_all_tasks_blocked()
            b.close()
    flushed = [bytes(r) for call in log.calls for g in call for r in g.records]  # type: ignore[arg-type]
    assert flushed == [b"first", b"patient", b"plain"]
    assert len(got["expired"]) == 2
    for outcome in got["expired"]:
        assert isinstance(outcome, ForwardExpired)
        assert outcome.retriable and not outcome.maybe_written
        assert outcome.error_type == "ForwardExpired"
    assert isinstance(got["patient"][0], AppendResult)
    assert isinstance(got["plain"][0], AppendResult)


async def test_a_take_by_that_passes_while_the_window_is_open_is_never_flushed() -> None:
    """Checked again when a flush takes the buffer: a waiter past its take-by time is
    left out even if its own timer has not fired yet; a buffer of only such waiters
    makes no flush at all."""
    log = FakeLog()
    b = batcher(log, max_delay_s=60)  # only close() makes this flush
    got: list[list[AppendResult | LlogError]] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(b.run)

            async def enqueue() -> None:
                got.append(await b.enqueue([AppendGroup(A, [b"late"])],
                                           take_by=time.monotonic() - 1))

            tg.start_soon(enqueue)
            await anyio.wait_all_tasks_blocked()
            b.close()
    assert log.calls == []
    assert len(got) == 1 and isinstance(got[0][0], ForwardExpired)


async def test_submit_is_enqueue_without_a_deadline() -> None:
    log = FakeLog()
    b = batcher(log, max_delay_s=0)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        (outcome,) = await b.enqueue([AppendGroup(A, [b"x"])], take_by=None)
        assert isinstance(outcome, AppendResult)
        (outcome,) = await b.enqueue([AppendGroup(A, [b"y"])],
                                     take_by=time.monotonic() + 3600)
        assert isinstance(outcome, AppendResult) and outcome.start_offset == 2
        b.close()
    with pytest.raises(ShuttingDown):
        await b.enqueue([AppendGroup(A, [b"late"])], take_by=time.monotonic() + 3600)


async def _flushes(log: FakeLog, n: int) -> None:
    """Until ``n`` flushes have started (each is held in the fake append)."""
    with anyio.fail_after(5):
        while len(log.calls) < n:
            await anyio.wait_all_tasks_blocked()


async def _one_in_flight_one_buffered(tg: anyio.abc.TaskGroup, b: Batcher, log: FakeLog
                                      ) -> None:
    tg.start_soon(b.submit, [AppendGroup(A, [b"x"])])
    with anyio.fail_after(5):
        await log.entered.wait()
    tg.start_soon(b.submit, [AppendGroup(B, [b"y"])])


async def test_a_batch_below_the_size_threshold_waits_for_the_eager_flush() -> None:
    """Four slots, one eager flush: a second small batch waits for the first flush to
    finish instead of taking a slot, so it grows; a full batch goes on a free slot."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_bytes=100, max_inflight_flushes=4, eager_flushes=1)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        tg.start_soon(b.submit, [AppendGroup(A, [b"x" * 10])])
        with anyio.fail_after(5):
            await log.entered.wait()
        tg.start_soon(b.submit, [AppendGroup(A, [b"y" * 10])])
        tg.start_soon(b.submit, [AppendGroup(B, [b"z" * 10])])
        await anyio.wait_all_tasks_blocked()
        assert len(log.calls) == 1  # held: one small flush is in flight
        assert b.statistics().buffered_bytes == 20
        tg.start_soon(b.submit, [AppendGroup(B, [b"w" * 80])])  # the batch is full now
        await _flushes(log, 2)
        assert [len(c) for c in log.calls] == [1, 3]
        b.close()
        log.release.set()


async def test_without_eager_flushes_every_slot_takes_a_small_batch() -> None:
    """The unpaced batcher (eager_flushes left out: every slot), as the forward lanes."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_bytes=100, max_inflight_flushes=2)
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        await _one_in_flight_one_buffered(tg, b, log)
        await _flushes(log, 2)
        b.close()
        log.release.set()


async def test_a_wider_share_lets_a_held_batch_go() -> None:
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_bytes=100, max_inflight_flushes=4, eager_flushes=2)
    b.pace(2)  # two members: one eager flush each
    async with anyio.create_task_group() as tg:
        await tg.start(b.run)
        await _one_in_flight_one_buffered(tg, b, log)
        await anyio.wait_all_tasks_blocked()
        assert len(log.calls) == 1
        b.pace(1)  # the other member left
        await _flushes(log, 2)
        b.close()
        log.release.set()


@pytest.mark.parametrize(("share", "inflight", "last_start", "now", "held"), [
    (1.0, 0, 0.0, 0.0, 0.0),          # a budget of one, nothing in flight: go
    (1.0, 1, 0.0, 0.0, float("inf")),  # ... one in flight: wait for it
    (2.0, 1, 0.0, 0.0, 0.0),
    (0.5, 1, 0.0, 0.0, float("inf")),  # a fraction: one at a time
    (0.5, 0, 10.0, 10.05, 0.15),       # ... and starts 0.1 / 0.5 = 0.2 s apart
    (0.5, 0, 10.0, 10.3, -0.1),
    (0.01, 0, 10.0, 10.0, 0.25),       # never more than MAX_SPACING_S
])
def test_paced_for(share: float, inflight: int, last_start: float, now: float,
                   held: float) -> None:
    assert paced_for(share, inflight, 0.1, last_start, now) == pytest.approx(held)


async def _forwarded(b: Batcher, got: dict[str, list[AppendResult | LlogError]], name: str,
                     claim: ClaimFn | None, window: float | None = None) -> None:
    """Enqueue a group named ``name`` as a forwarded one (taken by an hour from now,
    with ``claim`` and commit window ``window``), its outcomes put in ``got``."""
    got[name] = await b.enqueue([AppendGroup(A, [name.encode()])],
                                take_by=time.monotonic() + 3600, claim=claim,
                                commit_within_s=window)


@contextlib.asynccontextmanager
async def _one_slot_held(b: Batcher, log: FakeLog,
                         got: dict[str, list[AppendResult | LlogError]]
                         ) -> AsyncIterator[anyio.abc.TaskGroup]:
    """``b`` running, its only flush slot taken by a group named "first" that ``log``
    holds: what the body enqueues is buffered for the next flush."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(b.run)
            tg.start_soon(_forwarded, b, got, "first", None)
            await log.entered.wait()
            yield tg


async def test_a_flush_makes_its_waiters_claims_before_it_writes_and_leaves_the_losers(
) -> None:
    """Forwarded waiters carry a claim (their frame's fence): the flush that takes them
    makes every claim before it writes; a waiter whose claim fails is answered
    ForwardExpired, unwritten, and the rest of the flush is written without it."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_inflight_flushes=1)
    claims: list[tuple[str, int]] = []  # each claim, and the flushes written before it
    got: dict[str, list[AppendResult | LlogError]] = {}

    def claim(name: str, wins: bool):  # type: ignore[no-untyped-def]
        async def make() -> bool:
            claims.append((name, len(log.calls)))
            return wins
        return make

    async with _one_slot_held(b, log, got) as tg:
        tg.start_soon(_forwarded, b, got, "won", claim("won", True))
        tg.start_soon(_forwarded, b, got, "lost", claim("lost", False))
        tg.start_soon(_forwarded, b, got, "plain", None)
        await anyio.wait_all_tasks_blocked()
        log.hold = False
        log.release.set()
        await anyio.wait_all_tasks_blocked()
        # A flush whose every waiter loses its claim writes nothing at all.
        tg.start_soon(_forwarded, b, got, "alone", claim("alone", False))
        await anyio.wait_all_tasks_blocked()
        b.close()
    assert sorted(claims) == [("alone", 2), ("lost", 1), ("won", 1)]
    flushed = [[bytes(r) for g in call for r in g.records] for call in log.calls]  # type: ignore[arg-type]
    assert flushed == [[b"first"], [b"won", b"plain"]]
    for name in ("lost", "alone"):
        (outcome,) = got[name]
        assert isinstance(outcome, ForwardExpired) and not outcome.maybe_written
    assert [type(got[n][0]) for n in ("first", "won", "plain")] == [AppendResult] * 3
    assert b.statistics().inflight_bytes == 0  # the losers' bytes were given back


async def test_a_won_claim_opens_its_groups_commit_window_from_before_the_claim() -> None:
    """A forwarded waiter with a commit window gets ``commit_by``: the window from just
    before its flush sent the claims (never later than the claim itself began), so the
    forwarding broker, which counts from after it found the claim landed, waits longer.
    The other groups of the flush get none; a waiter whose window was over by the time
    its claim was won leaves the flush, answered ForwardExpired, unwritten."""
    log = FakeLog()
    log.hold = True
    b = batcher(log, max_delay_s=0, max_inflight_flushes=1)
    claimed_at: list[float] = []
    got: dict[str, list[AppendResult | LlogError]] = {}

    async def claim() -> bool:
        claimed_at.append(time.monotonic())
        return True

    async with _one_slot_held(b, log, got) as tg:
        tg.start_soon(_forwarded, b, got, "local", None)
        tg.start_soon(_forwarded, b, got, "forwarded", claim, 30.0)
        tg.start_soon(_forwarded, b, got, "no time", claim, 0.0)
        await anyio.wait_all_tasks_blocked()
        released = time.monotonic()
        log.hold = False
        log.release.set()
        await anyio.wait_all_tasks_blocked()
        b.close()
    flushed = {bytes(g.records[0]): g.commit_by for g in log.calls[1]}  # type: ignore[arg-type]
    assert set(flushed) == {b"local", b"forwarded"}
    assert flushed[b"local"] is None
    commit_by = flushed[b"forwarded"]
    assert commit_by is not None and released + 30 <= commit_by <= min(claimed_at) + 30
    assert isinstance(got["forwarded"][0], AppendResult)
    (late,) = got["no time"]
    assert isinstance(late, ForwardExpired) and not late.maybe_written
