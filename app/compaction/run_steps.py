"""Steps 6 to 8 of a compaction run (docs/protocol.md), from the state its
``meta/compaction`` record says on: swap the run's end key for the COMPACTED entry,
delete the other keys, advance the cursor, delete the record. Every step may be repeated
by anyone; a version conflict means another compactor moved the record on (or finished
the run), and the next attempt follows what the record says now. The hook between steps
is how the crash tests stop a run anywhere (tests/test_compaction_crash.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from app.compaction.metrics import CompactionMetrics
from app.compaction.outcome import Action, CompactionOutcome
from app.compaction.progress import MAX_CAS_ATTEMPTS, CompactionProgress
from app.errors import CorruptData, VersionMismatch
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Compaction, CompactionState, IndexEntry
from app.stores.oxia.store import OxiaStore

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


class _Stale(Exception):
    """The in-flight record was dropped as stale (internal)."""


def timed(metrics: CompactionMetrics | None, name: str) -> Any:
    """A context timing stage ``name`` of a run (nothing without metrics)."""
    if metrics is None:
        return contextlib.nullcontext()
    return metrics.stage(name)


class RunSteps:
    """Drives runs recorded in ``meta/compaction`` to their end; holds the hook called
    between steps."""

    def __init__(self, oxia: OxiaStore, layout: KeyLayout, progress: CompactionProgress, *,
                 metrics: CompactionMetrics | None, step_hook: StepHook | None) -> None:
        self._oxia = oxia
        self._layout = layout
        self._progress = progress
        self._metrics = metrics
        self._step_hook = step_hook

    async def step(self, name: str) -> None:
        """Between two steps: call the hook (awaiting what it returns)."""
        if self._step_hook is not None:
            result = self._step_hook(name)
            if inspect.isawaitable(result):
                await result

    def _stage(self, name: str) -> Any:
        return timed(self._metrics, name)

    async def drive(self, tp: TopicPartition, record: Compaction, version: int, *,
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
                cursor = await self._progress.cursor(tp)
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

        return await cas_loop(attempt, attempts=MAX_CAS_ATTEMPTS,
                              what=f"{tp}: meta/compaction kept changing under this compactor")

    async def _run_steps(self, tp: TopicPartition, record: Compaction, version: int) -> None:
        """Advance the run from its recorded state to the end (raises VersionMismatch)."""
        if record.state == "WRITING_COMPACTED_INDEX":
            with self._stage("swap_end_key"):
                await self._swap_end_key(tp, record, version)
            await self.step("after_index_overwrite")
            record, version = await self._advance_state(tp, record, version, "DELETING_OLD")
            await self.step("after_state_deleting_old")
        if record.state == "DELETING_OLD":
            with self._stage("delete_old"):
                await self._oxia.delete_range(
                    self._layout.index(tp, record.start_offset),
                    self._layout.index(tp, record.end_offset), tp.partition_key)
            await self.step("after_delete_range")
            record, version = await self._advance_state(tp, record, version, "UPDATING_CURSOR")
            await self.step("after_state_updating_cursor")
        with self._stage("advance_cursor"):
            await self._progress.advance_cursor(tp, record.end_offset + 1)
        await self.step("after_cursor_put")
        # A mismatch means a concurrent resumer finished this run and a new run has
        # started since: that record is not ours to delete.
        with contextlib.suppress(VersionMismatch):
            await self._oxia.delete(self._layout.compaction(tp), tp.partition_key,
                                    expected_version=version)

    async def _follow(self, tp: TopicPartition, record: Compaction,
                      done: CompactionOutcome) -> tuple[Compaction, int] | CompactionOutcome:
        """After a conflict: the run's record as it is now, or how the run ended."""
        found = await self._progress.in_flight(tp)
        if found is not None and found[0].compaction_id == record.compaction_id:
            return found
        cursor = await self._progress.cursor(tp)
        if cursor.offset > record.end_offset:
            return dataclasses.replace(done, cursor=cursor.offset,
                                       reason="finished by another compactor")
        return dataclasses.replace(done, action="raced", records=0, bytes=0, entries=0,
                                   cursor=cursor.offset, reason="dropped by another compactor")

    async def _swap_end_key(self, tp: TopicPartition, record: Compaction, version: int) -> None:
        """Step 6: the end key becomes the COMPACTED entry (unless it already is)."""
        cursor = await self._progress.cursor(tp)
        if cursor.offset != record.start_offset:
            # Not a run that ever started at the cursor: it has changed nothing yet, so
            # dropping it is safe. (A VersionMismatch here goes back to drive.)
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

        await cas_loop(attempt, attempts=MAX_CAS_ATTEMPTS,
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


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
