"""The writer: ``append_shared(groups)``, exactly the commit protocol of docs/protocol.md.

An append costs one Oxia round trip per partition in steady state: one request that
creates the index entry of the previous append still held in ``pending``
(create-if-absent, so it is idempotent) and then CASes ``meta/control`` to install the
new ``pending``; Oxia applies a request as one log entry, in order. Control values are
cached, and concurrent puts of many partitions share requests (see OxiaStore). A crash
at any point loses nothing acknowledged and blocks nobody: a committed append is either
still ``pending`` in control (readable from there) or in the index.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from app.errors import (
    CommitConflict,
    InvalidRequest,
    LlogError,
    PartitionFenced,
    StorageUnavailable,
    VersionMismatch,
)
from app.storage import codec
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metrics import StoreMetrics
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from app.storage.records import (
    CompactionCursor,
    Control,
    IndexEntry,
    LogState,
    Pending,
    now_ms,
)
from app.storage.s3 import S3Store


@dataclass(frozen=True)
class AppendGroup:
    """Records for one partition. ``idempotency_key`` makes the append happen at most
    once: a repeat with the same key answers the first append's offsets instead."""

    tp: TopicPartition
    records: Sequence[bytes]
    idempotency_key: str | None = None


@dataclass(frozen=True)
class AppendResult:
    tp: TopicPartition
    start_offset: int
    end_offset: int
    count: int
    index_key: str
    wal_uri: str


@dataclass(frozen=True)
class _Slice:
    data_key: str
    byte_offset: int
    byte_length: int
    crc32c: int
    count: int
    created_at_ms: int
    idempotency_key: str | None = None


# Control-record field holding the most recent idempotency keys of a partition and the
# offsets they were committed at; updated by the same CAS that commits, so "committed"
# and "remembered" can never disagree. Bounded: the oldest keys are forgotten first.
IDEMPOTENCY_FIELD = "idempotency"
IDEMPOTENCY_WINDOW = 64


@dataclass
class _CachedControl:
    control: Control
    version: int


class CrashPoint(Exception):
    """Raised by a test hook to stop the writer between two protocol steps."""


