"""Operator actions on whole topics: describe one, delete one.

Describing reads every partition's ``meta/control`` (its log start, high watermark,
retained bytes and last append time), a bounded number at once. Deleting is retention to
infinity plus removal from the catalog: every partition's pending append is
materialised, its log start moved past its high watermark and its index trimmed, and
only then is the catalog record removed, so a delete that stops half-way is finished by
running it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from app.errors import UnknownTopic
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import materialise_pending
from app.storage.oxia_store import OxiaStore
from app.storage.reader import LogReader
from app.storage.records import Control, now_ms
from app.storage.retention import move_log_start, trim_index
from app.storage.topics import Topic, TopicCatalog

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

    async def describe(self, name: str) -> tuple[Topic, list[PartitionState]]:
        topic = await self._required(name)
        states: list[PartitionState | None] = [None] * topic.partitions

        async def one(p: int) -> None:
            control = await self._reader.read_control(TopicPartition(name, p))
            states[p] = partition_state(p, control)

        await _each(topic.partitions, one)
        return topic, [s for s in states if s is not None]

    async def delete(self, name: str) -> Topic:
        """Trim every partition to nothing, then drop the catalog record."""
        topic = await self._required(name)
        await _each(topic.partitions, lambda p: self._empty(TopicPartition(name, p)))
        await self.catalog.remove(topic)
        return topic

    async def _empty(self, tp: TopicPartition) -> None:
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

    async def _required(self, name: str) -> Topic:
        topic = await self.catalog.get(name)
        if topic is None:
            raise UnknownTopic(f"topic {name!r} does not exist")
        return topic


async def _each(count: int, work: Callable[[int], Awaitable[None]]) -> None:
    limiter = anyio.CapacityLimiter(CONCURRENCY)

    async def run(i: int) -> None:
        async with limiter:
            await work(i)

    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(run, i)
