"""A span: an index entry (or the pending append) resolved to the offsets it covers.

The index stores each entry under its *last* offset and knows how many records it
holds, so the span of ``index/{end}`` is ``[end - msg_count + 1, end]``. Readers and the
compactor reason in spans; the stored records stay :class:`IndexEntry` and
:class:`Pending` (docs/protocol.md).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

from app.storage.chunks import Chunk, chunk_index, parse_chunks
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.records import IndexEntry, Pending

UNKNOWN_COST = sys.maxsize  # an object whose size is not recorded: assume it fills a budget


@dataclass(frozen=True, eq=False)
class Span:
    end: int
    entry: IndexEntry
    version: int | None = None  # the index key's Oxia version; None for the pending append

    @classmethod
    def of_pending(cls, pending: Pending) -> Span:
        return cls(pending.end_offset, pending.index_entry())

    @property
    def start(self) -> int:
        return self.end - self.entry.msg_count + 1

    @property
    def is_wal(self) -> bool:
        return self.entry.type == "WAL"

    def covers(self, offset: int) -> bool:
        return self.start <= offset <= self.end

    @functools.cached_property
    def chunks(self) -> list[Chunk] | None:
        """The chunk table of a compacted blob, if the entry carries one."""
        e = self.entry
        if e.chunks is None or e.object_bytes is None:
            return None
        return parse_chunks(e.chunks, e.msg_count, e.object_bytes)

    def cost_from(self, offset: int) -> int:
        """Bytes a reader fetches to read this span from ``offset`` onwards."""
        e = self.entry
        if e.byte_length is not None:
            return e.byte_length
        chunks = self.chunks
        if chunks is not None and e.object_bytes is not None:
            chunk = chunks[chunk_index(chunks, max(offset, self.start) - self.start)]
            return e.object_bytes - chunk.byte_offset
        return e.object_bytes if e.object_bytes is not None else UNKNOWN_COST

    def object_key(self, layout: KeyLayout) -> str:
        return layout.parse_uri(self.entry.data_key)[1]


def index_span(layout: KeyLayout, tp: TopicPartition, key: str, value: bytes,
               version: int) -> Span | None:
    """The span of an index record, or None for a key that is not the partition's."""
    end = layout.index_end_offset(tp, key)
    if end is None:
        return None
    return Span(end, IndexEntry.from_json(value), version)