class LogWriter:
    """Appends record groups to many partitions through one shared WAL blob.

    It holds caches only (control records, initialised partitions) and runs no
    background work; ``async with`` is accepted for symmetry with the store clients.
    """

    def __init__(
        self,
        oxia: OxiaStore,
        s3: S3Store,
        layout: KeyLayout,
        metrics: StoreMetrics,
        *,
        max_attempts: int = 64,
        crash_hook: object = None,
    ) -> None:
        self._oxia = oxia
        self._s3 = s3
        self._layout = layout
        self._metrics = metrics
        self._max_attempts = max_attempts
        self._initialised: set[TopicPartition] = set()
        self._controls: dict[TopicPartition, _CachedControl] = {}
        self._materialised: dict[TopicPartition, str] = {}
        self._locks: dict[TopicPartition, anyio.Lock] = {}
        # Tests pass a callable(step: str) that may raise CrashPoint to simulate a crash.
        self._crash_hook = crash_hook

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _step(self, name: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(name)  # type: ignore[operator]

    # -- public API ------------------------------------------------------------------

    async def append_shared(
        self, groups: Sequence[AppendGroup]
    ) -> list[AppendResult | LlogError]:
        """Append every group; one result (or the partition's error) per group, in order.

        One partition failing never affects another. Raises only when nothing could be
        committed at all (invalid input, or the shared blob could not be written).
        """
        if not groups:
            raise InvalidRequest("append_shared needs at least one group")
        seen: set[TopicPartition] = set()
        for group in groups:
            if group.tp in seen:
                raise InvalidRequest(f"{group.tp} appears twice in one append")
            seen.add(group.tp)
            if not group.records:
                raise InvalidRequest(f"{group.tp}: an append needs at least one record")

        created = now_ms()
        blob, parts = codec.encode_shared_blob(
            [(g.tp.topic, g.tp.partition, g.records) for g in groups], created
        )
        key = self._layout.shared_wal_object(uuid.uuid4().hex)
        await self._s3.put(key, blob)
        self._metrics.shared_blob_bytes.observe(len(blob))
        self._step("after_blob_put")
        uri = self._layout.uri(key)

        results: list[AppendResult | LlogError] = [
            StorageUnavailable("not attempted") for _ in groups
        ]

        async def commit_one(i: int, group: AppendGroup, part: codec.BlobPart) -> None:
            piece = _Slice(uri, part.body_offset, part.body_length, part.crc32c,
                           len(group.records), created, group.idempotency_key)
            try:
                results[i] = await self.commit(group.tp, piece)
            except LlogError as exc:
                results[i] = exc

        async with anyio.create_task_group() as tg:
            for i, (group, part) in enumerate(zip(groups, parts, strict=True)):
                tg.start_soon(commit_one, i, group, part)
        for group, result in zip(groups, results, strict=True):
            if isinstance(result, AppendResult):
                self._metrics.appended_records.inc(result.count)
                self._metrics.appended_bytes.inc(sum(len(r) for r in group.records))
        return results

    async def ensure_partition(self, tp: TopicPartition) -> None:
        """Create ``meta/control`` and ``meta/compaction-cursor`` if absent (idempotent)."""
        if tp in self._initialised:
            return
        control = Control()
        try:
            version = await self._oxia.put(
                self._layout.control(tp), control.to_json(), tp.partition_key,
                expected_version=EXPECT_NOT_EXISTS,
            )
            self._controls[tp] = _CachedControl(control, version)
        except VersionMismatch:
            pass  # already initialised
        with contextlib.suppress(VersionMismatch):  # already initialised
            await self._oxia.put(
                self._layout.compaction_cursor(tp), CompactionCursor(offset=1).to_json(),
                tp.partition_key, expected_version=EXPECT_NOT_EXISTS,
            )
        self._initialised.add(tp)

    def owns_version(self, tp: TopicPartition, version: int) -> bool:
        """True if ``version`` of the partition's control record is our own last write."""
        cached = self._controls.get(tp)
        return cached is not None and cached.version == version

    async def fence(self, tp: TopicPartition) -> None:
        await self._set_state(tp, "FENCED")

    async def unfence(self, tp: TopicPartition) -> None:
        """Reopen a fenced partition: an explicit operator action."""
        await self._set_state(tp, "OPEN")

    async def materialise_pending(self, tp: TopicPartition) -> bool:
        """Write the index entry of the partition's pending append and clear ``pending``.

        Used by compaction and repair tools; True if there was something to do.
        """
        for _ in range(self._max_attempts):
            cached = await self._read_control(tp)
            if cached is None or cached.control.pending is None:
                return False
            pending = cached.control.pending
            await self._write_index(tp, pending, by="repair")
            self._step("before_clear_pending")
            cleared = Control(cached.control.log_state, cached.control.sequence_counter,
                              None, dict(cached.control.extra))
            try:
                version = await self._oxia.put(
                    self._layout.control(tp), cleared.to_json(), tp.partition_key,
                    expected_version=cached.version,
                )
            except VersionMismatch:
                self._controls.pop(tp, None)
                continue
            self._controls[tp] = _CachedControl(cleared, version)
            return True
        raise CommitConflict(f"{tp}: could not clear pending after {self._max_attempts} tries")

    # -- commit ----------------------------------------------------------------------

    def _lock(self, tp: TopicPartition) -> anyio.Lock:
        lock = self._locks.get(tp)
        if lock is None:
            lock = self._locks[tp] = anyio.Lock()
        return lock

    async def _read_control(self, tp: TopicPartition) -> _CachedControl | None:
        record = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        if record is None:
            self._controls.pop(tp, None)
            return None
        cached = _CachedControl(Control.from_json(record.value), record.version_id)
        self._controls[tp] = cached
        return cached

    async def _write_index(self, tp: TopicPartition, pending: Pending, *, by: str) -> None:
        """Materialise ``pending`` as its index entry; create-if-absent, so idempotent.

        An existing key means it was materialised already, or a compaction has since
        replaced it with a COMPACTED entry, which must never be overwritten.
        """
        if self._materialised.get(tp) == pending.append_id:
            return
        try:
            await self._oxia.put(
                self._layout.index(tp, pending.end_offset),
                pending.index_entry().to_json(), tp.partition_key,
                expected_version=EXPECT_NOT_EXISTS,
            )
            self._metrics.pending_materialised.labels(by).inc()
        except VersionMismatch:
            pass
        self._step("after_index_put")
        self._materialised[tp] = pending.append_id

    async def _check_previous_index(self, tp: TopicPartition, previous: Pending,
                                    outcome: int | Exception) -> None:
        """After a CAS that retired ``previous``: its index entry must exist now."""
        if isinstance(outcome, int):
            self._metrics.pending_materialised.labels("next_writer").inc()
        elif not isinstance(outcome, VersionMismatch):  # not "already exists" either
            # Cannot happen when Oxia applies the request as one entry; if it ever did,
            # we still hold the retired append and write its entry now.
            await self._write_index(tp, previous, by="next_writer")
        self._materialised[tp] = previous.append_id

    async def commit(self, tp: TopicPartition, piece: _Slice) -> AppendResult:
        async with self._lock(tp):
            return await self._commit_locked(tp, piece)

    async def _commit_locked(self, tp: TopicPartition, piece: _Slice) -> AppendResult:
        await self.ensure_partition(tp)
        append_id = uuid.uuid4().hex
        cached = self._controls.get(tp) or await self._read_control(tp)
        # (expected version, end offset) of CAS attempts whose outcome is unknown.
        in_doubt: list[tuple[int, int]] = []
        for attempt in range(self._max_attempts):
            if cached is None:
                raise StorageUnavailable(f"{tp}: meta/control vanished after initialisation")
            control = cached.control
            pending = control.pending
            if pending is not None and pending.append_id == append_id:
                return self._result(tp, pending)
            if in_doubt:
                won = await self._find_in_doubt(tp, append_id, in_doubt, cached.version)
                if won is not None:
                    return self._result(tp, won)
            if piece.idempotency_key is not None:
                seen = _remembered(control, piece.idempotency_key)
                if seen is not None:
                    return seen.result(tp, self._layout)
            if control.fenced:
                raise PartitionFenced(f"{tp} is fenced: appends are refused")
            start = control.sequence_counter + 1
            mine = Pending(
                append_id=append_id,
                start_offset=start,
                end_offset=start + piece.count - 1,
                msg_count=piece.count,
                data_key=piece.data_key,
                byte_offset=piece.byte_offset,
                byte_length=piece.byte_length,
                created_at_ms=piece.created_at_ms,
                crc32c=piece.crc32c,
            )
            extra = dict(control.extra)
            if piece.idempotency_key is not None:
                extra[IDEMPOTENCY_FIELD] = _remember(control, piece.idempotency_key, mine)
            updated = Control(control.log_state, mine.end_offset, mine, extra)
            # The previous append's index entry goes first in the same Oxia request as
            # our CAS: Oxia applies one request as one log entry, in order, so the CAS
            # can never retire a pending append whose index entry does not exist.
            puts = []
            materialise = pending is not None and self._materialised.get(tp) != pending.append_id
            if materialise:
                assert pending is not None
                puts.append(PutSpec(self._layout.index(tp, pending.end_offset),
                                    pending.index_entry().to_json(), tp.partition_key,
                                    EXPECT_NOT_EXISTS))
            puts.append(PutSpec(self._layout.control(tp), updated.to_json(), tp.partition_key,
                                cached.version))
            outcomes = await self._oxia.put_group(puts)
            outcome = outcomes[-1]
            if isinstance(outcome, VersionMismatch):
                self._metrics.cas_conflicts.inc()
                if attempt >= 2:
                    await anyio.sleep(random.uniform(0, min(0.05, 0.002 * attempt)))
                cached = await self._read_control(tp)
                continue
            if isinstance(outcome, Exception):
                # The CAS may or may not have been applied: remember it and find out.
                in_doubt.append((cached.version, mine.end_offset))
                self._controls.pop(tp, None)
                cached = await self._read_control(tp)
                continue
            # Committed: the records are durable and readable from here on.
            self._controls[tp] = _CachedControl(updated, outcome)
            if materialise:
                assert pending is not None
                await self._check_previous_index(tp, pending, outcomes[0])
            self._step("after_pending_cas")
            return self._result(tp, mine)
        raise CommitConflict(
            f"{tp}: gave up after {self._max_attempts} compare-and-set attempts on "
            f"meta/control (heavy contention); the append was not committed"
        )

    async def _find_in_doubt(
        self, tp: TopicPartition, append_id: str, in_doubt: list[tuple[int, int]],
        current_version: int,
    ) -> Pending | None:
        """Did an earlier, unanswered CAS of ours land? (It did if its index entry says so.)

        A CAS whose expected version is no longer current can never apply later, so
        once the index does not show it, it is settled as not committed.
        """
        for expected_version, end in list(in_doubt):
            if expected_version == current_version:
                continue  # not applied (yet); retrying with the same version settles it
            record = await self._oxia.get(self._layout.index(tp, end), tp.partition_key)
            if record is not None:
                entry = IndexEntry.from_json(record.value)
                if entry.append_id == append_id:
                    return Pending(
                        append_id=append_id, start_offset=end - entry.msg_count + 1,
                        end_offset=end, msg_count=entry.msg_count, data_key=entry.data_key,
                        byte_offset=entry.byte_offset, byte_length=entry.byte_length,
                        created_at_ms=entry.created_at_ms, crc32c=entry.crc32c,
                    )
            in_doubt.remove((expected_version, end))
        return None

    def _result(self, tp: TopicPartition, pending: Pending) -> AppendResult:
        return AppendResult(
            tp=tp,
            start_offset=pending.start_offset,
            end_offset=pending.end_offset,
            count=pending.msg_count,
            index_key=self._layout.index(tp, pending.end_offset),
            wal_uri=pending.data_key,
        )

    async def _set_state(self, tp: TopicPartition, state: LogState) -> None:
        await self.ensure_partition(tp)
        async with self._lock(tp):
            for _ in range(self._max_attempts):
                cached = await self._read_control(tp)
                if cached is None:
                    raise StorageUnavailable(f"{tp}: meta/control is missing")
                if cached.control.log_state == state:
                    return
                c = cached.control
                updated = Control(state, c.sequence_counter, c.pending, dict(c.extra))
                try:
                    version = await self._oxia.put(
                        self._layout.control(tp), updated.to_json(), tp.partition_key,
                        expected_version=cached.version,
                    )
                except VersionMismatch:
                    continue
                self._controls[tp] = _CachedControl(updated, version)
                return
        raise CommitConflict(f"{tp}: could not set log_state={state}")


@dataclass(frozen=True)
class _Remembered:
    start: int
    end: int
    data_key: str

    def result(self, tp: TopicPartition, layout: KeyLayout) -> AppendResult:
        return AppendResult(tp, self.start, self.end, self.end - self.start + 1,
                            layout.index(tp, self.end), self.data_key)


def _remembered(control: Control, key: str) -> _Remembered | None:
    table = control.extra.get(IDEMPOTENCY_FIELD)
    if not isinstance(table, dict):
        return None
    entry = table.get(key)
    if (not isinstance(entry, list) or len(entry) != 3
            or not isinstance(entry[0], int) or not isinstance(entry[1], int)):
        return None
    return _Remembered(entry[0], entry[1], str(entry[2]))


def _remember(control: Control, key: str, pending: Pending) -> dict[str, list[object]]:
    table = control.extra.get(IDEMPOTENCY_FIELD)
    out: dict[str, list[object]] = dict(table) if isinstance(table, dict) else {}
    out.pop(key, None)
    out[key] = [pending.start_offset, pending.end_offset, pending.data_key]
    while len(out) > IDEMPOTENCY_WINDOW:
        del out[next(iter(out))]
    return out
