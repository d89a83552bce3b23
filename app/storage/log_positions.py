"""Where a partition's log starts and ends, and the first offset appended at or after a
given time (Kafka's ListOffsets).

Append times never go backwards within a partition (the writer makes sure), so the
lookup is a binary search over offsets: each probe reads the index entry covering an
offset and compares its append times, a WAL entry's single one or a compacted entry's
first and last; when the time falls inside a compacted entry, its chunk table (which
holds each chunk's first append time) names the one chunk to read. A lookup costs
about log2 of the partition's entries in Oxia reads, and at most one ranged GET, whose
bytes the caller may bound first (``reserve``: the broker's answer budget).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.storage.chunks import Chunk
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord
from app.storage.metadata import Control
from app.storage.reader import LogReader
from app.storage.spans import Span

# Called with the bytes a lookup is about to read (and decode) before it reads them: it
# may wait for room, or raise to refuse the lookup.
Reserve = Callable[[int], Awaitable[None]]


@dataclass(frozen=True)
class PartitionOffsets:
    tp: TopicPartition
    log_start: int
    high_watermark: int
    # The first offset appended at or after the time asked for; high_watermark + 1 when
    # every record is older (the next one to be written).
    for_time: int | None = None


async def list_offsets(reader: LogReader, tp: TopicPartition, at_ms: int | None = None,
                       *, reserve: Reserve | None = None) -> PartitionOffsets:
    control = await reader.read_control(tp)
    if control is None:
        return PartitionOffsets(tp, 1, 0, None if at_ms is None else 1)
    start, hw = control.log_start, control.sequence_counter
    if at_ms is None:
        return PartitionOffsets(tp, start, hw)
    return PartitionOffsets(tp, start, hw, await first_offset_at(reader, tp, control, at_ms,
                                                                 reserve))


def _times(span: Span) -> tuple[int, int]:
    e = span.entry
    if e.type == "COMPACTED" and e.first_append_ms is not None and e.last_append_ms is not None:
        return e.first_append_ms, e.last_append_ms
    return e.created_at_ms, e.created_at_ms


async def first_span_where(reader: LogReader, tp: TopicPartition, control: Control,
                           holds: Callable[[Span], bool]) -> Span | None:
    """The first span from the log start on for which ``holds`` is true, when it is
    false for every span before that one and true for every span after it (append
    times and appended bytes only grow): a binary search over offsets."""
    lo, hi = control.log_start, control.sequence_counter + 1
    found: Span | None = None
    while lo < hi:
        span = await reader.span_at(tp, (lo + hi) // 2, control)
        if holds(span):
            found, hi = span, span.start
        else:
            lo = span.end + 1
    return found


async def first_offset_at(reader: LogReader, tp: TopicPartition, control: Control,
                          at_ms: int, reserve: Reserve | None = None) -> int:
    """The smallest offset from the log start on appended at or after ``at_ms``; the
    high watermark + 1 when none is."""
    hi = control.sequence_counter + 1
    if control.log_start >= hi or (control.last_append_ms or 0) < at_ms:
        return hi  # nothing appended since (an empty log answers its next offset)
    span = await first_span_where(reader, tp, control, lambda s: _times(s)[1] >= at_ms)
    if span is None:
        return hi
    if _times(span)[0] >= at_ms:
        return max(control.log_start, span.start)
    return max(control.log_start, await _within(reader, span, at_ms, reserve))


async def _within(reader: LogReader, span: Span, at_ms: int, reserve: Reserve | None
                  ) -> int:
    """The first offset of a compacted span appended at or after ``at_ms``."""
    chunks: list[Chunk] = span.chunks or []
    timed = [c for c in chunks if c.first_append_ms is not None]
    index = 0
    if timed and len(timed) == len(chunks):
        later = [i for i, c in enumerate(chunks) if (c.first_append_ms or 0) >= at_ms]
        if later and later[0] == 0:
            return span.start
        index = (later[0] if later else len(chunks)) - 1
    if reserve is not None:  # one chunk, or a whole object without a chunk table
        await reserve(span.chunks_cost(index, index) if chunks else span.cost_from(span.start))
    records = await reader.chunk_records(span, index)
    base = span.start + (chunks[index].first_record if chunks else 0)
    for i, record in enumerate(records):
        if isinstance(record, LogRecord) and record.append_time_ms >= at_ms:
            return base + i
    return base + len(records)  # the next chunk's first record
