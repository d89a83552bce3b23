"""The produce batcher: coalesces concurrent requests into shared-blob flushes.

Requests from many handlers are buffered until ``max_bytes`` are waiting or ``max_delay``
has passed since the first buffered record (``time.monotonic()`` windows); one flush is
one ``append_shared`` of every buffered group, and each request's future gets its own
outcomes back. The buffer is bounded: when full, new work is refused with
:class:`~app.errors.BackPressureRejected` instead of queueing without limit.

A flush waits for a free slot (``max_inflight_flushes``) *before* it takes the buffer,
so under load the buffer keeps filling while the slots are busy and flushes grow instead
of multiplying. Flushes are also *paced*: only ``eager_flushes`` of them may be in flight
for a batch below ``max_bytes``; a batch that is full goes out on any free slot. Each
flush has fixed costs (an object PUT, an Oxia write, CPU) whatever it carries, so at a
given load fewer, larger flushes cost less per record, and on a busy machine they also
answer sooner. Brokers that share the partitions (affinity, docs/operations.md) share one
budget: :meth:`Batcher.pace` gives each a fraction of it, and a fraction below one
spaces flush starts by the recent flush duration divided by it, so N brokers together
flush about as often as one (capped at :data:`MAX_SPACING_S`).

Every outcome is reported as it is: an error in one partition's commit fails only the
groups of that partition, an unexpected error fails only the batch it hit (as
:class:`~app.errors.CommitInDoubt`, since records may have been written), and the
flusher carries on. Only if the flusher loop itself dies does the batcher enter
``FAILED``: every waiter is failed and new work refused, and the broker reports itself
not ready.

Records another broker forwarded come with a *take-by* time (:meth:`Batcher.enqueue`):
if no flush has taken them by then, they leave the buffer unwritten and are answered
:class:`~app.errors.ForwardExpired`, so the forwarding broker may append them itself.
That answer is exact because it is given only to waiters that are in no flush. Their
waiter may also hold a *claim* (the frame's fence, :mod:`app.cluster.fences`): a flush
makes it before it writes anything, and a waiter whose claim fails (the forwarding
broker gave up on it first) leaves that flush unwritten, answered ``ForwardExpired``.
A won claim opens the groups' *commit window*: from just before the claims were sent,
the time within which the control version a commit of theirs expects must have been
read (``AppendGroup.commit_by``, which the writer keeps); past it they are answered
``ForwardExpired`` and never committed, so a client that sends them again once the
forwarding broker (which waits longer than that) answered them in doubt cannot race a
late first copy (docs/protocol.md, Forward fences).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc

from app.batching.metrics import BatcherMetrics
from app.batching.sequence_gate import HOLD_S, SequenceGate
from app.errors import (
    BackPressureRejected,
    CommitInDoubt,
    ForwardExpired,
    LlogError,
    ShuttingDown,
    Unavailable,
)
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult

log = logging.getLogger(__name__)

AppendFn = Callable[[Sequence[AppendGroup]], Awaitable[list[AppendOutcome]]]
# A waiter's claim on being written: True to be flushed, False to be left unwritten.
ClaimFn = Callable[[], Awaitable[bool]]
CommittedFn = Callable[[list[tuple[AppendGroup, AppendResult]]], Awaitable[None]]

# The longest a paced flush start is held back: a bound on the latency pacing may add.
MAX_SPACING_S = 0.25
# Weight of the newest flush in the running mean of flush durations that paces flushes.
_DURATION_WEIGHT = 0.2


class BatcherState(enum.Enum):
    OPEN = "open"          # accepting work
    CLOSING = "closing"    # refusing new work, flushing what is buffered
    CLOSED = "closed"      # every waiter answered, the flusher has returned
    FAILED = "failed"      # the flusher died: every waiter failed, new work refused


def paced_for(share: float, inflight: int, cycle: float, last_start: float,
              now: float) -> float:
    """Seconds a batch below the size threshold is still held back (``inf``: until a
    flush finishes). ``share`` of one or more is a number of flushes in flight; below
    one, flushes go one at a time, starts at least ``cycle / share`` apart (at most
    :data:`MAX_SPACING_S`), where ``cycle`` is how long one flush after another takes
    here: so 1/N of a budget of one flushes 1/N as often as the whole budget would."""
    if share >= 1:
        return 0.0 if inflight < int(share) else math.inf
    if inflight:
        return math.inf
    return last_start + min(cycle / share, MAX_SPACING_S) - now


def _earliest(groups: Sequence[AppendGroup]) -> float | None:
    """The first of a request's groups' commit deadlines, if any."""
    return min((g.commit_by for g in groups if g.commit_by is not None), default=None)


async def _claim(batch: _Batch) -> None:
    """Make the claims of the batch's waiters (at once); those that fail leave it,
    answered unwritten, as do those whose commit window was over by the time their
    claim was won."""
    claimed = [w for w in batch.waiters if w.claim is not None]
    if not claimed:
        return
    won = [False] * len(claimed)
    # Taken before any claim is sent: a forwarding broker that finds its frame taken
    # knows the claim landed before it looked, so a window counted from here ends
    # before the one it counts from then, after which it answers in doubt.
    started = time.monotonic()

    async def one(i: int, claim: ClaimFn) -> None:
        try:
            won[i] = await claim()
        except Exception:  # a claim that cannot say leaves its waiter unwritten
            log.exception("a claim failed unexpectedly; its records are not written")

    async with anyio.create_task_group() as tg:
        for i, waiter in enumerate(claimed):
            assert waiter.claim is not None
            tg.start_soon(one, i, waiter.claim)
    for waiter, ok in zip(claimed, won, strict=True):
        if not ok:
            batch.remove(waiter)
            waiter.unclaimed()
        elif not waiter.open_window(started):
            batch.remove(waiter)
            waiter.window_over()


def _retrieve(future: asyncio.Future[list[AppendOutcome]]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass(eq=False)
class _Waiter:
    """One ``enqueue``: its groups, the future its handler awaits, the monotonic time by
    which a flush must take it (None: no deadline) and the claim a flush makes first."""

    groups: Sequence[AppendGroup]
    size: int
    future: asyncio.Future[list[AppendOutcome]]
    take_by: float | None = None
    claim: ClaimFn | None = None
    # Once its claim is won: the seconds within which a commit of its groups must have
    # read the control version it expects.
    commit_within: float | None = None
    timer: asyncio.TimerHandle | None = None

    def overdue(self, now: float) -> bool:
        return self.take_by is not None and self.take_by <= now

    def expire(self) -> None:
        """Answer a waiter that no flush took in time: it was not written."""
        error = ForwardExpired("the forwarded records waited past their deadline "
                               "for a flush; nothing was written")
        self.resolve([error] * len(self.groups))

    def open_window(self, claimed_at: float) -> bool:
        """Give the groups their ``commit_by``, ``commit_within`` after ``claimed_at``
        (answered ForwardExpired past it); False if that has passed already (the claim
        took longer than the window)."""
        if self.commit_within is None:
            return True
        commit_by = claimed_at + self.commit_within
        if commit_by <= time.monotonic():
            return False
        # A group that came with an earlier deadline of its own keeps it.
        self.groups = [g.due_by(commit_by, ForwardExpired) for g in self.groups]
        return True

    def window_over(self) -> None:
        """Answer a waiter whose commit window ended before its flush wrote anything."""
        error = ForwardExpired("the forwarded records' commit window ended before a flush "
                               "could write them; nothing was written")
        self.resolve([error] * len(self.groups))

    def unclaimed(self) -> None:
        """Answer a waiter whose claim failed: it was not written."""
        error = ForwardExpired("a flush could not claim these forwarded records (the "
                               "forwarding broker gave up on them first, or their fence "
                               "could not be settled); nothing was written")
        self.resolve([error] * len(self.groups))

    def resolve(self, outcomes: list[AppendOutcome]) -> None:
        if not self.future.done():
            self.future.set_result(outcomes)

    def fail(self, error: Callable[[], LlogError]) -> None:
        # A fresh exception per future, so tracebacks never pile up on one object.
        if not self.future.done():
            self.future.set_exception(error())


@dataclass
class _Batch:
    """The waiters of one flush; it owns their fate until every future is resolved."""

    waiters: list[_Waiter] = field(default_factory=list)
    size: int = 0
    started: float = 0.0  # monotonic time of the first buffered record

    def add(self, waiter: _Waiter) -> None:
        if not self.waiters:
            self.started = time.monotonic()
        self.waiters.append(waiter)
        self.size += waiter.size

    def remove(self, waiter: _Waiter) -> bool:
        """Take ``waiter`` out of this batch; False if it is not in it."""
        for i, w in enumerate(self.waiters):
            if w is waiter:
                del self.waiters[i]
                self.size -= waiter.size
                return True
        return False

    def drop_overdue(self) -> None:
        """As a flush takes the batch: answer the waiters past their take-by time (they
        leave unwritten) and stop the timers of those that stay."""
        now = time.monotonic()
        for waiter in [w for w in self.waiters if w.overdue(now)]:
            self.remove(waiter)
            waiter.expire()
        for waiter in self.waiters:
            if waiter.timer is not None:
                waiter.timer.cancel()

    def groups(self) -> list[AppendGroup]:
        return [g for w in self.waiters for g in w.groups]

    def resolve(self, outcomes: Sequence[AppendOutcome]) -> None:
        """Hand each waiter its own outcomes (``outcomes`` follows :meth:`groups`)."""
        i = 0
        for waiter in self.waiters:
            n = len(waiter.groups)
            waiter.resolve(list(outcomes[i:i + n]))
            i += n

    def fail(self, error: Callable[[], LlogError]) -> None:
        for waiter in self.waiters:
            waiter.fail(error)


@dataclass(frozen=True)
class BatcherStats:
    state: str
    buffered_bytes: int
    buffered_waiters: int
    inflight_bytes: int
    inflight_flushes: int


class Batcher:
    def __init__(
        self,
        append: AppendFn,
        *,
        max_bytes: int,
        max_delay_s: float,
        buffer_max_bytes: int,
        max_inflight_flushes: int = 4,
        eager_flushes: float | None = None,
        metrics: BatcherMetrics | None = None,
        on_committed: CommittedFn | None = None,
        sequence_gate: bool = True,
        sequence_hold_s: float = HOLD_S,
    ) -> None:
        self._append = append
        self._max_bytes = max_bytes
        self._max_delay = max_delay_s
        self._buffer_max = buffer_max_bytes
        self._metrics = metrics
        self._on_committed = on_committed
        self._batch = _Batch()
        # A forwarding broker's lanes see part of a producer's requests: only the batcher
        # that commits keeps their order (app/batching/sequence_gate.py).
        self._gate = (SequenceGate(hold_s=sequence_hold_s,
                                   held=None if metrics is None else metrics.sequence_held)
                      if sequence_gate else None)
        self._inflight_bytes = 0
        self._inflight = 0
        self._flush_slots = anyio.Semaphore(max_inflight_flushes)
        self._max_inflight = max_inflight_flushes
        self._eager = float(max_inflight_flushes if eager_flushes is None else eager_flushes)
        self._share = self._eager
        # Running means (s) of how long a flush takes and of how late the flusher takes
        # a batch once nothing holds it back (a busy event loop): one flush after
        # another is their sum, the cycle that paces a share below one.
        self._flush_time = 0.0
        self._lag = 0.0
        self._last_start = self._last_end = -math.inf
        if metrics is not None:
            metrics.eager_share.set(self._share)
        self._wakeup = anyio.Event()
        self._state = BatcherState.OPEN
        self._failure: BaseException | None = None
        self.finished = anyio.Event()  # run() has returned, however it ended

    @property
    def state(self) -> BatcherState:
        return self._state

    def pace(self, members: int) -> None:
        """Share the eager-flush budget with ``members`` processes (self included) that
        append the same partitions' records; 1 takes the whole budget."""
        share = self._eager / max(1, members)
        if share != self._share:
            self._share = share
            if self._metrics is not None:
                self._metrics.eager_share.set(share)
            self._wakeup.set()  # a wider share may let the buffered batch go now

    def statistics(self) -> BatcherStats:
        return BatcherStats(self._state.value, self._batch.size, len(self._batch.waiters),
                            self._inflight_bytes, self._inflight)

    # -- producer side ---------------------------------------------------------------

    async def submit(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """Buffer ``groups`` for the next flush and wait for their outcomes (in order)."""
        return await self.enqueue(groups, take_by=None)

    async def enqueue(self, groups: Sequence[AppendGroup], *, take_by: float | None,
                      claim: ClaimFn | None = None, commit_within_s: float | None = None
                      ) -> list[AppendOutcome]:
        """:meth:`submit`, with a ``time.monotonic()`` deadline for a flush to take the
        groups: still buffered then, they are answered :class:`ForwardExpired` (every
        group) and never flushed. Once taken, they are flushed if ``claim`` (made by the
        flush before it writes) returns True; else they are answered
        :class:`ForwardExpired` too (as when ``claim`` raises). With
        ``commit_within_s``, a won claim gives them that long, from just before the
        claim, to be committed with a control version read in that time
        (``AppendGroup.commit_by``); past it they are answered :class:`ForwardExpired`,
        never committed.

        A producer's request read before the one holding the group ahead of its own
        waits for that one to come in first, briefly (app/batching/sequence_gate.py);
        a forwarded frame (``take_by``) never does."""
        size = sum(g.size for g in groups)
        self._check_room(size)
        gate = self._gate if take_by is None else None
        behind = gate.ahead(groups) if gate is not None else None
        if gate is not None and behind:
            until = _earliest(groups)
            # Flushed and committed before its deadline: the hold ends a window and a
            # flush's usual time earlier.
            margin = self._max_delay + self._flush_time + self._lag
            await gate.hold(behind, None if until is None else until - margin)
            self._check_room(size)
        future: asyncio.Future[list[AppendOutcome]] = (
            asyncio.get_running_loop().create_future())
        # A caller that stopped waiting (cancelled) never reads a failure: mark it read,
        # so shutting down does not log "exception was never retrieved" for each one.
        future.add_done_callback(_retrieve)
        waiter = _Waiter(groups, size, future, take_by, claim, commit_within_s)
        self._batch.add(waiter)
        if self._gate is not None:
            self._gate.took(groups)
        if take_by is not None:
            # Answered at its deadline even while every flush slot is busy, so the
            # forwarding broker need not wait out its own timeout to fall back.
            # (call_later: the loop's clock need not be time.monotonic(), as uvloop's.)
            waiter.timer = asyncio.get_running_loop().call_later(
                max(0.0, take_by - time.monotonic()), self._expire, waiter)
        self._wakeup.set()
        # Shielded: once buffered, the records will be committed whether or not this
        # caller is still waiting (a disconnect must not tear a flush apart).
        return await asyncio.shield(future)

    def _check_room(self, size: int) -> None:
        """Open, and room in the buffer for ``size`` more bytes (else the refusal)."""
        if self._state is BatcherState.FAILED:
            raise Unavailable(f"the produce batcher stopped ({self._failure!r}); "
                              "retry on another broker")
        if self._state is not BatcherState.OPEN:
            raise ShuttingDown("the broker is shutting down; retry on another broker")
        in_use = self._batch.size + self._inflight_bytes
        if in_use + size > self._buffer_max and in_use:
            if self._metrics is not None:
                self._metrics.rejected.inc()
            raise BackPressureRejected(
                f"produce buffer full ({in_use} of {self._buffer_max} bytes in use); "
                "retry shortly")

    def _expire(self, waiter: _Waiter) -> None:
        if self._batch.remove(waiter):  # else a flush took it first: it is written
            waiter.expire()

    def close(self) -> None:
        """Refuse new work, flush what is buffered now, and let :meth:`run` finish."""
        if self._state is BatcherState.OPEN:
            self._state = BatcherState.CLOSING
        if self._gate is not None:
            self._gate.close()  # requests held for a group before theirs: answered now
        self._wakeup.set()

    # -- flusher side ----------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """The flusher loop; returns after :meth:`close` once everything is answered."""
        try:
            await self._run(task_status)
        finally:
            self.finished.set()

    async def _run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    # A slot first: while every slot is busy the buffer keeps growing.
                    await self._flush_slots.acquire()
                    batch = await self._next_batch()
                    if batch is None:
                        self._flush_slots.release()
                        break
                    self._inflight += 1
                    self._inflight_bytes += batch.size
                    tg.start_soon(self._flush, batch)
        except BaseException as exc:
            self._fail_all(exc)
            raise
        if self._state is not BatcherState.FAILED:
            self._state = BatcherState.CLOSED

    async def _next_batch(self) -> _Batch | None:
        while True:
            while not self._batch.waiters:
                if self._state is not BatcherState.OPEN:
                    return None
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
            # Wait out the window and the pace unless the size threshold or shutdown
            # says flush now (a finished flush wakes this up).
            while self._batch.size < self._max_bytes and self._state is BatcherState.OPEN:
                now = time.monotonic()
                remaining = max(self._batch.started + self._max_delay - now,
                                self._paced_for(now))
                if remaining <= 0:
                    self._observe_lag(now)
                    break
                self._wakeup = anyio.Event()
                with anyio.move_on_after(remaining):
                    await self._wakeup.wait()
            batch, self._batch = self._batch, _Batch()
            batch.drop_overdue()
            if batch.waiters:  # else every waiter expired: nothing to flush
                return batch

    def _paced_for(self, now: float) -> float:
        return paced_for(self._share, self._inflight, self._flush_time + self._lag,
                         self._last_start, now)

    def _observe_lag(self, now: float) -> None:
        """How much later than it could have the flusher takes this batch: after its
        window, the previous flush's end and the pace (as the pace stood then)."""
        released = max(self._batch.started + self._max_delay, self._last_end)
        if self._share < 1:
            released = max(released, self._last_start + min(
                (self._flush_time + self._lag) / self._share, MAX_SPACING_S))
        self._lag += _DURATION_WEIGHT * (max(0.0, now - released) - self._lag)

    async def _flush(self, batch: _Batch) -> None:
        """Append the batch and answer every waiter; never raises an ``Exception``."""
        started = self._last_start = time.monotonic()
        taken_bytes = batch.size
        groups: list[AppendGroup] = []
        try:
            await _claim(batch)
            groups = batch.groups()
            if not groups:
                return  # every waiter's claim failed: nothing to write
            outcomes = await self._append(groups)
            if len(outcomes) != len(groups):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(groups)} groups")
            await self._report_committed(groups, outcomes)
            batch.resolve(outcomes)
            if self._metrics is not None:
                partitions = len({g.tp for g in groups})
                self._metrics.observe_flush(batch.size, len(batch.waiters), partitions,
                                            time.monotonic() - started)
        except LlogError as exc:  # refused as a whole before anything was written
            batch.resolve([exc] * len(groups))
        except Exception as exc:
            log.exception("a flush failed unexpectedly")
            reason = f"the flush failed unexpectedly: {exc!r}"
            batch.fail(lambda: CommitInDoubt(reason))
        except BaseException:  # cancelled: the broker is going away
            batch.fail(lambda: CommitInDoubt("the broker stopped while flushing; the "
                                             "records may have been written"))
            raise
        finally:
            self._last_end = time.monotonic()
            self._flush_time += _DURATION_WEIGHT * (self._last_end - started
                                                    - self._flush_time)
            self._inflight -= 1
            self._inflight_bytes -= taken_bytes
            self._flush_slots.release()
            self._wakeup.set()  # a paced batch may go now

    async def _report_committed(self, groups: list[AppendGroup],
                                outcomes: Sequence[AppendOutcome]) -> None:
        """Tell the broker what committed before the waiters hear back, so a consumer
        they wake finds the records; a failure here never fails committed records."""
        if self._on_committed is None:
            return
        committed = [(g, o) for g, o in zip(groups, outcomes, strict=True)
                     if isinstance(o, AppendResult) and not o.duplicate]
        if not committed:
            return
        try:
            await self._on_committed(committed)
        except Exception:
            log.exception("reporting committed records failed (they are committed)")

    def _fail_all(self, exc: BaseException) -> None:
        self._state = BatcherState.FAILED
        self._failure = exc
        if self._gate is not None:
            self._gate.close()
        self._batch.fail(lambda: Unavailable(f"the produce batcher stopped: {exc!r}"))
        self._batch = _Batch()
