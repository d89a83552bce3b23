"""A partition's compaction progress as Oxia holds it: the cursor (where the next run
starts; it only ever moves forward, each write a CAS on the version read),
``meta/compaction`` (the run in flight and how far it got), and the index entries from
the cursor on that a run is selected from."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import VersionMismatch
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Compaction, CompactionCursor
from app.storage.spans import Span, index_span
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

MAX_CAS_ATTEMPTS = 16


@dataclass
class CursorRead:
    """The cursor as read, with the version a CAS of it expects."""

    offset: int
    version: int | None  # None: the record does not exist (treated as offset 1)
    record: CompactionCursor = field(default_factory=CompactionCursor)


class CompactionProgress:
    """Reads and CAS writes of one store's compaction cursors and in-flight records."""

    def __init__(self, oxia: OxiaStore, layout: KeyLayout) -> None:
        self._oxia = oxia
        self._layout = layout

    async def in_flight(self, tp: TopicPartition) -> tuple[Compaction, int] | None:
        """``meta/compaction`` and its version, if a run is in flight."""
        found = await self._oxia.get(self._layout.compaction(tp), tp.partition_key)
        if found is None:
            return None
        return Compaction.from_json(found.value), found.version_id

    async def cursor(self, tp: TopicPartition) -> CursorRead:
        found = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        if found is None:
            return CursorRead(1, None)
        record = CompactionCursor.from_json(found.value)
        return CursorRead(record.offset, found.version_id, record)

    async def put_cursor(self, tp: TopicPartition, cursor: CursorRead, offset: int) -> None:
        """CAS the cursor from what was read to ``offset`` (raises VersionMismatch)."""
        updated = CompactionCursor(offset=offset, extra=dict(cursor.record.extra))
        await self._oxia.put(
            self._layout.compaction_cursor(tp), updated.to_json(), tp.partition_key,
            expected_version=EXPECT_NOT_EXISTS if cursor.version is None else cursor.version,
        )

    async def advance_cursor(self, tp: TopicPartition, offset: int) -> None:
        """Move the cursor to ``offset`` unless it is there or beyond already (never back)."""

        async def attempt(_: int) -> Done[None] | Retry:
            cursor = await self.cursor(tp)
            if cursor.offset >= offset:
                return Done(None)
            try:
                await self.put_cursor(tp, cursor, offset)
            except VersionMismatch:
                return Retry("conflict")
            return Done(None)

        await cas_loop(attempt, attempts=MAX_CAS_ATTEMPTS,
                       what=f"{tp}: the compaction cursor kept changing")

    async def scan(self, tp: TopicPartition, from_offset: int, limit: int) -> list[Span]:
        """Up to ``limit`` index entries from ``from_offset`` on."""
        records = await self._oxia.range_scan(
            self._layout.index(tp, from_offset), self._layout.index_scan_end(tp),
            tp.partition_key, limit=limit,
        )
        spans = (index_span(self._layout, tp, r.key, r.value, r.version_id) for r in records)
        return [span for span in spans if span is not None]
