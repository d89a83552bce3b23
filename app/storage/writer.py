"""The writer: ``append_shared(groups)``, exactly the commit protocol of docs/protocol.md.

An append costs one Oxia round trip per partition in steady state: one request that
creates the index entry of the previous append still held in ``pending``
(create-if-absent, so it is idempotent) and then CASes ``meta/control`` to install the
new ``pending``; Oxia applies a request as one log entry, in order. Control values are
cached, and concurrent puts of many partitions share requests (see OxiaStore). A crash
at any point loses nothing acknowledged and blocks nobody: a committed append is either
still ``pending`` in control (readable from there) or in the index.

One commit is a sequence of named steps (see :meth:`LogWriter._attempt`): settle what an
earlier, unanswered attempt did; refuse a blob that grew too old; refuse a fenced
partition; compare-and-set. :func:`~app.storage.cas.cas_loop` repeats the attempt after
a conflict.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from cachetools import LRUCache

from app.errors import (
    CommitConflict,
    CommitExpired,
    CommitInDoubt,
    InvalidRequest,
    LlogError,
    PartitionFenced,
    StorageUnavailable,
    VersionMismatch,
)
from app.settings import Settings
from app.storage import codec
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.batch import partition_body
from app.storage.cas import Done, Outage, Retry, cas_loop
from app.storage.compression import Codec
from app.storage.idempotency import IDEMPOTENCY_FIELD, Remembered, remember, remembered
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import ensure_index_entry, index_entry_put, materialise_pending
from app.storage.metrics import StoreMetrics
from app.storage.own_writes import OwnWrites
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from app.storage.records import (
    Compaction,
    CompactionCursor,
    Control,
    IndexEntry,
    LogState,
    Pending,
    now_ms,
)
from app.storage.s3 import S3Store
from app.storage.topics import TopicCatalog

log = logging.getLogger(__name__)

# A partition whose append met already-committed idempotency keys is uploaded again
# without them; a second round always settles it, a third is a safety margin.
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


@dataclass(frozen=True)
class _Member:
    """One group of a partition's append; its records start at ``first`` in the body."""

    index: int
    group: AppendGroup
    first: int


@dataclass
class _PartitionAppend:
    """Everything one partition gets from one ``append_shared``: its groups, in order,
    minus the ones repeating an idempotency key of an earlier group (``echoes``: group
    index -> the index of the group it repeats)."""

    tp: TopicPartition
    members: list[_Member] = field(default_factory=list)
    echoes: dict[int, int] = field(default_factory=dict)
    size: int = 0

    def add(self, index: int, group: AppendGroup) -> None:
        key = group.idempotency_key
        if key is not None:
            for m in self.members:
                if m.group.idempotency_key == key:
                    self.echoes[index] = m.index
                    return
        self.members.append(_Member(index, group, self.size))
        self.size += len(group.records)

    def body(self, encoding: str) -> codec.SliceBody:
        parts, used, count = partition_body([m.group.records for m in self.members],
                                            encoding)
        # The newest view of the topic's setting among the groups (it may have changed
        # while they were buffered; each stored body says its own codec).
        compression = self.members[-1].group.compression
        return codec.SliceBody(self.tp.topic, self.tp.partition, parts, used, count,
                              compression)

    def resolve(self, outcomes: list[AppendOutcome | None],
                results: dict[int, AppendOutcome]) -> None:
        """Record ``results`` (by group index) and answer the echoes of those groups."""
        for index, outcome in results.items():
            outcomes[index] = outcome
        for index, original in self.echoes.items():
            if original in results:
                first = results[original]
                outcomes[index] = (_as_duplicate(first) if isinstance(first, AppendResult)
                                   else first)

    def without(self, answered: dict[int, AppendOutcome]) -> _PartitionAppend:
        """The groups not in ``answered`` (with their echoes), to be uploaded again."""
        rest = _PartitionAppend(self.tp)
        for m in self.members:
            if m.index not in answered:
                rest.add(m.index, m.group)
        rest.echoes.update({i: o for i, o in self.echoes.items() if o not in answered})
        return rest

    def fail(self, outcomes: list[AppendOutcome | None], error: LlogError) -> None:
        self.resolve(outcomes, {m.index: error for m in self.members})


