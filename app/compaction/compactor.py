"""``compact_once(tp)``: the compaction protocol of docs/protocol.md, step by step.

A run rewrites the contiguous run of WAL entries that starts at the compaction cursor into
one compacted blob, swaps the run's end key for a COMPACTED entry, deletes the other keys
and advances the cursor. ``meta/compaction`` records how far it got, so any process can
finish a run that another one abandoned (see :meth:`Compactor._drive`).

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

import contextlib
import dataclasses
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from app.compaction.assemble import build_compacted_body
from app.compaction.metrics import CompactionMetrics
from app.compaction.recompress import compaction_compression, compress_chunks, topic_compression
from app.errors import CorruptData, LlogError, LogGap, VersionMismatch
from app.settings import CompactionSettings
from app.storage import codec
from app.storage.cas import Done, Retry, cas_loop
from app.storage.chunks import DEFAULT_CHUNK_BYTES
from app.storage.compression import Codec
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import materialise_pending
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore
from app.storage.records import (
    Compaction,
    CompactionCursor,
    CompactionState,
    Control,
    IndexEntry,
    now_ms,
)
from app.storage.retention import trim_index
from app.storage.s3 import S3Store
from app.storage.spans import Span, index_span

Action = Literal["compacted", "resumed", "advanced_cursor", "abandoned", "nothing_to_do",
                 "raced", "trimmed"]
StepHook = Callable[[str], object]
"""Test hook called between protocol steps; it may raise, kill the process, or return an
awaitable (awaited before the next step) to pause the compactor there."""

STEPS = (
    "after_compacted_put",          # blob written, no Oxia change yet
    "after_compaction_record",      # meta/compaction created (WRITING_COMPACTED_INDEX)
    "after_index_overwrite",        # end key COMPACTED, state still WRITING_COMPACTED_INDEX
    "after_state_deleting_old",     # state DELETING_OLD, old keys still there
    "after_delete_range",           # old keys gone, state still DELETING_OLD
    "after_state_updating_cursor",  # state UPDATING_CURSOR, cursor not moved
    "after_cursor_put",             # cursor moved, meta/compaction still there
)
_MAX_CAS_ATTEMPTS = 16


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


@dataclass(frozen=True)
class CompactionOutcome:
    """What one ``compact_once`` call did.

    ``action``: ``compacted`` (a new range), ``resumed`` (finished an interrupted run found
    in ``resumed_from``), ``advanced_cursor`` (the entry at the cursor was already
    compacted), ``abandoned`` (dropped a stale ``meta/compaction`` that had changed
    nothing, or a blob that grew too old to reference), ``trimmed`` (index entries below
    the log start let go, see app/storage/retention.py), ``nothing_to_do`` (see
    ``reason``) or ``raced`` (another compactor changed the partition under this one;
    nothing was changed by this call's later steps).
    """

    tp: TopicPartition
    action: Action
    start_offset: int | None = None
    end_offset: int | None = None
    records: int = 0
    bytes: int = 0
    entries: int = 0
    data_key: str | None = None
    resumed_from: CompactionState | None = None
    reason: str | None = None
    materialised_pending: bool = False
    cursor: int | None = None
    high_watermark: int | None = None

    @property
    def did_work(self) -> bool:
        """True if the partition changed, so another call may find more to do."""
        return self.action in ("compacted", "resumed", "advanced_cursor", "abandoned",
                               "trimmed")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tp"] = str(self.tp)
        return out


@dataclass
class _Cursor:
    offset: int
    version: int | None  # None: the record does not exist (treated as offset 1)
    record: CompactionCursor = field(default_factory=CompactionCursor)


class _Stale(Exception):
    """The in-flight record was dropped as stale (internal)."""


class Compactor:
    """Compacts one partition per call; safe to run from any number of processes."""

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
        self._crash_hook = crash_hook
        self._clock = clock

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
        found = await self._read_compaction(tp)
        if found is not None:
            record, version = found
            if self._metrics is not None:
                self._metrics.recoveries.labels(record.state).inc()
            return await self._drive(tp, record, version, resumed_from=record.state)
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
            cursor = await self._read_cursor(tp)
            scanned = await self._scan(tp, cursor.offset, self._config.max_entries)
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
        return await self._compact_run(tp, run, base)

    async def _compact_run(self, tp: TopicPartition, run: list[Span],
                           base: CompactionOutcome) -> CompactionOutcome:
        """Steps 4 and 5: write the blob, record the intent, then drive steps 6-8."""
        started = self._clock()
        with self._stage("read_write_blob"):
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
        await self._step("after_compacted_put")
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
        await self._step("after_compaction_record")
        outcome = await self._drive(tp, record, version, resumed_from=None)
        return dataclasses.replace(outcome, materialised_pending=base.materialised_pending,
                                   high_watermark=base.high_watermark)

    async def _drive(self, tp: TopicPartition, record: Compaction, version: int, *,
                     resumed_from: CompactionState | None) -> CompactionOutcome:
        """Steps 6-8 from ``record.state`` on; every step may be repeated by anyone.

        A version conflict means another compactor moved the record on (or finished
        the run): the next attempt follows what the record says now.
        """
        action: Action = "resumed" if resumed_from is not None else "compacted"
        done = CompactionOutcome(
            tp, action, record.start_offset, record.end_offset, record.msg_count,
            _int(record.extra.get("bytes")), _int(record.extra.get("entries")),
            record.data_key, resumed_from, cursor=record.end_offset + 1,
        )
        current = [(record, version)]

        async def attempt(_: int) -> Done[CompactionOutcome] | Retry:
            try:
                await self._run_steps(tp, *current[0])
                return Done(done)
            except _Stale:
                cursor = await self._read_cursor(tp)
                return Done(dataclasses.replace(
                    done, action="raced" if resumed_from is None else "abandoned",
                    records=0, bytes=0, entries=0, cursor=cursor.offset,
                    reason="the run did not start at the compaction cursor (stale selection)"))
            except VersionMismatch:
                followed = await self._follow(tp, current[0][0], done)
                if isinstance(followed, CompactionOutcome):
                    return Done(followed)
                current[0] = followed
                return Retry("conflict")

        return await cas_loop(attempt, attempts=_MAX_CAS_ATTEMPTS,
                              what=f"{tp}: meta/compaction kept changing under this compactor")

    async def _run_steps(self, tp: TopicPartition, record: Compaction, version: int) -> None:
        """Advance the run from its recorded state to the end (raises VersionMismatch)."""
        if record.state == "WRITING_COMPACTED_INDEX":
            with self._stage("swap_end_key"):
                await self._swap_end_key(tp, record, version)
            await self._step("after_index_overwrite")
            record, version = await self._advance_state(tp, record, version, "DELETING_OLD")
            await self._step("after_state_deleting_old")
        if record.state == "DELETING_OLD":
            with self._stage("delete_old"):
                await self._oxia.delete_range(
                    self._layout.index(tp, record.start_offset),
                    self._layout.index(tp, record.end_offset), tp.partition_key)
            await self._step("after_delete_range")
            record, version = await self._advance_state(tp, record, version, "UPDATING_CURSOR")
            await self._step("after_state_updating_cursor")
        with self._stage("advance_cursor"):
            await self._advance_cursor(tp, record.end_offset + 1)
        await self._step("after_cursor_put")
        # A mismatch means a concurrent resumer finished this run and a new run has
        # started since: that record is not ours to delete.
        with contextlib.suppress(VersionMismatch):
            await self._oxia.delete(self._layout.compaction(tp), tp.partition_key,
                                    expected_version=version)

    async def _follow(self, tp: TopicPartition, record: Compaction,
                      done: CompactionOutcome) -> tuple[Compaction, int] | CompactionOutcome:
        """After a conflict: the run's record as it is now, or how the run ended."""
        found = await self._read_compaction(tp)
        if found is not None and found[0].compaction_id == record.compaction_id:
            return found
        cursor = await self._read_cursor(tp)
        if cursor.offset > record.end_offset:
            return dataclasses.replace(done, cursor=cursor.offset,
                                       reason="finished by another compactor")
        return dataclasses.replace(done, action="raced", records=0, bytes=0, entries=0,
                                   cursor=cursor.offset, reason="dropped by another compactor")

    async def _swap_end_key(self, tp: TopicPartition, record: Compaction, version: int) -> None:
        """Step 6: the end key becomes the COMPACTED entry (unless it already is)."""
        cursor = await self._read_cursor(tp)
        if cursor.offset != record.start_offset:
            # Not a run that ever started at the cursor: it has changed nothing yet, so
            # dropping it is safe. (A VersionMismatch here goes back to _drive.)
            await self._oxia.delete(self._layout.compaction(tp), tp.partition_key,
                                    expected_version=version)
            raise _Stale()
        key = self._layout.index(tp, record.end_offset)
        compacted = record.compacted_entry()

        async def attempt(_: int) -> Done[None] | Retry:
            found = await self._oxia.get(key, tp.partition_key)
            if found is None:
                raise CorruptData(f"{tp}: {key} is missing while meta/compaction "
                                  f"[{record.start_offset}, {record.end_offset}] is in flight")
            entry = IndexEntry.from_json(found.value)
            if entry.type == "COMPACTED" and entry.data_key == record.data_key:
                return Done(None)  # done before a crash, or by a concurrent resumer
            start = record.end_offset - entry.msg_count + 1
            if entry.type != "WAL" or start != record.tail_entry_start_offset:
                raise CorruptData(
                    f"{tp}: {key} holds a {entry.type} entry starting at {start}, not the WAL "
                    f"entry starting at {record.tail_entry_start_offset} that compaction "
                    f"{record.compaction_id} selected")
            try:
                await self._oxia.put(key, compacted.to_json(), tp.partition_key,
                                     expected_version=found.version_id)
            except VersionMismatch:
                return Retry("conflict")  # most likely a concurrent resumer swapped it
            return Done(None)

        await cas_loop(attempt, attempts=_MAX_CAS_ATTEMPTS,
                       what=f"{tp}: {key} kept changing during compaction")

    async def _advance_state(self, tp: TopicPartition, record: Compaction, version: int,
                             state: CompactionState) -> tuple[Compaction, int]:
        updated = dataclasses.replace(record, state=state, extra=dict(record.extra))
        with self._stage("record_state"):
            new_version = await self._oxia.put(
                self._layout.compaction(tp), updated.to_json(), tp.partition_key,
                expected_version=version,
            )
        return updated, new_version

    # -- selection -----------------------------------------------------------------------

    def _select(self, scanned: list[Span]) -> tuple[list[Span], str | None]:
        """The run of WAL entries from the first one on, within the budgets.

        The byte budget is soft below ``min_entries``: a run always gets that many entries
        if they qualify, or one oversized entry would stop the cursor for good.
        """
        c = self._config
        newest_allowed = self._clock() - c.min_entry_age_ms
        run: list[Span] = []
        size = 0
        too_young = False
        for item in scanned:
            entry = item.entry
            if entry.type != "WAL" or (run and item.start != run[-1].end + 1):
                break
            if entry.created_at_ms > newest_allowed:
                too_young = True
                break
            item_bytes = entry.raw_length or entry.byte_length or 0  # as decompressed
            if len(run) >= c.max_entries or (
                len(run) >= c.min_entries and size + item_bytes > c.max_bytes
            ):
                break
            run.append(item)
            size += item_bytes
        if len(run) < c.min_entries:
            return [], "entries_too_young" if too_young else "too_few_entries"
        return run, None

    async def _skip_compacted(self, tp: TopicPartition, cursor: _Cursor, first: Span,
                              base: CompactionOutcome) -> CompactionOutcome:
        """Step 3's special case: the entry at the cursor is compacted already."""
        try:
            await self._put_cursor(tp, cursor, first.end + 1)
        except VersionMismatch:
            return dataclasses.replace(base, action="raced", reason="the cursor moved")
        return dataclasses.replace(base, action="advanced_cursor", start_offset=first.start,
                                   end_offset=first.end, cursor=first.end + 1)

    async def _misaligned(self, tp: TopicPartition, cursor: _Cursor, first: Span,
                          base: CompactionOutcome) -> CompactionOutcome:
        """The first entry at or above the cursor does not start at it."""
        again = await self._read_cursor(tp)
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
            self._oxia, self._layout, tp, attempts=_MAX_CAS_ATTEMPTS, metrics=None,
            by="compactor", min_age_ms=self._config.min_entry_age_ms, clock=self._clock)
        if found.done and self._metrics is not None:
            self._metrics.pending_materialised.inc()
        return found.done, found.control

    async def _read_compaction(self, tp: TopicPartition) -> tuple[Compaction, int] | None:
        found = await self._oxia.get(self._layout.compaction(tp), tp.partition_key)
        if found is None:
            return None
        return Compaction.from_json(found.value), found.version_id

    async def _read_cursor(self, tp: TopicPartition) -> _Cursor:
        found = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        if found is None:
            return _Cursor(1, None)
        record = CompactionCursor.from_json(found.value)
        return _Cursor(record.offset, found.version_id, record)

    async def _put_cursor(self, tp: TopicPartition, cursor: _Cursor, offset: int) -> None:
        """CAS the cursor from what was read to ``offset`` (raises VersionMismatch)."""
        updated = CompactionCursor(offset=offset, extra=dict(cursor.record.extra))
        await self._oxia.put(
            self._layout.compaction_cursor(tp), updated.to_json(), tp.partition_key,
            expected_version=EXPECT_NOT_EXISTS if cursor.version is None else cursor.version,
        )

    async def _advance_cursor(self, tp: TopicPartition, offset: int) -> None:
        """Move the cursor to ``offset`` unless it is there or beyond already (never back)."""

        async def attempt(_: int) -> Done[None] | Retry:
            cursor = await self._read_cursor(tp)
            if cursor.offset >= offset:
                return Done(None)
            try:
                await self._put_cursor(tp, cursor, offset)
            except VersionMismatch:
                return Retry("conflict")
            return Done(None)

        await cas_loop(attempt, attempts=_MAX_CAS_ATTEMPTS,
                       what=f"{tp}: the compaction cursor kept changing")

    async def _scan(self, tp: TopicPartition, from_offset: int, limit: int) -> list[Span]:
        records = await self._oxia.range_scan(
            self._layout.index(tp, from_offset), self._layout.index_scan_end(tp),
            tp.partition_key, limit=limit,
        )
        spans = (index_span(self._layout, tp, r.key, r.value, r.version_id) for r in records)
        return [span for span in spans if span is not None]

    # -- plumbing ------------------------------------------------------------------------

    async def _step(self, name: str) -> None:
        if self._crash_hook is not None:
            result = self._crash_hook(name)
            if inspect.isawaitable(result):
                await result

    def _stage(self, name: str) -> Any:
        if self._metrics is None:
            return contextlib.nullcontext()
        return self._metrics.stage(name)

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


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
