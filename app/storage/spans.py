"""A span: an index entry (or the pending append) resolved to the offsets it covers.

The index stores each entry under its *last* offset and knows how many records it
holds, so the span of ``index/{end}`` is ``[end - msg_count + 1, end]``. Readers and the
compactor reason in spans; the stored records stay :class:`IndexEntry` and
:class:`Pending` (docs/protocol.md).
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field

from cachetools import LRUCache

from app.storage.chunks import Chunk, chunk_index, parse_chunks
from app.storage.compression import Codec, parse_codec
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import IndexEntry, Pending

UNKNOWN_COST = sys.maxsize  # an object whose size is not recorded: assume it fills a budget


@dataclass(frozen=True, eq=False)
class Span:
    end: int
    entry: IndexEntry
    version: int | None = None  # the index key's Oxia version; None for the pending append
    raw: bytes | None = field(default=None, repr=False)  # the entry as stored, if read

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

    @functools.cached_property
    def codec(self) -> Codec:
        """How the entry's bytes are stored (:class:`CorruptData` for an unknown codec)."""
        return parse_codec(self.entry.codec)

    def cost_from(self, offset: int) -> int:
        """Bytes a reader fetches to read this span from ``offset`` onwards (for a
        compressed slice, the bytes it decodes to: what its records cost an answer)."""
        e = self.entry
        if e.byte_length is not None:
            raw = e.raw_length  # a malformed one is reported when the slice is read
            return raw if e.codec is not None and isinstance(raw, int) and raw > 0 \
                else e.byte_length
        chunks = self.chunks
        if chunks is not None and e.object_bytes is not None:
            first = chunk_index(chunks, max(offset, self.start) - self.start)
            return self.chunks_cost(first, len(chunks) - 1)
        return e.object_bytes if e.object_bytes is not None else UNKNOWN_COST

    def chunks_cost(self, first: int, last: int) -> int:
        """What chunks ``first .. last`` of a compacted blob cost a read: their stored
        bytes, or for compressed chunks about the bytes they decompress to (the object's
        ``raw_length`` shared in proportion to the stored bytes), so that a budget plans
        the records it can answer with and no read inflates many times its budget."""
        chunks = self.chunks
        assert chunks is not None
        stored = chunks[last].byte_end - chunks[first].byte_offset
        e, raw = self.entry, self.entry.raw_length
        if (e.codec is None or not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0
                or not e.object_bytes):
            return stored  # a malformed raw_length is reported when the chunks are read
        return max(stored, stored * raw // e.object_bytes)

    def object_key(self, layout: KeyLayout) -> str:
        return layout.parse_uri(self.entry.data_key)[1]


def index_span(layout: KeyLayout, tp: TopicPartition, key: str, value: bytes,
               version: int) -> Span | None:
    """The span of an index record, or None for a key that is not the partition's."""
    end = layout.index_end_offset(tp, key)
    if end is None:
        return None
    return Span(end, IndexEntry.from_json(value), version, value)


class ParsedSpans:
    """Index entries already parsed, by key, for a reader that meets them again.

    A consumer catching up through a compacted blob reads the same index entry for every
    answer, and parsing its JSON and chunk table (up to 1,024 rows, validated) was a
    tenth of the broker's work per answer. An entry is reused only when its key, Oxia
    version and stored bytes are all the ones parsed, so a rewritten entry is always
    parsed afresh. Bounded by bytes, most recently used kept: an entry costs its stored
    bytes and, parsed, about ``PARSED_FACTOR`` times as much again (a chunk table row is
    about 40 bytes of JSON and 150 as an object)."""

    PARSED_FACTOR = 4

    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._spans: LRUCache[str, tuple[bytes, Span]] = LRUCache(
            max(max_bytes, 1), getsizeof=lambda kept: len(kept[0]) * (1 + self.PARSED_FACTOR))

    def __len__(self) -> int:
        return len(self._spans)

    def span(self, layout: KeyLayout, tp: TopicPartition, key: str, value: bytes,
             version: int) -> Span | None:
        """:func:`index_span`, parsed once while kept."""
        kept = self._spans.get(key)
        if kept is not None and kept[1].version == version and kept[0] == value:
            return kept[1]
        span = index_span(layout, tp, key, value, version)
        if span is not None and len(value) * (1 + self.PARSED_FACTOR) <= self._spans.maxsize:
            self._spans[key] = (value, span)
        return span