@dataclass(frozen=True)
class _UploadedSlice:
    """Where one partition's body of a flush was uploaded."""

    data_key: str
    byte_offset: int
    byte_length: int
    crc32c: int
    count: int
    created_at_ms: int
    encoding: str
    codec: str | None = None  # compressed: the codec, and the body's size before it
    raw_length: int | None = None


@dataclass
class _Commit:
    """One partition's commit across its CAS attempts."""

    tp: TopicPartition
    part: _PartitionAppend
    upload: _UploadedSlice
    append_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # (expected version, start, end) of CAS attempts whose outcome is unknown.
    in_doubt: list[tuple[int, int, int]] = field(default_factory=list)
    outage: Outage = field(default_factory=lambda: Outage(DEFAULT_OUTAGE_S))

    def results(self, start: int, data_key: str, index_key: str, append_time_ms: int
                ) -> dict[int, AppendOutcome]:
        """Each group's offsets, for the append committed from ``start``."""
        out: dict[int, AppendOutcome] = {}
        for m in self.part.members:
            first = start + m.first
            n = len(m.group.records)
            out[m.index] = AppendResult(self.tp, first, first + n - 1, n, index_key, data_key,
                                        append_time_ms=append_time_ms)
        return out

    def keyed_ranges(self, start: int) -> list[tuple[str, Remembered]]:
        return [(m.group.idempotency_key,
                 Remembered(start + m.first, start + m.first + len(m.group.records) - 1,
                            self.upload.data_key))
                for m in self.part.members if m.group.idempotency_key is not None]


@dataclass(frozen=True)
class _Reupload:
    """Some groups' keys were committed already: they are answered, the rest (``part``)
    must be uploaded again without them, since a slice cannot be committed in part."""

    answered: dict[int, AppendOutcome]
    part: _PartitionAppend


