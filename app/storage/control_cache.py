"""A writer's view of its partitions' control records (``meta/control``).

Every read and every write the writer makes leaves the record here, so a steady writer
commits without reading first; the versions it wrote are its own (app/storage/own_writes.py),
for change notifications to tell them from other brokers' writes; and which pending append
it materialised last, so it writes that index entry once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache

from app.errors import StorageUnavailable
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control
from app.storage.own_writes import Foreign, OwnWrites
from app.stores.oxia.store import OxiaStore, PutSpec


@dataclass
class CachedControl:
    control: Control
    version: int
    cached: bool = False  # served from this process's cache rather than just read


class ControlCache:
    """Bounded (``max_partitions``): a partition not in it is read again."""

    def __init__(self, oxia: OxiaStore, layout: KeyLayout, *, clock: Callable[[], int],
                 pending_reread_ms: int, max_partitions: int,
                 on_foreign: Foreign | None = None) -> None:
        self._oxia = oxia
        self._layout = layout
        self._clock = clock
        self._pending_reread_ms = pending_reread_ms
        self._controls: LRUCache[TopicPartition, CachedControl] = LRUCache(max_partitions)
        # The pending append whose index entry this process wrote (or found written).
        self.materialised: LRUCache[TopicPartition, str] = LRUCache(max_partitions)
        # The control versions this process wrote: only these are "our own" changes (a
        # version merely read after a conflict is someone else's).
        self.own = OwnWrites(max_partitions, on_foreign=on_foreign)

    async def current(self, tp: TopicPartition) -> CachedControl:
        """The cached control record, unless it may lead the writer astray.

        A cached ``pending`` that is old enough for compaction to have materialised and
        compacted it must not be re-created in the index (that would make a stray,
        possibly pointing at a blob vacuum removed), so it is read again.
        """
        cached = self._controls.get(tp)
        if cached is not None:
            pending = cached.control.pending
            if (pending is None or self.materialised.get(tp) == pending.append_id
                    or self._clock() - pending.created_at_ms < self._pending_reread_ms):
                return CachedControl(cached.control, cached.version, cached=True)
        return await self.fresh(tp)

    async def fresh(self, tp: TopicPartition) -> CachedControl:
        """The record as Oxia has it now (the partition is initialised)."""
        current = await self.read(tp)
        if current is None:
            raise StorageUnavailable(f"{tp}: meta/control vanished after initialisation")
        return current

    async def read(self, tp: TopicPartition) -> CachedControl | None:
        record = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        if record is None:
            self._controls.pop(tp, None)
            return None
        current = CachedControl(Control.from_json(record.value), record.version_id)
        self._controls[tp] = current
        return current

    def keep(self, tp: TopicPartition, control: Control, version: int) -> None:
        self._controls[tp] = CachedControl(control, version)

    def forget(self, tp: TopicPartition) -> None:
        """After a conflict or an unanswered write: the next attempt reads again."""
        self._controls.pop(tp, None)

    async def put(self, tp: TopicPartition, puts: list[PutSpec], *,
                  control_at: int) -> list[int | Exception]:
        """``puts``, of which ``puts[control_at]`` writes the partition's control record:
        the version it returns is remembered as this process's own before the
        notifications held meanwhile are decided (:mod:`app.storage.own_writes`)."""
        with self.own.writing(tp):
            outcomes = await self._oxia.put_group(puts)
            version = outcomes[control_at]
            if isinstance(version, int):
                self.own.wrote(tp, version)
            return outcomes
