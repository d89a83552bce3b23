"""The Oxia reads of a catch-up consumer's next read, made while this answer is sent.

Every read starts with two Oxia reads at once: the partition's control record and the
first index page from its offset (docs/protocol.md, Read protocol). A consumer catching
up asks for the next offset as soon as it has an answer, so each answer used to wait one
Oxia round trip before anything else. When an answer stops below the high watermark,
those two reads for its next offset are made in the background; the next read of
exactly that offset takes them instead of reading again.

What it takes is what a read that began a moment earlier would have read, which the
protocol allows (a plan found missing objects is planned again from fresh metadata). It
is never taken for a read at the tail: a lookup whose control record shows no records at
that offset is dropped, so a long-poll always sees new commits. Nor when older than
``MAX_AGE_S``.

Bounded: at most ``max_kept`` lookups, in flight or done, are kept; a new one evicts the
oldest. A failed lookup is counted and dropped: the read looks up for itself.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from app.storage.keys import TopicPartition
from app.storage.metadata import Control
from app.stores.oxia.store import Record

log = logging.getLogger(__name__)

MAX_AGE_S = 1.0  # a consumer catching up asks again within milliseconds

Lookup = tuple[Control | None, list[Record] | None]
LookupFn = Callable[[], Awaitable[Lookup]]


@dataclass(frozen=True)
class PlanAheadStats:
    kept: int
    max_kept: int
    started: int
    taken: int
    failed: int
    reused: int = 0  # a read's own lookup kept for the next read (:meth:`keep`)


@dataclass(frozen=True)
class Taken:
    result: Lookup
    started: float  # when its Oxia reads began (the clock of :class:`PlanAhead`)


@dataclass
class _Pending:
    started: float
    done: anyio.Event = field(default_factory=anyio.Event)
    result: Lookup | None = None


class PlanAhead:
    """Background lookups for next reads, in the task group given to :meth:`run_in`
    (none before: a reader without one never looks ahead)."""

    def __init__(self, max_kept: int, *, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.max_kept = max_kept
        self._clock = clock
        self._group: anyio.abc.TaskGroup | None = None
        self._kept: OrderedDict[tuple[TopicPartition, int], _Pending] = OrderedDict()
        self.started = 0
        self.taken = 0
        self.failed = 0
        self.reused = 0

    def run_in(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group

    def statistics(self) -> PlanAheadStats:
        return PlanAheadStats(len(self._kept), self.max_kept, self.started, self.taken,
                              self.failed, self.reused)

    def start(self, tp: TopicPartition, offset: int, lookup: LookupFn) -> bool:
        """Look up ``tp`` at ``offset`` in the background, unless that is already kept;
        whether it started."""
        pending = self._admit((tp, offset), _Pending(self._clock()))
        if pending is None or self._group is None:
            return False
        self.started += 1
        self._group.start_soon(self._run, lookup, pending)
        return True

    def keep(self, tp: TopicPartition, offset: int, lookup: Lookup, started: float
             ) -> bool:
        """Keep a lookup a read made for itself (at ``started``) for the next read of
        ``tp`` at ``offset``: a partition behind others that filled an answer is asked
        again at the same offset, so its own lookup serves that read, as one made ahead
        would, within ``MAX_AGE_S`` of when it was made. Whether it was kept."""
        pending = self._admit((tp, offset), _Pending(started, result=lookup))
        if pending is None:
            return False
        pending.done.set()
        self.reused += 1
        return True

    def _admit(self, key: tuple[TopicPartition, int], pending: _Pending) -> _Pending | None:
        """Keep ``pending`` under ``key`` (the oldest kept out first, within ``max_kept``),
        unless this has no task group, keeps nothing, or already holds the key."""
        if self._group is None or self.max_kept <= 0 or key in self._kept:
            return None
        while len(self._kept) >= self.max_kept:
            self._kept.popitem(last=False)
        self._kept[key] = pending
        return pending

    def now(self) -> float:
        return self._clock()

    async def take(self, tp: TopicPartition, offset: int) -> Taken | None:
        """The lookup made for a read of ``tp`` at ``offset`` and when it began, when
        there is one (waiting for it if under way), it is recent, and it shows records at
        that offset."""
        pending = self._kept.pop((tp, offset), None)
        if pending is None:
            return None
        await pending.done.wait()  # bounded: the lookup's Oxia calls carry deadlines
        if pending.result is None or self._clock() - pending.started > MAX_AGE_S:
            return None
        control = pending.result[0]
        if control is None or control.sequence_counter < offset:
            return None  # at the tail: the read must see commits made since
        self.taken += 1
        return Taken(pending.result, pending.started)

    async def _run(self, lookup: LookupFn, pending: _Pending) -> None:
        try:
            pending.result = await lookup()
        except Exception as exc:  # the read looks up for itself
            self.failed += 1
            log.debug("plan-ahead lookup failed: %s", exc)
        finally:
            pending.done.set()
