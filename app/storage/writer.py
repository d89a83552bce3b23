"""The writer: ``append_shared(groups)``, exactly the commit protocol of docs/protocol.md.

An append costs one Oxia round trip per partition in steady state: one request that
creates the index entry of the previous append still held in ``pending``
(create-if-absent, so it is idempotent) and then CASes ``meta/control`` to install the
new ``pending``; Oxia applies a request as one log entry, in order. Control values are
cached, and concurrent puts of many partitions share requests (see OxiaStore). A crash
at any point loses nothing acknowledged and blocks nobody: a committed append is either
still ``pending`` in control (readable from there) or in the index.

The writer packs one blob per flush (without the groups already past their
``commit_by``, answered at once), uploads it, and commits each partition's slice
through its own :class:`~app.storage.partition_commit.PartitionCommit` (settle, leave
out groups past their ``commit_by``: a produce request's deadline, a forward's commit
window; refuse an expired blob or a fenced partition, compare-and-set), with the control
records kept in a :class:`~app.storage.control_cache.ControlCache`; it also initialises partitions,
fences them and materialises a pending append for repair tools.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from cachetools import LRUCache

from app.errors import (
    CommitConflict,
    CommitInDoubt,
    InvalidRequest,
    LlogError,
    StorageUnavailable,
    VersionMismatch,
)
from app.settings import WriterSettings
from app.storage import codec
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.cas import Done, Retry, cas_loop
from app.storage.compression import Codec
from app.storage.control_cache import ControlCache
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import materialise_pending
from app.storage.metadata import (
    CompactionCursor,
    Control,
    LogState,
    now_ms,
)
from app.storage.own_writes import Foreign
from app.storage.partition_append import PartitionAppend, in_sequence_order
from app.storage.partition_commit import (
    CommitRules,
    PartitionCommit,
    Reupload,
    Settled,
    UploadedSlice,
)
from app.storage.sequence_turns import Flush, SequenceTurns
from app.storage.topic_catalog import TopicCatalog
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from app.stores.s3.store import S3Store

log = logging.getLogger(__name__)

# A partition whose append met already-committed idempotency keys is uploaded again
# without them; a second round always settles it, a third is a safety margin. Uploads
# without groups past their deadline (``commit_by``) are not counted: each answers a
# group, so they end by themselves (groups with different deadlines may need several).
MAX_UPLOAD_ROUNDS = 3
DEFAULT_COMMIT_HORIZON_MS = 1_800_000  # half of the default retry horizon
DEFAULT_PENDING_REREAD_MS = 15_000  # half of the default compaction minimum entry age
DEFAULT_MAX_CACHED_PARTITIONS = 100_000
# How long a commit keeps trying while Oxia does not answer (a shard electing a leader).
DEFAULT_OUTAGE_S = 10.0


class CrashPoint(BaseException):
    """Raised by a test hook to stop the writer between two protocol steps, as if the
    process died there (a BaseException, so no error handling of the writer's catches
    it)."""


class LogWriter:
    """Appends record groups to many partitions through one shared WAL blob.

    It holds bounded caches only (control records, initialised partitions) and runs no
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
        crash_hook: Callable[[str], object] | None = None,
        clock: Callable[[], int] = now_ms,
        commit_horizon_ms: int = DEFAULT_COMMIT_HORIZON_MS,
        pending_reread_ms: int = DEFAULT_PENDING_REREAD_MS,
        max_cached_partitions: int = DEFAULT_MAX_CACHED_PARTITIONS,
        encoding: str = codec.ENCODING_V3,
        outage_s: float = DEFAULT_OUTAGE_S,
        on_foreign: Foreign | None = None,
    ) -> None:
        if encoding not in (codec.ENCODING_V1, codec.ENCODING_V3):
            raise ValueError(f"a writer writes {codec.ENCODING_V3} or {codec.ENCODING_V1}, "
                             f"not {encoding!r}")
        self._encoding = encoding
        self._oxia = oxia
        self._s3 = s3
        self._layout = layout
        self._metrics = metrics
        self._max_attempts = max_attempts
        # Tests pass a callable(step: str) that may raise CrashPoint to simulate a crash.
        self._crash_hook = crash_hook
        self._clock = clock
        self._initialised: LRUCache[TopicPartition, bool] = LRUCache(max_cached_partitions)
        self._controls = ControlCache(oxia, layout, clock=clock,
                                      pending_reread_ms=pending_reread_ms,
                                      max_partitions=max_cached_partitions,
                                      on_foreign=on_foreign)
        # The control versions this process wrote (change notifications consult them; a
        # foreign one seen while a write was in flight goes to ``on_foreign`` once it ends).
        self.own = self._controls.own
        self._rules = CommitRules(oxia, layout, metrics, self._controls, clock,
                                  commit_horizon_ms, outage_s, self._step)
        self._locks: weakref.WeakValueDictionary[TopicPartition, anyio.Lock] = (
            weakref.WeakValueDictionary())
        self._turns = SequenceTurns()
        self._catalog = TopicCatalog(oxia, layout)

    @classmethod
    def from_settings(cls, oxia: OxiaStore, s3: S3Store, layout: KeyLayout,
                      metrics: StoreMetrics, writer: WriterSettings,
                      **overrides: Any) -> LogWriter:
        """A writer configured from the shared settings, as every writer of a store must
        be: vacuum deletes an unreferenced object once it is older than
        ``LLOG_RETRY_HORIZON_MS``, which is safe only if no writer commits a blob older
        than its safe share; and compaction takes entries as young as
        ``LLOG_COMPACTION_MIN_ENTRY_AGE_MS``, so a cached pending append is read again
        at half that age. A writer built with the constructor's defaults instead would
        assume the default horizon whatever the store's operators configured."""
        options: dict[str, Any] = {
            "max_attempts": writer.commit_max_attempts,
            "commit_horizon_ms": writer.retry_horizon_safe_ms,
            "pending_reread_ms": writer.compaction_min_entry_age_ms // 2,
            "encoding": writer.wal_encoding,
            "outage_s": writer.oxia_outage_s,
        }
        return cls(oxia, s3, layout, metrics, **{**options, **overrides})

    async def __aenter__(self) -> LogWriter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _step(self, name: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(name)

    # -- public API ------------------------------------------------------------------

    async def append_shared(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """Append every group; one outcome per group, in order.

        Groups of one partition are committed together, in order (a producer's in the
        order of its sequence), as one append; one partition failing never affects
        another. Raises only for invalid input.
        """
        if not groups:
            raise InvalidRequest("append_shared needs at least one group")
        parts: dict[TopicPartition, PartitionAppend] = {}
        for i in in_sequence_order(groups):
            group = groups[i]
            if not group.records:
                raise InvalidRequest(f"{group.tp}: an append needs at least one record")
            parts.setdefault(group.tp, PartitionAppend(group.tp)).add(i, group)
        outcomes: list[AppendOutcome | None] = [None] * len(groups)
        todo = list(parts.values())
        flush = self._turns.begin(groups)
        for part in todo:
            part.flush = flush.number
        try:
            while todo:
                todo = await self._upload_and_commit(todo, outcomes, flush)
                for part in [p for p in todo if p.uploads > MAX_UPLOAD_ROUNDS]:
                    part.fail(outcomes, CommitConflict(
                        f"{part.tp}: idempotency keys kept turning out committed; "
                        "not appended"))
                todo = [p for p in todo if p.uploads <= MAX_UPLOAD_ROUNDS]
        finally:
            self._turns.end(flush)
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(groups)
        records = size = 0  # counted once per flush: a counter's inc takes its lock
        for group, outcome in zip(groups, done, strict=True):
            if isinstance(outcome, AppendResult) and not outcome.duplicate:
                records += outcome.count
                size += group.size
        if records:
            self._metrics.appended_records.inc(records)
            self._metrics.appended_bytes.inc(size)
        return done

    async def ensure_partition(self, tp: TopicPartition) -> None:
        """Create ``meta/control`` and ``meta/compaction-cursor`` if absent (idempotent)."""
        if tp in self._initialised:
            return
        control = Control()
        created, cursor = await self._controls.put(tp, [
            PutSpec(self._layout.control(tp), control.to_json(), tp.partition_key,
                    EXPECT_NOT_EXISTS),
            PutSpec(self._layout.compaction_cursor(tp), CompactionCursor(offset=1).to_json(),
                    tp.partition_key, EXPECT_NOT_EXISTS),
        ], control_at=0)
        for outcome in (created, cursor):  # "exists" means initialised already
            if isinstance(outcome, Exception) and not isinstance(outcome, VersionMismatch):
                raise outcome
        if isinstance(created, int):
            self._controls.keep(tp, control, created)
        # Whoever writes a partition (a broker, a backfill) keeps the catalog complete,
        # so compaction and the jobs find every partition there.
        await self._catalog.register(tp.topic, tp.partition)
        self._initialised[tp] = True

    def owns_version(self, tp: TopicPartition, version: int) -> bool:
        """True if ``version`` of the partition's control record is one of this
        process's recent own writes (change notifications for it need not wake anyone)."""
        return self.own.owns(tp, version)

    async def fence(self, tp: TopicPartition) -> None:
        await self._set_state(tp, "FENCED")

    async def unfence(self, tp: TopicPartition) -> None:
        """Reopen a fenced partition: an explicit operator action."""
        await self._set_state(tp, "OPEN")

    async def materialise_pending(self, tp: TopicPartition) -> bool:
        """Write the index entry of the partition's pending append and clear ``pending``.

        Used by repair tools; True if there was something to do.
        """
        self._step("before_materialise")
        async with self._lock(tp):
            with self.own.writing(tp):
                done = await materialise_pending(
                    self._oxia, self._layout, tp, attempts=self._max_attempts,
                    metrics=self._metrics, by="repair", clock=self._clock)
                if done.control is not None and done.version is not None:
                    self._controls.keep(tp, done.control, done.version)
                    if done.done:
                        self.own.wrote(tp, done.version)
        self._step("after_materialise")
        return done.done

    # -- one flush round --------------------------------------------------------------

    async def _upload_and_commit(self, parts: list[PartitionAppend],
                                 outcomes: list[AppendOutcome | None], flush: Flush
                                 ) -> list[PartitionAppend]:
        """Upload one blob for ``parts`` and commit each; returns what must go again."""
        parts = _without_late(parts, outcomes)
        if not parts:
            return []
        created = self._clock()
        blob, bodies = await _pack([p.body(self._encoding) for p in parts], created)
        key = self._layout.shared_wal_object(uuid.uuid4().hex)
        try:
            await self._s3.put(key, blob)  # its parts, written without joining them
        except LlogError as exc:
            for part in parts:
                part.fail(outcomes, exc)
                self._turns.release(flush, part.tp)
            return []
        self._metrics.shared_blob_bytes.observe(
            bodies[-1].body_offset + bodies[-1].body_length)
        for body in bodies:
            self._metrics.stored_bytes.labels("wal").inc(body.body_length)
            self._metrics.stored_raw_bytes.labels("wal").inc(body.raw_length or
                                                             body.body_length)
        self._step("after_blob_put")
        uri = self._layout.uri(key)
        again: list[PartitionAppend] = []

        async def commit_one(part: PartitionAppend, body: codec.SliceEntry) -> None:
            upload = UploadedSlice(uri, body.body_offset, body.body_length, body.crc32c,
                             body.msg_count, created, body.encoding,
                             None if body.codec is Codec.NONE else body.codec.value,
                             body.raw_length)
            try:
                result = await self._commit(PartitionCommit(self._rules, part, upload))
            except LlogError as exc:
                part.fail(outcomes, exc)
                self._turns.release(flush, part.tp)
                return
            except Exception as exc:  # a defect: the CAS may or may not have landed
                log.exception("%s: unexpected error while committing", part.tp)
                part.fail(outcomes, CommitInDoubt(f"{part.tp}: unexpected {exc!r}"))
                self._turns.release(flush, part.tp)
                return
            if not isinstance(result, Reupload):
                self._turns.release(flush, part.tp)  # this partition's groups are settled
            if isinstance(result, Reupload):
                part.resolve(outcomes, result.answered, result.part)
                again.append(result.part)
            else:
                part.resolve(outcomes, result)

        async with anyio.create_task_group() as tg:
            for part, body in zip(parts, bodies, strict=True):
                tg.start_soon(commit_one, part, body)
        return again

    # -- commit ----------------------------------------------------------------------

    def _lock(self, tp: TopicPartition) -> anyio.Lock:
        lock = self._locks.get(tp)
        if lock is None:
            lock = anyio.Lock()
            self._locks[tp] = lock
        return lock

    async def _commit(self, c: PartitionCommit) -> Settled:
        # A producer's group before one of ours, in an earlier flush still under way:
        # committed first, so ours is not refused as out of order (SequenceTurns).
        # Never past the groups' own deadline: their commit then answers them as late.
        deadlines = c.part.commit_by()
        with anyio.move_on_after(max(0.0, min(deadlines) - time.monotonic())
                                 if deadlines else None):
            await self._turns.wait(c.part.flush, c.tp,
                                   [m.group.producer for m in c.part.members
                                    if m.group.producer is not None])
        async with self._lock(c.tp):
            while True:
                try:
                    await self.ensure_partition(c.tp)
                    break
                except StorageUnavailable:
                    if not await c.outage.pause():
                        raise
            try:
                return await cas_loop(
                    lambda n: c.attempt_through_outage(), attempts=self._max_attempts,
                    what=f"{c.tp}: commit", retries=self._metrics.cas_retries, op="commit")
            except (StorageUnavailable, CommitConflict) as exc:
                if c.in_doubt:  # an unanswered CAS may yet have landed: never "not written"
                    raise CommitInDoubt(f"{exc}; an earlier commit attempt of these records "
                                        "went unanswered, so they may have been written"
                                        ) from exc
                raise

    # -- control cache -----------------------------------------------------------------

    async def _set_state(self, tp: TopicPartition, state: LogState) -> None:
        await self.ensure_partition(tp)

        async def attempt(_: int) -> Done[None] | Retry:
            current = await self._controls.read(tp)
            if current is None:
                raise StorageUnavailable(f"{tp}: meta/control is missing")
            c = current.control
            if c.log_state == state:
                return Done(None)
            updated = dataclasses.replace(c, log_state=state, extra=dict(c.extra))
            (outcome,) = await self._controls.put(tp, [PutSpec(
                self._layout.control(tp), updated.to_json(), tp.partition_key,
                current.version)], control_at=0)
            if isinstance(outcome, VersionMismatch):
                return Retry("conflict")
            if isinstance(outcome, Exception):
                raise outcome
            self._controls.keep(tp, updated, outcome)
            return Done(None)

        async with self._lock(tp):
            await cas_loop(attempt, attempts=self._max_attempts,
                           what=f"{tp}: set log_state={state}",
                           retries=self._metrics.cas_retries, op="log_state")


def _without_late(parts: list[PartitionAppend], outcomes: list[AppendOutcome | None]
                  ) -> list[PartitionAppend]:
    """``parts`` without their groups already past their ``commit_by``, which are
    answered as their deadline says: no commit of theirs may be sent any more, so
    uploading them would only delay the others (and leave an orphan behind)."""
    now, kept = time.monotonic(), []
    for part in parts:
        late = part.late(now, f"{part.tp}: the records' deadline passed before they "
                         "were uploaded; nothing was written")
        if not late:
            kept.append(part)
            continue
        rest = part.without_unwritten(late)
        part.resolve(outcomes, late, rest)
        if rest.members:
            kept.append(rest)
    return kept


async def _pack(bodies: list[codec.SliceBody], created_at_ms: int
                ) -> tuple[list[bytes | memoryview], list[codec.SliceEntry]]:
    """The flush's LLS1 blob, as its parts: its head and the bodies' parts, views into
    the requests they came in, which the upload writes as they are (no copy of the
    blob is made). Compressing bodies (a few milliseconds per MiB) is done in a worker
    thread, never on the event loop; a flush that compresses nothing is packed in
    place, as a thread hop would cost more than it does."""
    if codec.compresses(bodies):
        return await anyio.to_thread.run_sync(codec.pack_shared_parts, bodies, created_at_ms)
    return codec.pack_shared_parts(bodies, created_at_ms)
