"""Retention: moving a partition's log start forward, and freeing what lies below it.

1. **Move the log start** (:func:`apply_retention`): the new start is the first offset
   that retention keeps (by time: appended within ``retention_ms``; by bytes: the
   entries whose appended bytes end within the last ``retention_bytes``; both: the later
   of the two), set by a CAS on ``meta/control`` that only ever moves it forward, with
   the appended bytes before it (so a topic's retained bytes are known). Readers refuse
   offsets below it from then on.
2. **Trim the index** (:func:`trim_index`, run by compaction before it selects): move
   the compaction cursor to the first entry still needed, *then* delete the index keys
   wholly below the log start, so a compaction that selected them meanwhile finds the
   cursor moved and drops its run. The blobs they pointed at become unreferenced;
   vacuum deletes them once no partition needs them and the retry horizon has passed.

Both steps are idempotent and can be repeated by any process at any time.
"""

from __future__ import annotations

import dataclasses

from app.errors import VersionMismatch
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.log_positions import first_offset_at, first_span_where
from app.storage.metadata import CompactionCursor, Control
from app.storage.reader import LogReader
from app.storage.spans import index_span
from app.storage.topic_catalog import TopicConfig
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

_ATTEMPTS = 16


async def retention_start(reader: LogReader, tp: TopicPartition, control: Control,
                          config: TopicConfig, now_ms: int) -> int:
    """The log start that ``config``'s retention asks for (never below the current)."""
    start = control.log_start
    if config.retention_ms is not None:
        start = max(start, await first_offset_at(reader, tp, control,
                                                 now_ms - config.retention_ms))
    if config.retention_bytes is not None and control.appended_bytes is not None:
        threshold = control.appended_bytes - config.retention_bytes
        if threshold > 0:
            span = await first_span_where(reader, tp, control,
                                          lambda s: (s.entry.end_bytes or 0) > threshold)
            start = max(start, span.start if span else control.sequence_counter + 1)
    return min(start, control.sequence_counter + 1)


async def bytes_before(reader: LogReader, tp: TopicPartition, control: Control,
                       offset: int) -> int | None:
    """The partition's appended bytes before ``offset`` (where they are known)."""
    if offset > control.sequence_counter:
        return control.appended_bytes
    if offset <= 1:
        return 0
    span = await reader.span_at(tp, offset - 1, control)
    return span.entry.end_bytes


async def move_log_start(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                         start: int, start_bytes: int | None) -> int:
    """Set the log start to ``start`` unless it is there or beyond; the start after."""
    key = layout.control(tp)

    async def attempt(_: int) -> Done[int] | Retry:
        found = await oxia.get(key, tp.partition_key)
        if found is None:
            return Done(1)
        control = Control.from_json(found.value)
        wanted = min(start, control.sequence_counter + 1)
        if wanted <= control.log_start:
            return Done(control.log_start)
        updated = dataclasses.replace(control, log_start_offset=wanted,
                                      log_start_bytes=start_bytes, extra=dict(control.extra))
        try:
            await oxia.put(key, updated.to_json(), tp.partition_key,
                           expected_version=found.version_id)
        except VersionMismatch:
            return Retry("conflict")
        return Done(wanted)

    return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"{tp}: move the log start",
                          op="log_start")


async def apply_retention(reader: LogReader, oxia: OxiaStore, layout: KeyLayout,
                          tp: TopicPartition, config: TopicConfig, now_ms: int) -> int:
    """Move the log start as ``config`` asks; the log start after."""
    control = await reader.read_control(tp)
    if control is None:
        return 1
    start = await retention_start(reader, tp, control, config, now_ms)
    if start <= control.log_start:
        return control.log_start
    return await move_log_start(oxia, layout, tp, start,
                                await bytes_before(reader, tp, control, start))


async def trim_index(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                     control: Control) -> bool:
    """Step 2 above: True if any key was deleted or the cursor moved.

    The cursor goes to the start of the first entry still needed (it may begin below
    the log start): compaction selects runs from entry boundaries only.
    """
    log_start = control.log_start
    if log_start <= 1:
        return False
    first = await oxia.range_scan(layout.index(tp, log_start), layout.index_scan_end(tp),
                                  tp.partition_key, limit=1)
    spans = [s for r in first if (s := index_span(layout, tp, r.key, r.value, r.version_id))]
    pending = control.pending
    if spans:
        keep_from = spans[0].start
    elif pending is not None and pending.end_offset >= log_start:
        keep_from = pending.start_offset
    else:
        keep_from = log_start
    moved = await _cursor_at_least(oxia, layout, tp, keep_from)
    below = await oxia.range_scan(layout.index(tp, 0), layout.index(tp, log_start),
                                  tp.partition_key, limit=1)
    if below:
        await oxia.delete_range(layout.index(tp, 0), layout.index(tp, log_start),
                                tp.partition_key)
    return moved or bool(below)


async def _cursor_at_least(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                           offset: int) -> bool:
    key = layout.compaction_cursor(tp)

    async def attempt(_: int) -> Done[bool] | Retry:
        found = await oxia.get(key, tp.partition_key)
        current = CompactionCursor.from_json(found.value) if found else CompactionCursor()
        if current.offset >= offset:
            return Done(False)
        updated = CompactionCursor(offset=offset, extra=dict(current.extra))
        try:
            await oxia.put(key, updated.to_json(), tp.partition_key,
                           expected_version=found.version_id if found else EXPECT_NOT_EXISTS)
        except VersionMismatch:
            return Retry("conflict")
        return Done(True)

    return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"{tp}: move the cursor",
                          op="cursor")
