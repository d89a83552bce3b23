"""Consume with long-poll: tail cache first, the log reader on a miss, wait for writes.

A request answers once the records gathered reach ``min_bytes``, or when ``max_wait``
has passed. Between looks it sleeps on a :class:`~app.broker.watch.Waiter` that the
batcher (own writes) and the Oxia change listener (everyone else's) wake, so a hot tail
is served from memory without polling Oxia or S3.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from app.broker.metrics import ConsumeMetrics
from app.broker.watch import PartitionWatch
from app.errors import LlogError
from app.storage.keys import TopicPartition
from app.storage.reader import LogReader, ReadRequest, ReadResult
from app.tailcache import CacheHit, TailCache, run_cache_io

# Bounds the work one partition can cause in one response, whatever the byte budget.
MAX_RECORDS_PER_PARTITION = 50_000


@dataclass(frozen=True)
class Fetch:
    tp: TopicPartition
    offset: int
    partition_max_bytes: int | None = None


Outcome = ReadResult | LlogError


class ConsumeService:
    def __init__(
        self,
        reader: LogReader,
        cache: TailCache | None,
        watch: PartitionWatch,
        metrics: ConsumeMetrics,
        *,
        max_long_polls: int,
    ) -> None:
        self._reader = reader
        self._cache = cache
        self._watch = watch
        self._metrics = metrics
        self._long_polls = anyio.CapacityLimiter(max_long_polls)

    @property
    def long_polls(self) -> int:
        return int(self._long_polls.borrowed_tokens)

    async def consume(
        self, fetches: Sequence[Fetch], *, max_wait_s: float, min_bytes: int, max_bytes: int
    ) -> list[Outcome]:
        """Answer a consume request; waits up to ``max_wait_s`` for ``min_bytes``.

        When every long-poll slot is taken, the request is answered without waiting
        rather than refused: the client simply polls again.
        """
        outcomes = await self._look(fetches, max_bytes)
        if max_wait_s <= 0 or self._enough(outcomes, min_bytes):
            return outcomes
        try:
            self._long_polls.acquire_nowait()
        except anyio.WouldBlock:
            self._metrics.long_polls_refused.inc()
            return outcomes
        try:
            deadline = time.monotonic() + max_wait_s
            with self._watch.watching([f.tp for f in fetches]) as waiter:
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return outcomes
                    with anyio.move_on_after(remaining):
                        await waiter.wait()
                    waiter.arm()
                    self._metrics.long_poll_wakeups.inc()
                    outcomes = await self._look(fetches, max_bytes)
                    if self._enough(outcomes, min_bytes):
                        return outcomes
        finally:
            self._long_polls.release()

    @staticmethod
    def _enough(outcomes: Sequence[Outcome], min_bytes: int) -> bool:
        if all(isinstance(o, LlogError) for o in outcomes):
            return True  # nothing to wait for
        # A record counts at least one byte, so an empty record still satisfies min_bytes=1.
        gathered = sum(max(len(v), 1) for o in outcomes if isinstance(o, ReadResult)
                       for _, v in o.records)
        return gathered >= min_bytes

    async def _look(self, fetches: Sequence[Fetch], max_bytes: int) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(fetches)
        misses: list[tuple[int, ReadRequest]] = []
        hits = (await run_cache_io(self._cache, self._cache_lookup, fetches, max_bytes)
                if self._cache is not None else [None] * len(fetches))
        for i, (f, hit) in enumerate(zip(fetches, hits, strict=True)):
            if hit is not None and not hit.records and self._watch.is_stale(f.tp):
                hit = None  # "known empty" is not trustworthy after a remote write
            if hit is not None:
                self._metrics.cache.labels("hit" if hit.records else "tail").inc()
                outcomes[i] = ReadResult(f.tp, hit.records, hit.high_watermark,
                                         hit.next_offset)
            else:
                self._metrics.cache.labels("miss").inc()
                limit = min(f.partition_max_bytes or max_bytes, max_bytes)
                misses.append((i, ReadRequest(f.tp, max(f.offset, 1),
                                              MAX_RECORDS_PER_PARTITION, limit)))
        if misses:
            results = await self._reader.read_many([r for _, r in misses])
            learned: list[tuple[TopicPartition, int]] = []
            for (i, request), result in zip(misses, results, strict=True):
                if isinstance(result, LlogError):
                    outcomes[i] = result
                    continue
                self._watch.refreshed(request.tp)
                learned.append((request.tp, result.high_watermark))
                outcomes[i] = result
            if self._cache is not None and learned:
                await run_cache_io(self._cache, self._note_all, learned)
        return _apply_total_budget([o for o in outcomes if o is not None], max_bytes)

    def _cache_lookup(self, fetches: Sequence[Fetch], max_bytes: int) -> list[CacheHit | None]:
        assert self._cache is not None
        return [
            self._cache.get(f.tp, max(f.offset, 1), MAX_RECORDS_PER_PARTITION,
                            min(f.partition_max_bytes or max_bytes, max_bytes))
            for f in fetches
        ]

    def _note_all(self, learned: list[tuple[TopicPartition, int]]) -> None:
        assert self._cache is not None
        for tp, hw in learned:
            self._cache.note_high_watermark(tp, hw)


def _apply_total_budget(outcomes: list[Outcome], max_bytes: int) -> list[Outcome]:
    """Trim to ``max_bytes`` over the whole response, in request order; each partition
    keeps its first record even past the budget, so no consumer is ever stuck."""
    remaining = max_bytes
    out: list[Outcome] = []
    for o in outcomes:
        if isinstance(o, LlogError) or not o.records:
            out.append(o)
            continue
        kept = [o.records[0]]
        remaining -= len(o.records[0][1])
        for offset, value in o.records[1:]:
            if len(value) > remaining:
                break
            kept.append((offset, value))
            remaining -= len(value)
        remaining = max(remaining, 0)
        if len(kept) == len(o.records):
            out.append(o)
        else:
            out.append(ReadResult(o.tp, kept, o.high_watermark, kept[-1][0] + 1))
    return out
