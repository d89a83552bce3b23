"""What a consumer has fetched and not yet handed to its program, and where it fetches
next: free of I/O and of threads (the sync consumer holds its lock around every call).

The answers wait in a queue bounded in bytes: the next fetch is asked for only while
the answers waiting hold less than ``prefetch_bytes``, so at most ``prefetch_bytes``
plus one answer wait at any time. A seek, or a partition lost or gained in a
rebalance, gives the partition a new tag: what was fetched for its old tag, waiting or
still in flight, is dropped when it would be handed out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import count

from llog_client._errors import LlogError, OffsetOutOfRange, UnexpectedResponse
from llog_client._fetcher import Results, partition_error
from llog_client._models import Resume, TopicPartitionKey
from llog_client._records import PartitionBatch

Key = TopicPartitionKey
MAX_PARTITIONS = 1000  # a request's partitions: LLOG_MAX_PARTITIONS_PER_REQUEST's default


@dataclass(frozen=True)
class Plan:
    """The partitions of one request, their positions and their tags then."""

    positions: list[tuple[Key, Resume]]
    tags: list[int]


@dataclass
class Arrived:
    batches: list[PartitionBatch]
    nbytes: int


class Prefetch:
    def __init__(self, *, prefetch_bytes: int, reset: Resume, follow: bool,
                 attempts: int) -> None:
        self.prefetch_bytes = prefetch_bytes
        self.attempts = attempts  # a partition's retriable error is told after these
        self.reset = reset  # where a partition out of range starts again
        self.follow = follow
        self.at: dict[Key, Resume] = {}  # where the next fetch reads each partition
        self.tags: dict[Key, int] = {}
        self.ended: set[Key] = set()  # follow off: partitions read to their end
        self.failures: dict[Key, int] = {}  # retriable errors in a row, by partition
        self.queue: deque[Arrived | LlogError] = deque()
        self.buffered = 0  # bytes of the answers waiting
        self.max_buffered = 0
        self.max_answer = 0  # the largest answer yet: the bound is prefetch_bytes + one
        self.fetches = 0
        self._tag = count(1)
        self._turn = 0

    # -- where to read ----------------------------------------------------------------

    def assign(self, keys: Iterable[Key], start: Resume) -> None:
        """Read exactly ``keys``: partitions kept go on where they were; new ones start
        at ``start``; the others are dropped."""
        wanted = dict.fromkeys(keys)
        for key in [k for k in self.at if k not in wanted]:
            del self.at[key], self.tags[key]
            self.ended.discard(key)
            self.failures.pop(key, None)
        for key in wanted:
            if key not in self.at:
                self.seek(key, start)

    def seek(self, key: Key, position: Resume) -> None:
        self.at[key] = position
        self.tags[key] = next(self._tag)
        self.ended.discard(key)

    def clear(self) -> None:
        self.assign((), "earliest")
        self.drop_waiting()

    def drop_waiting(self) -> None:
        self.queue.clear()
        self.buffered = 0

    # -- fetching ---------------------------------------------------------------------

    def plan(self) -> Plan | None:
        """The next request, unless the queue is full, an error waits to be seen, or
        nothing is left to read. The partitions take turns at the head of the list (the
        broker fills the answer's budget in request order)."""
        if self.buffered >= self.prefetch_bytes or any(
                isinstance(item, LlogError) for item in self.queue):
            return None
        keys = [k for k in self.at if k not in self.ended]
        if not keys:
            return None
        # More partitions than a request may name: a window of them, moving on by its
        # width each time.
        step = MAX_PARTITIONS if len(keys) > MAX_PARTITIONS else 1
        self._turn = (self._turn + step) % len(keys)
        keys = (keys[self._turn:] + keys[:self._turn])[:MAX_PARTITIONS]
        return Plan([(k, self.at[k]) for k in keys], [self.tags[k] for k in keys])

    def answered(self, plan: Plan, results: Results, nbytes: int) -> int:
        """Move each partition on, queue its records, and queue the errors worth
        telling the program: an offset out of range starts the partition again at
        ``reset``; a retriable error is tried again by the next fetches, and told once
        it failed ``attempts`` times in a row. How many times the worst of those failed
        when the answer brought no records (the worker pauses before the next fetch),
        else 0."""
        self.fetches += 1
        self.max_answer = max(self.max_answer, nbytes)
        if len(results) != len(plan.positions):
            raise UnexpectedResponse(f"the answer has {len(results)} results for "
                            f"{len(plan.positions)} partitions")
        batches: list[PartitionBatch] = []
        for ((key, _), tag), result in zip(zip(plan.positions, plan.tags, strict=True),
                                          results, strict=True):
            if self.tags.get(key) != tag:
                continue  # sought or lost while the request was out
            if isinstance(result, PartitionBatch):
                self.failures.pop(key, None)
                self.at[key] = result.next_offset
                if not self.follow and result.at_end:
                    self.ended.add(key)
                if len(result):
                    result.tag = tag
                    batches.append(result)
            else:
                self._failed(key, partition_error(result))
        if batches:
            self._put(Arrived(batches, nbytes), nbytes)
            return 0
        return max((self.failures.get(k, 0) for k, _ in plan.positions), default=0)

    def _failed(self, key: Key, error: LlogError) -> None:
        if isinstance(error, OffsetOutOfRange):
            self.seek(key, self.reset)
            return
        failed = self.failures[key] = self.failures.get(key, 0) + 1
        if not error.retriable or failed >= self.attempts:
            del self.failures[key]
            self._put(error, 0)

    def failed(self, error: LlogError) -> None:
        """A request failed (after its retries): the program sees it on its next poll,
        and the next fetch waits until it did."""
        self._put(error, 0)

    def _put(self, item: Arrived | LlogError, nbytes: int) -> None:
        self.queue.append(item)
        self.buffered += nbytes
        self.max_buffered = max(self.max_buffered, self.buffered)

    # -- handing out ------------------------------------------------------------------

    def take(self) -> list[PartitionBatch] | LlogError | None:
        """The next answer's batches still current (an error the worker met, to raise),
        or None when nothing waits."""
        while self.queue:
            item = self.queue.popleft()
            if isinstance(item, LlogError):
                return item
            self.buffered -= item.nbytes
            current = [b for b in item.batches if self.tags.get(b.key) == b.tag]
            if current:
                return current
        return None

    def current(self, batch: PartitionBatch) -> bool:
        return self.tags.get(batch.key) == batch.tag

    @property
    def finished(self) -> bool:
        """Not following, and every partition was read to its end and handed out."""
        return not self.follow and not self.queue and self.ended.issuperset(self.at)