@dataclass
class _CachedControl:
    control: Control
    version: int
    cached: bool = False  # served from this process's cache rather than just read


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
        self._commit_horizon_ms = commit_horizon_ms
        self._pending_reread_ms = pending_reread_ms
        self._outage_s = outage_s
        self._initialised: LRUCache[TopicPartition, bool] = LRUCache(max_cached_partitions)
        self._controls: LRUCache[TopicPartition, _CachedControl] = LRUCache(
            max_cached_partitions)
        # The control versions this process wrote: only these are "our own" changes (a
        # version merely read after a conflict is someone else's).
        self.own = OwnWrites(max_cached_partitions)
        self._materialised: LRUCache[TopicPartition, str] = LRUCache(max_cached_partitions)
        self._locks: weakref.WeakValueDictionary[TopicPartition, anyio.Lock] = (
            weakref.WeakValueDictionary())
        self._catalog = TopicCatalog(oxia, layout)

    @classmethod
    def from_settings(cls, oxia: OxiaStore, s3: S3Store, layout: KeyLayout,
                      metrics: StoreMetrics, settings: Settings, **overrides: Any) -> LogWriter:
        """A writer configured from the shared settings, as every writer of a store must
        be: vacuum deletes an unreferenced object once it is older than
        ``LLOG_RETRY_HORIZON_MS``, which is safe only if no writer commits a blob older
        than its safe share; and compaction takes entries as young as
        ``LLOG_COMPACTION_MIN_ENTRY_AGE_MS``, so a cached pending append is read again
        at half that age. A writer built with the constructor's defaults instead would
        assume the default horizon whatever the store's operators configured."""
        options: dict[str, Any] = {
            "max_attempts": settings.commit_max_attempts,
            "commit_horizon_ms": settings.retry_horizon_safe_ms,
            "pending_reread_ms": settings.compaction_min_entry_age_ms // 2,
            "encoding": settings.wal_encoding,
            "outage_s": settings.oxia_outage_s,
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

        Groups of one partition are committed together, in order, as one append; one
        partition failing never affects another. Raises only for invalid input.
        """
        if not groups:
            raise InvalidRequest("append_shared needs at least one group")
        parts: dict[TopicPartition, _PartitionAppend] = {}
        for i, group in enumerate(groups):
            if not group.records:
                raise InvalidRequest(f"{group.tp}: an append needs at least one record")
            parts.setdefault(group.tp, _PartitionAppend(group.tp)).add(i, group)
        outcomes: list[AppendOutcome | None] = [None] * len(groups)
        todo = list(parts.values())
        for _ in range(MAX_UPLOAD_ROUNDS):
            if not todo:
                break
            todo = await self._upload_and_commit(todo, outcomes)
        for part in todo:
            part.fail(outcomes, CommitConflict(
                f"{part.tp}: idempotency keys kept turning out committed; not appended"))
        done = [o for o in outcomes if o is not None]
        assert len(done) == len(groups)
        for group, outcome in zip(groups, done, strict=True):
            if isinstance(outcome, AppendResult) and not outcome.duplicate:
                self._metrics.appended_records.inc(outcome.count)
                self._metrics.appended_bytes.inc(group.size)
        return done

    async def ensure_partition(self, tp: TopicPartition) -> None:
        """Create ``meta/control`` and ``meta/compaction-cursor`` if absent (idempotent)."""
        if tp in self._initialised:
            return
        control = Control()
        created, cursor = await self._put_control(tp, [
            PutSpec(self._layout.control(tp), control.to_json(), tp.partition_key,
                    EXPECT_NOT_EXISTS),
            PutSpec(self._layout.compaction_cursor(tp), CompactionCursor(offset=1).to_json(),
                    tp.partition_key, EXPECT_NOT_EXISTS),
        ], control_at=0)
        for outcome in (created, cursor):  # "exists" means initialised already
            if isinstance(outcome, Exception) and not isinstance(outcome, VersionMismatch):
                raise outcome
        if isinstance(created, int):
            self._cache(tp, control, created)
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
                    self._cache(tp, done.control, done.version)
                    if done.done:
                        self.own.wrote(tp, done.version)
        self._step("after_materialise")
        return done.done

    # -- one flush round --------------------------------------------------------------

    async def _upload_and_commit(self, parts: list[_PartitionAppend],
                                 outcomes: list[AppendOutcome | None]
                                 ) -> list[_PartitionAppend]:
        """Upload one blob for ``parts`` and commit each; returns what must go again."""
        created = self._clock()
        blob, bodies = await _pack([p.body(self._encoding) for p in parts], created)
        key = self._layout.shared_wal_object(uuid.uuid4().hex)
        try:
            await self._s3.put(key, blob)
        except LlogError as exc:
            for part in parts:
                part.fail(outcomes, exc)
            return []
        self._metrics.shared_blob_bytes.observe(len(blob))
        for body in bodies:
            self._metrics.stored_bytes.labels("wal").inc(body.body_length)
            self._metrics.stored_raw_bytes.labels("wal").inc(body.raw_length or
                                                             body.body_length)
        self._step("after_blob_put")
        uri = self._layout.uri(key)
        again: list[_PartitionAppend] = []

        async def commit_one(part: _PartitionAppend, body: codec.SliceEntry) -> None:
            upload = _UploadedSlice(uri, body.body_offset, body.body_length, body.crc32c,
                             body.msg_count, created, body.encoding,
                             None if body.codec is Codec.NONE else body.codec.value,
                             body.raw_length)
            try:
                result = await self._commit(_Commit(part.tp, part, upload,
                                                    outage=Outage(self._outage_s)))
            except LlogError as exc:
                part.fail(outcomes, exc)
                return
            except Exception as exc:  # a defect: the CAS may or may not have landed
                log.exception("%s: unexpected error while committing", part.tp)
                part.fail(outcomes, CommitInDoubt(f"{part.tp}: unexpected {exc!r}"))
                return
            if isinstance(result, _Reupload):
                part.resolve(outcomes, result.answered)
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

    async def _commit(self, c: _Commit) -> dict[int, AppendOutcome] | _Reupload:
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
                    lambda n: self._attempt_through_outage(c), attempts=self._max_attempts,
                    what=f"{c.tp}: commit", retries=self._metrics.cas_retries, op="commit")
            except (StorageUnavailable, CommitConflict) as exc:
                if c.in_doubt:  # an unanswered CAS may yet have landed: never "not written"
                    raise CommitInDoubt(f"{exc}; an earlier commit attempt of these records "
                                        "went unanswered, so they may have been written"
                                        ) from exc
                raise

    async def _attempt_through_outage(self, c: _Commit
                                      ) -> Done[dict[int, AppendOutcome] | _Reupload] | Retry:
        """:meth:`_attempt`, repeated after a growing pause while Oxia does not answer
        (a shard electing a new leader), for up to ``outage_s`` from the first failure:
        the blob is uploaded, only the commit is missing, and the next answered attempt
        settles whatever an unanswered one did."""
        try:
            outcome = await self._attempt(c)
        except StorageUnavailable:
            if not await c.outage.pause():
                raise
            return Retry("unavailable")
        unanswered = isinstance(outcome, Retry) and outcome.reason == "in_doubt"
        if unanswered and not await c.outage.pause():
            raise StorageUnavailable(f"{c.tp}: Oxia did not answer the commit within "
                                     f"{self._outage_s} s")
        return outcome

    async def _attempt(self, c: _Commit) -> Done[dict[int, AppendOutcome] | _Reupload] | Retry:
        """One CAS attempt, as named steps; see the module docstring."""
        current = await self._current_control(c.tp)
        settled = await self._settle(c, current)
        if settled is not None:
            return Done(settled)
        self._refuse_expired(c)
        if current.control.fenced and current.cached:
            current = await self._fresh_control(c.tp)  # fencing can be lifted: look again
        if current.control.fenced:
            raise PartitionFenced(f"{c.tp} is fenced: appends are refused")
        return await self._compare_and_set(c, current)

    async def _current_control(self, tp: TopicPartition) -> _CachedControl:
        """The cached control record, unless it may lead this writer astray.

        A cached ``pending`` that is old enough for compaction to have materialised and
        compacted it must not be re-created in the index (that would make a stray,
        possibly pointing at a blob vacuum removed), so it is read again.
        """
        cached = self._controls.get(tp)
        if cached is not None:
            pending = cached.control.pending
            if (pending is None or self._materialised.get(tp) == pending.append_id
                    or self._clock() - pending.created_at_ms < self._pending_reread_ms):
                return _CachedControl(cached.control, cached.version, cached=True)
        return await self._fresh_control(tp)

    async def _fresh_control(self, tp: TopicPartition) -> _CachedControl:
        current = await self._read_control(tp)
        if current is None:
            raise StorageUnavailable(f"{tp}: meta/control vanished after initialisation")
        return current

    async def _settle(self, c: _Commit, current: _CachedControl
                      ) -> dict[int, AppendOutcome] | _Reupload | None:
        """What is already true for this append, whatever this attempt would do: an
        earlier attempt committed it, or its idempotency keys were committed before."""
        pending = current.control.pending
        if pending is not None and pending.append_id == c.append_id:
            return c.results(pending.start_offset, pending.data_key,
                             self._layout.index(c.tp, pending.end_offset),
                             pending.created_at_ms)
        keyed = self._keyed_outcomes(c, current.control)
        if keyed is not None:
            return keyed
        if c.in_doubt:
            won = await self._find_in_doubt(c, current.version)
            if won is not None:
                return c.results(won, c.upload.data_key,
                                 self._layout.index(c.tp, won + c.upload.count - 1),
                                 c.upload.created_at_ms)
        return None

    def _keyed_outcomes(self, c: _Commit, control: Control
                        ) -> dict[int, AppendOutcome] | _Reupload | None:
        """Settle by idempotency keys: all remembered, some, or none (None)."""
        found = {m.index: (m, remembered(control, m.group.idempotency_key))
                 for m in c.part.members if m.group.idempotency_key is not None}
        hits = {i: r for i, (_, r) in found.items() if r is not None}
        if not hits:
            return None
        if all(r.data_key == c.upload.data_key for r in hits.values()):
            # Our own upload: an earlier, unanswered attempt of this commit landed.
            first = next(m for m in c.part.members if m.index in hits)
            start = hits[first.index].start - first.first
            return c.results(start, c.upload.data_key,
                             self._layout.index(c.tp, start + c.upload.count - 1),
                             c.upload.created_at_ms)
        answered: dict[int, AppendOutcome] = {
            i: r.result(c.tp, self._layout) for i, r in hits.items()}
        rest = c.part.without(answered)
        return _Reupload(answered, rest) if rest.members else answered

    async def _find_in_doubt(self, c: _Commit, current_version: int) -> int | None:
        """Did an earlier, unanswered CAS of this commit land? Its start offset if so.

        A CAS whose expected version is no longer current can never apply later. Where
        it would have put its append, the index now holds it (materialised by the next
        writer, carrying our ``append_id``), another append (it did not land), nothing
        (it did not land) -- or compaction has replaced the range, and then nothing
        shows whether it landed: :class:`CommitInDoubt`.
        """
        for expected_version, start, end in list(c.in_doubt):
            if expected_version == current_version:
                continue  # not applied (yet); retrying with the same version settles it
            record = await self._oxia.get(self._layout.index(c.tp, end), c.tp.partition_key)
            entry = None if record is None else IndexEntry.from_json(record.value)
            if entry is not None and entry.type == "WAL":
                if entry.append_id == c.append_id:
                    return start
            elif await self._compacted_over(c.tp, end):
                raise CommitInDoubt(
                    f"{c.tp}: the outcome of an unanswered commit of offsets "
                    f"[{start}, {end}] cannot be settled (compaction replaced the range); "
                    "the records may have been written")
            c.in_doubt.remove((expected_version, start, end))
        return None

    async def _compacted_over(self, tp: TopicPartition, offset: int) -> bool:
        """Is ``offset`` covered by compaction (finished or in flight)? Read after the
        index key: compaction deletes keys while its record exists and moves the cursor
        before it removes the record, so one of the two shows it."""
        found = await self._oxia.get(self._layout.compaction(tp), tp.partition_key)
        if found is not None:
            record = Compaction.from_json(found.value)
            if record.start_offset <= offset <= record.end_offset:
                return True
        cursor = await self._oxia.get(self._layout.compaction_cursor(tp), tp.partition_key)
        return cursor is not None and CompactionCursor.from_json(cursor.value).offset > offset

    def _refuse_expired(self, c: _Commit) -> None:
        """A blob older than the safe share of the retry horizon may be collected by
        vacuum any time now: committing a reference to it could lose the records."""
        age = self._clock() - c.upload.created_at_ms
        if age <= self._commit_horizon_ms:
            return
        if c.in_doubt:  # an unanswered attempt with the current version may yet apply
            raise CommitInDoubt(f"{c.tp}: the upload is {age} ms old and an earlier "
                                "commit attempt's outcome is unknown")
        raise CommitExpired(
                f"{c.tp}: the upload is {age} ms old, beyond the commit horizon of "
                f"{self._commit_horizon_ms} ms; nothing was committed")

    async def _compare_and_set(self, c: _Commit, current: _CachedControl
                               ) -> Done[dict[int, AppendOutcome] | _Reupload] | Retry:
        """Retire the previous pending append and install ours, in one request."""
        tp, control = c.tp, current.control
        start = control.sequence_counter + 1
        u = c.upload
        # Append times never go backwards within a partition (a lookup by time
        # searches the index), whatever the clocks of the brokers say.
        appended = max(u.created_at_ms, control.last_append_ms or 0)
        total_bytes = (control.appended_bytes or 0) + u.byte_length
        mine = Pending(
            append_id=c.append_id, start_offset=start, end_offset=start + u.count - 1,
            msg_count=u.count, data_key=u.data_key, encoding=u.encoding,
            byte_offset=u.byte_offset, byte_length=u.byte_length, created_at_ms=appended,
            crc32c=u.crc32c, end_bytes=total_bytes, codec=u.codec, raw_length=u.raw_length,
        )
        extra = dict(control.extra)
        keyed = c.keyed_ranges(start)
        if keyed:
            extra[IDEMPOTENCY_FIELD] = remember(control, keyed)
        updated = dataclasses.replace(control, sequence_counter=mine.end_offset, pending=mine,
                                      last_append_ms=appended, appended_bytes=total_bytes,
                                      extra=extra)
        previous = control.pending
        materialise = (previous is not None
                       and self._materialised.get(tp) != previous.append_id)
        puts = [index_entry_put(self._layout, tp, previous)] if materialise and previous else []
        puts.append(PutSpec(self._layout.control(tp), updated.to_json(), tp.partition_key,
                            current.version))
        outcomes = await self._put_control(tp, puts, control_at=len(puts) - 1)
        outcome = outcomes[-1]
        if isinstance(outcome, VersionMismatch):
            self._metrics.cas_conflicts.inc()
            self._controls.pop(tp, None)
            return Retry("conflict")
        if isinstance(outcome, Exception):
            c.in_doubt.append((current.version, start, mine.end_offset))
            self._controls.pop(tp, None)
            return Retry("in_doubt")
        # Committed: the records are durable and readable from here on.
        self._cache(tp, updated, outcome)
        if materialise and previous is not None:
            await ensure_index_entry(self._oxia, self._layout, tp, previous, outcomes[0])
            if isinstance(outcomes[0], int):
                self._metrics.pending_materialised.labels("next_writer").inc()
            self._materialised[tp] = previous.append_id
        self._step("after_pending_cas")
        return Done(c.results(start, u.data_key, self._layout.index(tp, mine.end_offset),
                              appended))

    # -- control cache -----------------------------------------------------------------

    def _cache(self, tp: TopicPartition, control: Control, version: int) -> None:
        self._controls[tp] = _CachedControl(control, version)

    async def _put_control(self, tp: TopicPartition, puts: list[PutSpec], *,
                           control_at: int) -> list[int | Exception]:
        """``puts``, of which ``puts[control_at]`` writes the partition's control record:
        the version it returns is remembered as this process's own before the
        notifications held meanwhile are decided (:mod:`app.storage.own_writes`)."""
        with self.own.writing(tp):
            outcomes = await self._oxia.put_group(puts)
            version = outcomes[control_at]
            if isinstance(version, int):
                self.own.wrote(tp, version)
            return outcomes

    async def _read_control(self, tp: TopicPartition) -> _CachedControl | None:
        record = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        if record is None:
            self._controls.pop(tp, None)
            return None
        current = _CachedControl(Control.from_json(record.value), record.version_id)
        self._controls[tp] = current
        return current

    async def _set_state(self, tp: TopicPartition, state: LogState) -> None:
        await self.ensure_partition(tp)

        async def attempt(_: int) -> Done[None] | Retry:
            current = await self._read_control(tp)
            if current is None:
                raise StorageUnavailable(f"{tp}: meta/control is missing")
            c = current.control
            if c.log_state == state:
                return Done(None)
            updated = dataclasses.replace(c, log_state=state, extra=dict(c.extra))
            (outcome,) = await self._put_control(tp, [PutSpec(
                self._layout.control(tp), updated.to_json(), tp.partition_key,
                current.version)], control_at=0)
            if isinstance(outcome, VersionMismatch):
                return Retry("conflict")
            if isinstance(outcome, Exception):
                raise outcome
            self._cache(tp, updated, outcome)
            return Done(None)

        async with self._lock(tp):
            await cas_loop(attempt, attempts=self._max_attempts,
                           what=f"{tp}: set log_state={state}",
                           retries=self._metrics.cas_retries, op="log_state")


async def _pack(bodies: list[codec.SliceBody], created_at_ms: int
                ) -> tuple[bytes, list[codec.SliceEntry]]:
    """The flush's LLS1 blob. Compressing bodies (a few milliseconds per MiB) is done
    in a worker thread, never on the event loop; a flush that compresses nothing is
    packed in place, as a thread hop would cost more than the copy."""
    if codec.compresses(bodies):
        return await anyio.to_thread.run_sync(codec.pack_shared_blob, bodies, created_at_ms)
    return codec.pack_shared_blob(bodies, created_at_ms)


def _as_duplicate(result: AppendResult) -> AppendResult:
    return AppendResult(result.tp, result.start_offset, result.end_offset, result.count,
                        result.index_key, result.wal_uri, duplicate=True)
