"""Operator actions on whole topics: describe one (a page of its partitions at a time),
empty its partitions.

Describing reads each partition's ``meta/control`` (its log start, high watermark,
retained bytes and last append time), a bounded number at once, and at most
``DESCRIBE_PAGE_MAX`` per request: the cost of one request does not grow with the topic.
Emptying a partition is retention to infinity: its pending append is materialised, its
log start moved past its high watermark and its index trimmed; done twice, it is done
once (app/storage/topic_deletion.py drives it over a topic being deleted).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from app.errors import UnknownTopic
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import materialise_pending
from app.storage.metadata import Control, now_ms
from app.storage.reader import LogReader
from app.storage.retention import move_log_start, trim_index
from app.storage.topic_catalog import DESCRIBE_PAGE_MAX, Topic, TopicCatalog
from app.stores.oxia.store import OxiaStore

CONCURRENCY = 16
_ATTEMPTS = 16


@dataclass(frozen=True)
class PartitionState:
    partition: int
    log_start: int
    high_watermark: int
    retained_bytes: int | None  # body bytes from the log start on (None: not known)
    last_append_ms: int | None


def partition_state(partition: int, control: Control | None) -> PartitionState:
    if control is None:
        return PartitionState(partition, 1, 0, 0, None)
    retained = (None if control.appended_bytes is None
                else control.appended_bytes - (control.log_start_bytes or 0))
    return PartitionState(partition, control.log_start, control.sequence_counter, retained,
                          control.last_append_ms)


class TopicAdmin:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout, reader: LogReader,
                 catalog: TopicCatalog) -> None:
        self._oxia = oxia
        self._layout = layout
        self._reader = reader
        self.catalog = catalog

    async def describe(self, name: str, first: int = 0, count: int = DESCRIBE_PAGE_MAX
                       ) -> tuple[Topic, list[PartitionState]]:
        """The topic and the states of its partitions ``first … first+count-1`` (those
        that exist; none while it is being deleted)."""
        topic = await self._required(name)
        if topic.deleting is not None:
            return topic, []
        page = range(first, min(topic.partitions, first + min(count, DESCRIBE_PAGE_MAX)))
        states: list[PartitionState | None] = [None] * len(page)

        async def one(i: int) -> None:
            control = await self._reader.read_control(TopicPartition(name, page[i]))
            states[i] = partition_state(page[i], control)

        await each(len(page), one)
        return topic, [s for s in states if s is not None]

    async def empty(self, tp: TopicPartition) -> None:
        """Move the partition's log start past its high watermark and trim its index."""
        done = await materialise_pending(self._oxia, self._layout, tp, attempts=_ATTEMPTS,
                                         metrics=None, by="delete", clock=now_ms)
        control = done.control
        if control is None:
            return
        await move_log_start(self._oxia, self._layout, tp, control.sequence_counter + 1,
                             control.appended_bytes)
        after = await self._reader.read_control(tp)
        if after is not None:
            await trim_index(self._oxia, self._layout, tp, after)

    async def holds_records(self, tp: TopicPartition) -> bool:
        """Whether the partition has records at or above its log start, or an append
        pending (one read of its control record)."""
        control = await self._reader.read_control(tp)
        return control is not None and (control.pending is not None
                                        or control.log_start <= control.sequence_counter)

    async def _required(self, name: str) -> Topic:
        topic = await self.catalog.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic


async def each(count: int, work: Callable[[int], Awaitable[None]]) -> None:
    """``work(i)`` for each ``i`` below ``count``, ``CONCURRENCY`` at once (a failure
    comes out of the task group as an ``ExceptionGroup``)."""
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def run(i: int) -> None:
        async with limiter:
            await work(i)

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(run, i)
