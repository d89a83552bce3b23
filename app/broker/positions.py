"""Where partitions start and end: offset lookups, and the named positions "earliest"
and "latest" resolved to offsets, in one place for ``POST /offsets``, ``POST /consume``
and the event stream."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import anyio

from app.broker.answering import READ_FACTOR
from app.errors import LlogError, PayloadTooLarge, RoleDisabled
from app.storage import log_positions as storage_offsets
from app.storage.keys import TopicPartition
from app.storage.log_positions import PartitionOffsets

if TYPE_CHECKING:
    from app.broker.state import BrokerState

# Lookups of one request at once (each is a few Oxia reads, at most one ranged GET).
LOOKUP_CONCURRENCY = 16
Named = Literal["earliest", "latest"]
NAMED: tuple[Named, ...] = ("earliest", "latest")
# A partition's offsets, or why they could not be found.
Found = PartitionOffsets | LlogError


def named_offset(where: PartitionOffsets, name: Named) -> int:
    """"earliest": the log start; "latest": the next offset to be written."""
    return where.log_start if name == "earliest" else where.high_watermark + 1


async def lookup_all(state: BrokerState, queries: Sequence[tuple[TopicPartition, int | None]]
                     ) -> list[Found]:
    """Each query's offsets (with a time: the first offset at it), or its error; at most
    LOOKUP_CONCURRENCY at once. Without the read role, each is refused. A lookup by time
    that reads records holds their bytes in the answer budget while it does (refused
    with ``Unavailable``, retriable, when the budget has no room in time)."""
    try:
        reader = state.log_reader()
    except RoleDisabled as exc:
        return [exc] * len(queries)
    budget = None if state.consume is None else state.consume.answers
    out: list[PartitionOffsets | LlogError | None] = [None] * len(queries)
    limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)

    async def one(i: int, tp: TopicPartition, at_ms: int | None) -> None:
        async with limiter:
            held = None if budget is None or at_ms is None else budget.reservation()

            async def reserve(n: int) -> None:
                assert held is not None
                await held.reserve(math.ceil(n * READ_FACTOR))

            try:
                if state.topics is not None:  # one being deleted is read by nobody
                    await state.topics.check_readable(tp)
                out[i] = await storage_offsets.list_offsets(
                    reader, tp, at_ms, reserve=None if held is None else reserve)
            except LlogError as exc:
                out[i] = exc
            finally:
                if held is not None:
                    held.release()

    async with anyio.create_task_group() as tg:
        for i, (tp, at_ms) in enumerate(queries):
            tg.start_soon(one, i, tp, at_ms)
    return [o for o in out if o is not None]  # every one is set once the group is done


async def lookup_within_limits(state: BrokerState,
                               asked: Sequence[tuple[str, int, int | None]]
                               ) -> list[Found]:
    """``POST /offsets``: each (topic, partition, time or None)'s offsets, or its error;
    413 for more partitions than one request may name."""
    limit = state.settings.max_partitions_per_request
    if len(asked) > limit:
        raise PayloadTooLarge(f"{len(asked)} partitions in one request; the limit is {limit}")
    return await lookup_all(state, [(TopicPartition(topic, partition), at_ms)
                                    for topic, partition, at_ms in asked])


async def resolve_named(state: BrokerState, named: Sequence[tuple[TopicPartition, Named]]
                        ) -> list[int | LlogError]:
    """Each partition's named position as an offset, or why it could not be found."""
    found = await lookup_all(state, [(tp, None) for tp, _ in named])
    return [named_offset(where, name) if isinstance(where, PartitionOffsets) else where
            for (_, name), where in zip(named, found, strict=True)]
