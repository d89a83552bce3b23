"""Consume with long-poll: tail cache first, the log reader on a miss, wait for writes.

A request answers once the records gathered reach ``min_bytes``, or when ``max_wait``
has passed. It registers its wake-up *before* its first look, so a write that lands
between a look and the wait still wakes it; between looks it sleeps on a
:class:`~app.broker.watch.Waiter` that the batcher (own writes) and the Oxia change
listener (everyone else's) wake, so a hot tail is served from memory without polling
Oxia or S3.

The total byte budget is applied while reading, in request order: each partition gets
what the ones before it left, and only the first record of the whole answer may exceed
it (so a consumer is never stuck on one large record).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from app.broker.answer_budget import AnswerBudget
from app.broker.answering import AnswerHold
from app.broker.metrics import ConsumeMetrics
from app.broker.watch import Generation, PartitionWatch
from app.errors import LlogError, OffsetOutOfRange
from app.storage import runs
from app.storage.keys import TopicPartition
from app.storage.reader import LogReader, ReadOutcome, ReadRequest, ReadResult
from app.tailcache import CacheHit, TailCache, run_cache_read, run_cache_write

# Bounds the work one partition can cause in one response, whatever the byte budget.
MAX_RECORDS_PER_PARTITION = 50_000


@dataclass(frozen=True)
class Fetch:
    tp: TopicPartition
    offset: int
    partition_max_bytes: int | None = None
    # The log start its caller read in choosing ``offset`` ("earliest", "latest"): the
    # tail cache learns it before it answers, and the answer says no older one.
    log_start: int | None = None


@dataclass(frozen=True)
class ConsumeStats:
    long_polls: int
    long_poll_slots: int
    streams: int
    stream_slots: int


class ConsumeService:
    def __init__(
        self,
        reader: LogReader,
        cache: TailCache | None,
        watch: PartitionWatch,
        metrics: ConsumeMetrics,
        *,
        answers: AnswerBudget,
        max_long_polls: int,
        max_streams: int = 100,
    ) -> None:
        self._reader = reader
        # The process's answer budget, which the looks of a request given an
        # AnswerHold reserve through (app/broker/answering.py).
        self.answers = answers
        self._cache = cache
        self._watch = watch
        self._metrics = metrics
        self._long_polls = anyio.CapacityLimiter(max_long_polls)
        # Open event streams (GET /topics/{topic}/stream), which wait without a long-poll
        # slot: their own limit bounds them.
        self.stream_slots = anyio.CapacityLimiter(max_streams)
        self._released = False

    def release(self) -> None:
        """Answer every parked long-poll now, and wait for none from here on (the broker
        is draining: consumers should move on to another broker)."""
        self._released = True
        self._watch.wake_all()

    def statistics(self) -> ConsumeStats:
        return ConsumeStats(int(self._long_polls.borrowed_tokens),
                            int(self._long_polls.total_tokens),
                            int(self.stream_slots.borrowed_tokens),
                            int(self.stream_slots.total_tokens))

    @property
    def released(self) -> bool:
        return self._released

    def answer(self, factor: float) -> AnswerHold:
        """A new answer's (empty) hold on the answer budget; release it once the answer
        has been sent."""
        return AnswerHold(self.answers.reservation(), factor)

    async def consume(
        self, fetches: Sequence[Fetch], *, max_wait_s: float, min_bytes: int, max_bytes: int,
        slot: bool = True, hold: AnswerHold | None = None,
    ) -> list[ReadOutcome]:
        """Answer a consume request; waits up to ``max_wait_s`` for ``min_bytes``.

        When every long-poll slot is taken, the request is answered without waiting
        rather than refused: the client simply polls again. ``slot=False`` waits without
        one: streams, which their own limit bounds. With ``hold``, each look reserves
        its room in the answer budget through it, and afterwards it holds what the
        outcomes do (anything it held before is given back first: a stream's previous
        batch has been sent); raises :class:`~app.errors.Unavailable` when the budget
        has no room for a look within its wait.
        """
        if hold is not None:
            hold.release()
        starts = [(f.tp, f.log_start) for f in fetches if f.log_start is not None]
        if starts and self._cache is not None:
            await run_cache_write(self._cache, _note_all, self._cache, [], starts)
        deadline = time.monotonic() + max_wait_s
        with self._watch.watching([f.tp for f in fetches]) as waiter:
            outcomes = await self._look(fetches, max_bytes, hold)
            if max_wait_s <= 0 or self._released or _enough(outcomes, min_bytes):
                return outcomes
            try:
                if slot:
                    self._long_polls.acquire_nowait()
            except anyio.WouldBlock:
                self._metrics.long_polls_refused.inc()
                return outcomes
            try:
                while (remaining := deadline - time.monotonic()) > 0:
                    with anyio.move_on_after(remaining):
                        await waiter.wait()
                    waiter.arm()  # before the look: a write landing during it wakes us
                    self._metrics.long_poll_wakeups.inc()
                    outcomes = await self._look(fetches, max_bytes, hold)
                    if self._released or _enough(outcomes, min_bytes):
                        break
                return outcomes
            finally:
                if slot:
                    self._long_polls.release()

    async def _look(self, fetches: Sequence[Fetch], max_bytes: int,
                    hold: AnswerHold | None) -> list[ReadOutcome]:
        if hold is None:
            return await self._look_now(fetches, max_bytes)
        await hold.reserve_to_read(max_bytes)
        outcomes = await self._look_now(fetches, max_bytes)
        hold.keep(outcomes)
        return outcomes

    async def _look_now(self, fetches: Sequence[Fetch], max_bytes: int
                        ) -> list[ReadOutcome]:
        # The watch's clock first, before any look at the cache or the log: a remote
        # change reported from here on keeps its partition stale.
        since = self._watch.generation()
        outcomes: list[ReadOutcome | None] = [None] * len(fetches)
        # Stale before the lookup too: a cache that looks up in a worker thread may have
        # answered from before a read that, meanwhile, taught it a new log start and
        # made the partition fresh.
        stale = {f.tp for f in fetches if self._watch.is_stale(f.tp)}
        hits = await self._cache_lookup(fetches, max_bytes)
        used = 0
        misses: list[int] = []
        for i, (f, hit) in enumerate(zip(fetches, hits, strict=True)):
            if hit is not None and (f.tp in stale or self._watch.is_stale(f.tp)):
                # Another process changed the partition (appended, or moved its log
                # start): the cache may miss records or hold ones no longer readable.
                hit = None
            if hit is None:
                self._metrics.cache.labels("miss").inc()
                misses.append(i)
                continue
            self._metrics.cache.labels("hit" if hit.records else "tail").inc()
            kept = runs.within(hit.records, max_bytes - used, first_of_answer=used == 0)
            used += runs.records_bytes(kept)
            if len(kept) == len(hit.records):
                next_offset = hit.next_offset
            else:
                next_offset = runs.next_offset(kept) or f.offset  # a hit is never at 0
            outcomes[i] = ReadResult(f.tp, kept, hit.high_watermark, next_offset,
                                     hit.append_times[:len(kept)], log_start=hit.log_start)
        if misses:
            await self._read_misses(fetches, misses, since, outcomes,
                                    max(0, max_bytes - used), first_of_answer=used == 0)
        return [o for o in outcomes if o is not None]

    async def _read_misses(self, fetches: Sequence[Fetch], misses: list[int],
                           since: Generation, outcomes: list[ReadOutcome | None],
                           budget: int, *, first_of_answer: bool) -> None:
        """Read the partitions the cache could not answer; tell the cache the high
        watermarks read, and then the watch which partitions are up to date.

        A partition is up to date (fresh) only when the read saw the log after ``since``
        was captured: a read planned from a lookup made ahead (``looked_up_ahead``) may
        rest on a control record read before it, and a remote commit reported between
        the two would be taken as seen, leaving a long-poll at its offset answered
        "nothing yet" from the cache until some later write. Such reads only happen
        below the tail, where freshness saves nothing: the read that reaches the tail
        reads the control record itself, and that one marks the partition fresh. And
        the cache learns the high watermark *before* the partition turns fresh: the
        other way round, a look in between (the file cache notes in a worker thread)
        would trust the older one.
        """
        # Offset 0 goes to the read as it is: the log start, found in the same read of
        # the control record as the records (one rule, app/storage/reader.py).
        requests = [ReadRequest(fetches[i].tp, fetches[i].offset,
                                MAX_RECORDS_PER_PARTITION, fetches[i].partition_max_bytes)
                    for i in misses]
        results = await self._reader.read_many(requests, max_bytes=budget,
                                               oversized_first=first_of_answer)
        learned: list[tuple[TopicPartition, int, int]] = []
        starts: list[tuple[TopicPartition, int]] = []
        fresh: list[TopicPartition] = []
        for i, result in zip(misses, results, strict=True):
            read_start = fetches[i].log_start
            if isinstance(result, ReadResult) and read_start is not None \
                    and result.log_start < read_start:
                # A control record reused from a moment ago (a compacted entry's, one
                # looked up ahead): its records begin at the start the caller read.
                result = dataclasses.replace(result, log_start=read_start)
            outcomes[i] = result
            if isinstance(result, ReadResult):
                learned.append((fetches[i].tp, result.high_watermark, result.log_start))
                if not result.looked_up_ahead:
                    fresh.append(fetches[i].tp)
            elif isinstance(result, OffsetOutOfRange) and result.log_start is not None:
                starts.append((fetches[i].tp, result.log_start))
        if self._cache is not None and (learned or starts):
            await run_cache_write(self._cache, _note_all, self._cache, learned, starts)
        for tp in fresh:
            self._watch.refreshed(tp, since)

    async def _cache_lookup(self, fetches: Sequence[Fetch], max_bytes: int
                            ) -> list[CacheHit | None]:
        if self._cache is None:
            return [None] * len(fetches)
        return await run_cache_read(self._cache, _lookup_all, self._cache, fetches, max_bytes)


def _lookup_all(cache: TailCache, fetches: Sequence[Fetch], max_bytes: int
                ) -> list[CacheHit | None]:
    # The cache does not know the log start: offset 0 (it) is always read from the log.
    return [None if f.offset == 0 else
            cache.get(f.tp, f.offset, MAX_RECORDS_PER_PARTITION,
                      min(f.partition_max_bytes or max_bytes, max_bytes)) for f in fetches]


def _note_all(cache: TailCache, learned: list[tuple[TopicPartition, int, int]],
              starts: list[tuple[TopicPartition, int]]) -> None:
    """What reads of the log showed, before any partition turns fresh: the log start
    first (a cache never answers below the start a read of this process saw, so a
    record retention or a delete removed is not served again), then the high
    watermark."""
    for tp, log_start in starts:
        cache.note_log_start(tp, log_start)
    for tp, hw, log_start in learned:
        cache.note_log_start(tp, log_start)
        cache.note_high_watermark(tp, hw)


def _enough(outcomes: Sequence[ReadOutcome], min_bytes: int) -> bool:
    if all(isinstance(o, LlogError) for o in outcomes):
        return True  # nothing to wait for
    # A record counts at least one byte, so an empty record still satisfies min_bytes=1.
    gathered = sum(runs.counted_bytes(o.records) for o in outcomes if isinstance(o, ReadResult))
    return gathered >= min_bytes
