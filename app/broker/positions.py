"""Where partitions start and end: offset lookups, and the named positions "earliest"
and "latest" resolved to offsets, in one place for ``POST /offsets``, ``POST /consume``
and the event stream."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from app.broker import roles
from app.broker.answer_budget import AnswerBudget
from app.broker.answering import READ_FACTOR
from app.broker.topic_view import TopicDirectory
from app.errors import LlogError, PayloadTooLarge
from app.storage import log_positions as storage_offsets
from app.storage.keys import TopicPartition
from app.storage.log_positions import PartitionOffsets
from app.storage.reader import LogReader

# Lookups of one request at once (each is a few Oxia reads, at most one ranged GET).
LOOKUP_CONCURRENCY = 16
Named = Literal["earliest", "latest"]
NAMED: tuple[Named, ...] = ("earliest", "latest")
# A partition's offsets, or why they could not be found.
Found = PartitionOffsets | LlogError


def named_offset(where: PartitionOffsets, name: Named) -> int:
    """"earliest": the log start; "latest": the next offset to be written."""
    return where.log_start if name == "earliest" else where.high_watermark + 1


@dataclass(frozen=True)
class Positions:
    """Offset lookups on this broker's log reader; each refused without the read role
    (``reader`` and ``answers`` then stand-ins, app/broker/roles.py)."""

    reader: LogReader
    answers: AnswerBudget  # what a lookup by time holds the records it reads in
    topics: TopicDirectory  # a topic being deleted is read by nobody
    max_partitions: int  # LLOG_MAX_PARTITIONS_PER_REQUEST

    async def lookup_all(self, queries: Sequence[tuple[TopicPartition, int | None]]
                         ) -> list[Found]:
        """Each query's offsets (with a time: the first offset at it), or its error; at
        most LOOKUP_CONCURRENCY at once. Without the read role, each is refused. A lookup
        by time that reads records holds their bytes in the answer budget while it does
        (refused with ``Unavailable``, retriable, when the budget has no room in time)."""
        refused = roles.refusal_of(self.reader)
        if refused is not None:
            return [refused] * len(queries)
        out: list[PartitionOffsets | LlogError | None] = [None] * len(queries)
        limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)

        async def one(i: int, tp: TopicPartition, at_ms: int | None) -> None:
            async with limiter:
                out[i] = await self._lookup(tp, at_ms)

        async with anyio.create_task_group() as tg:
            for i, (tp, at_ms) in enumerate(queries):
                tg.start_soon(one, i, tp, at_ms)
        return [o for o in out if o is not None]  # every one is set once the group is done

    async def _lookup(self, tp: TopicPartition, at_ms: int | None) -> Found:
        held = None if at_ms is None else self.answers.reservation()

        async def reserve(n: int) -> None:
            assert held is not None
            await held.reserve(math.ceil(n * READ_FACTOR))

        try:
            await self.topics.check_readable(tp)
            return await storage_offsets.list_offsets(
                self.reader, tp, at_ms, reserve=None if held is None else reserve)
        except LlogError as exc:
            return exc
        finally:
            if held is not None:
                held.release()

    async def lookup_within_limits(self, asked: Sequence[tuple[str, int, int | None]]
                                   ) -> list[Found]:
        """``POST /offsets``: each (topic, partition, time or None)'s offsets, or its
        error; 413 for more partitions than one request may name."""
        PayloadTooLarge.unless_within(len(asked), self.max_partitions)
        return await self.lookup_all([(TopicPartition(topic, partition), at_ms)
                                      for topic, partition, at_ms in asked])

    async def resolve_named(self, named: Sequence[tuple[TopicPartition, Named]]
                            ) -> list[int | LlogError]:
        """Each partition's named position as an offset, or why it could not be found."""
        found = await self.lookup_all([(tp, None) for tp, _ in named])
        return [named_offset(where, name) if isinstance(where, PartitionOffsets) else where
                for (_, name), where in zip(named, found, strict=True)]
