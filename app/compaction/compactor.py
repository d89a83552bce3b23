"""``compact_once(tp)``: the compaction protocol of docs/protocol.md, step by step.

A run rewrites the contiguous run of WAL entries that starts at the compaction cursor into
one compacted blob, swaps the run's end key for a COMPACTED entry, deletes the other keys
and advances the cursor. ``meta/compaction`` records how far it got, so any process can
finish a run that another one abandoned (see :meth:`RunSteps.drive`).

The parts: the cursor and ``meta/compaction`` (app/compaction/progress.py), which entries
make a run (app/compaction/selection.py), the blob (app/compaction/assemble.py) and the
steps after the intent is recorded (app/compaction/run_steps.py).

Safety beyond the protocol text, because claims are advisory and requests can be slow:

- The cursor only ever moves forward, and every write of it is a CAS on the version read.
- A run's selection is trusted only while the cursor still equals its start. Nothing but
  a finished compaction moves the cursor, so after ``meta/compaction`` is created (which
  excludes every other run), a cursor that still reads ``start`` proves that no other
  run touched the selected keys since they were scanned. A record whose start no longer
  matches the cursor in state ``WRITING_COMPACTED_INDEX`` is stale: it has changed no
  index key yet, so it is dropped (its blob becomes an orphan for vacuum).
- The end key is overwritten only by a CAS on the version of the WAL entry found there,
  so it never replaces anything but the entry the run selected.
- ``delete_range`` covers ``[start, end)`` only; keys beyond the run, where writers may be
  materialising new appends, are never touched.
- A compacted blob is referenced (by ``meta/compaction``) only while it is younger than
  the safe share of the retry horizon, so vacuum can never collect it under a run.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from app.compaction.assemble import CompactedBody, build_compacted_body
from app.compaction.metrics import CompactionMetrics
from app.compaction.outcome import Action, CompactionOutcome
from app.compaction.progress import MAX_CAS_ATTEMPTS, CompactionProgress, CursorRead
from app.compaction.recompress import compaction_compression, compress_chunks, topic_compression
from app.compaction.run_steps import STEPS, RunSteps, StepHook, timed
from app.compaction.selection import run_bytes, select_run
from app.errors import CorruptData, LlogError, LogGap, VersionMismatch
from app.settings import CompactionSettings
from app.storage import codec
from app.storage.chunks import DEFAULT_CHUNK_BYTES
from app.storage.compression import Codec
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import materialise_pending
from app.storage.metadata import Compaction, Control, now_ms
from app.storage.retention import trim_index
from app.storage.spans import Span
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore
from app.stores.s3.store import S3Store

__all__ = [
    "STEPS",
    "Action",
    "CompactionConfig",
    "CompactionOutcome",
    "Compactor",
    "StepHook",
]


@dataclass(frozen=True)
class CompactionConfig:
    max_bytes: int = 64 * 1024 * 1024
    max_entries: int = 1000
    min_entries: int = 2
    min_entry_age_ms: int = 30_000
    fetch_concurrency: int = 16
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    commit_horizon_ms: int = 1_800_000
    encoding: str = codec.ENCODING_V3_CHUNKED
    zstd_level: int | None = None  # None: the topic's level + 3 (app/compaction/recompress.py)

    @classmethod
    def from_settings(cls, settings: CompactionSettings) -> CompactionConfig:
        return cls(
            max_bytes=settings.compaction_max_bytes,
            max_entries=settings.compaction_max_entries,
            min_entries=settings.compaction_min_entries,
            min_entry_age_ms=settings.compaction_min_entry_age_ms,
            chunk_bytes=settings.compaction_chunk_bytes,
            commit_horizon_ms=settings.retry_horizon_safe_ms,
            encoding=settings.compaction_encoding,
            zstd_level=settings.compaction_zstd_level,
        )


class Compactor:
    """Compacts one partition per call; safe to run from any number of processes.

    It finishes a run in flight, or materialises, trims, selects a run, writes its blob
    and records the intent; :class:`RunSteps` takes the run from there.
    """

    def __init__(
        self,
        oxia: OxiaStore,
        s3: S3Store,
        layout: KeyLayout,
        config: CompactionConfig,
        *,
        metrics: CompactionMetrics | None = None,
        crash_hook: StepHook | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._oxia = oxia
        self._s3 = s3
        self._layout = layout
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._progress = CompactionProgress(oxia, layout)
        self._steps = RunSteps(oxia, layout, self._progress, metrics=metrics,
                               step_hook=crash_hook)

    @property
    def config(self) -> CompactionConfig:
        return self._config

    @property
    def s3(self) -> S3Store:
        return self._s3

    async def compact_once(self, tp: TopicPartition) -> CompactionOutcome:
        try:
            outcome = await self._compact_once(tp)
        except LlogError as exc:
            self._count_failure(exc.error_type)
            raise
        except Exception as exc:
            self._count_failure(type(exc).__name__)
            raise
        self._count(outcome)
        return outcome

    # -- the protocol ------------------------------------------------------------------

    async def _compact_once(self, tp: TopicPartition) -> CompactionOutcome:
        # 1. An interrupted run is finished first, whoever started it.
        found = await self._progress.in_flight(tp)
        if found is not None:
            record, version = found
            if self._metrics is not None:
                self._metrics.recoveries.labels(record.state).inc()
            return await self._steps.drive(tp, record, version, resumed_from=record.state)
        # 2. Materialise the pending append, so the index holds every committed offset;
        # then let go of what retention moved below the log start.
        with self._stage("materialise"):
            materialised, control = await self._materialise(tp)
        hw = None if control is None else control.sequence_counter
        if control is not None and control.log_start > 1:
            with self._stage("trim"):
                if await trim_index(self._oxia, self._layout, tp, control):
                    return CompactionOutcome(tp, "trimmed", materialised_pending=materialised,
                                             cursor=None, high_watermark=hw)
        # 3. Select the run at the cursor.
        with self._stage("select"):
            cursor = await self._progress.cursor(tp)
            scanned = await self._progress.scan(tp, cursor.offset, self._config.max_entries)
        base = CompactionOutcome(tp, "nothing_to_do", materialised_pending=materialised,
                                 cursor=cursor.offset, high_watermark=hw)
        if not scanned:
            return dataclasses.replace(base, reason="no_entries")
        first = scanned[0]
        if first.start != cursor.offset:
            return await self._misaligned(tp, cursor, first, base)
        if first.entry.type == "COMPACTED":
            return await self._skip_compacted(tp, cursor, first, base)
        run, reason = self._select(scanned)
        if reason is not None:
            return dataclasses.replace(base, reason=reason)
        if self._metrics is not None:
            self._metrics.candidates.inc()
        outcome = await self._compact_run(tp, run, base)
        return dataclasses.replace(outcome, wal_bytes=run_bytes(run))

    async def _compact_run(self, tp: TopicPartition, run: list[Span],
                           base: CompactionOutcome) -> CompactionOutcome:
        """Steps 4 and 5: write the blob, record the intent, then drive steps 6-8."""
        started = self._clock()
        with self._stage("read_write_blob"):
            merged, object_key = await self._write_blob(tp, run)
        await self._steps.step("after_compacted_put")
        start, end = run[0].start, run[-1].end
        if merged.msg_count != end - start + 1:
            raise CorruptData(f"{tp}: run [{start}, {end}] holds {merged.msg_count} records")
        if self._clock() - started > self._config.commit_horizon_ms:
            # Too old to reference safely: vacuum may collect it any time (an orphan now).
            return dataclasses.replace(base, action="abandoned", reason="upload_expired")
        record = Compaction(
            compaction_id=uuid.uuid4().hex, state="WRITING_COMPACTED_INDEX",
            start_offset=start, end_offset=end, msg_count=end - start + 1,
            data_key=self._layout.uri(object_key), tail_entry_start_offset=run[-1].start,
            encoding=merged.encoding, created_at_ms=started, crc32c=merged.crc32c,
            object_bytes=len(merged.body), chunks=merged.chunks,
            first_append_ms=merged.first_append_ms, last_append_ms=merged.last_append_ms,
            end_bytes=run[-1].entry.end_bytes,
            codec=None if merged.codec is Codec.NONE else merged.codec.value,
            raw_length=merged.raw_length,
            extra={"entries": len(run), "bytes": len(merged.body)},
        )
        try:
            with self._stage("record_intent"):
                # "Expect not exists" admits one run per partition.
                version = await self._oxia.put(
                    self._layout.compaction(tp), record.to_json(), tp.partition_key,
                    expected_version=EXPECT_NOT_EXISTS)
        except VersionMismatch:
            return dataclasses.replace(base, action="raced",
                                       reason="another compaction started meanwhile")
        await self._steps.step("after_compaction_record")
        outcome = await self._steps.drive(tp, record, version, resumed_from=None)
        return dataclasses.replace(outcome, materialised_pending=base.materialised_pending,
                                   high_watermark=base.high_watermark)

    async def _write_blob(self, tp: TopicPartition, run: list[Span]
                          ) -> tuple[CompactedBody, str]:
        """The run's records as one compacted blob (compressed as the topic says),
        written to S3: the merged body and its key."""
        merged = await build_compacted_body(
            self._s3, self._layout, run, concurrency=self._config.fetch_concurrency,
            chunk_bytes=self._config.chunk_bytes, encoding=self._config.encoding)
        compression = compaction_compression(
            await topic_compression(self._oxia, self._layout, tp.topic),
            self._config.zstd_level)
        # zstd releases the GIL: a large object compresses off the event loop.
        merged = await anyio.to_thread.run_sync(compress_chunks, merged, compression)
        object_key = self._layout.compacted_object(tp, uuid.uuid4().hex)
        await self._s3.put(object_key, merged.body)
        self._s3.metrics.count_stored("chunk", merged.raw_length or len(merged.body),
                                      len(merged.body))
        return merged, object_key

    # -- selection -----------------------------------------------------------------------

    def _select(self, scanned: list[Span]) -> tuple[list[Span], str | None]:
        """The run of WAL entries from the first one on (app/compaction/selection.py)."""
        c = self._config
        return select_run(scanned, newest_allowed_ms=self._clock() - c.min_entry_age_ms,
                          min_entries=c.min_entries, max_entries=c.max_entries,
                          max_bytes=c.max_bytes)

    async def _skip_compacted(self, tp: TopicPartition, cursor: CursorRead, first: Span,
                              base: CompactionOutcome) -> CompactionOutcome:
        """Step 3's special case: the entry at the cursor is compacted already."""
        try:
            await self._progress.put_cursor(tp, cursor, first.end + 1)
        except VersionMismatch:
            return dataclasses.replace(base, action="raced", reason="the cursor moved")
        return dataclasses.replace(base, action="advanced_cursor", start_offset=first.start,
                                   end_offset=first.end, cursor=first.end + 1)

    async def _misaligned(self, tp: TopicPartition, cursor: CursorRead, first: Span,
                          base: CompactionOutcome) -> CompactionOutcome:
        """The first entry at or above the cursor does not start at it."""
        again = await self._progress.cursor(tp)
        if again.offset != cursor.offset:
            return dataclasses.replace(base, action="raced", reason="the cursor moved")
        if first.start > cursor.offset:
            raise LogGap(f"{tp}: no index entry covers offset {cursor.offset} (the compaction "
                         f"cursor); the next entry starts at {first.start}")
        raise CorruptData(f"{tp}: index entry [{first.start}, {first.end}] straddles the "
                          f"compaction cursor {cursor.offset}")

    # -- records -----------------------------------------------------------------------

    async def _materialise(self, tp: TopicPartition) -> tuple[bool, Control | None]:
        """Make the pending append an index entry and clear it; returns (done, the
        control record as last read or written).

        A pending append younger than the minimum entry age is left alone: it could not
        be selected anyway, and its next writer materialises it for free, whereas clearing
        it here would cost every active writer a control re-read.
        """
        found = await materialise_pending(
            self._oxia, self._layout, tp, attempts=MAX_CAS_ATTEMPTS, metrics=None,
            by="compactor", min_age_ms=self._config.min_entry_age_ms, clock=self._clock)
        if found.done and self._metrics is not None:
            self._metrics.pending_materialised.inc()
        return found.done, found.control

    # -- plumbing ------------------------------------------------------------------------

    def _stage(self, name: str) -> Any:
        return timed(self._metrics, name)

    def _count(self, outcome: CompactionOutcome) -> None:
        m = self._metrics
        if m is None:
            return
        m.runs.labels(outcome.action).inc()
        if outcome.action == "nothing_to_do":
            m.nothing_to_do.labels(outcome.reason or "unknown").inc()
        if outcome.action in ("compacted", "resumed") and outcome.reason is None:
            m.successes.inc()
            m.records.inc(outcome.records)
            m.bytes.inc(outcome.bytes)
            m.entries_replaced.inc(outcome.entries)

    def _count_failure(self, error_type: str) -> None:
        if self._metrics is not None:
            self._metrics.runs.labels("failed").inc()
            self._metrics.failures.labels(error_type).inc()
