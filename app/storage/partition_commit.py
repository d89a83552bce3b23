"""One partition's commit of an uploaded slice, as named steps (docs/protocol.md, the
commit protocol).

An attempt settles what is already true (an earlier, unanswered attempt of this commit
landed, or the idempotency keys were committed before; or, after a conflict, they may
have been and the window forgot them since: in doubt), leaves out groups past their
``commit_by`` (a produce request's deadline, a forward's commit window), refuses a blob
that grew too old for vacuum's horizon and a fenced partition, then compares-and-sets
``meta/control`` in one request that also writes the previous append's index entry. That
request carries the earliest of those deadlines as its ``send_by``: it is not sent past
it, however long it waits to go out, so the control version it expects was read before.
:func:`~app.storage.cas.cas_loop` repeats attempts after a conflict; an attempt Oxia
does not answer is remembered as in doubt until a later one settles it. While the
version it expected is still current, the same compare-and-set is sent again, deadlines
over or not: it expects a version read in time, and it is the only way to settle the
attempt short of answering every group of the partition in doubt.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from app.errors import (
    CommitExpired,
    CommitInDoubt,
    PartitionFenced,
    StorageUnavailable,
    VersionMismatch,
)
from app.storage import producer_state
from app.storage.appends import AppendOutcome, AppendResult, ProducerSeq
from app.storage.cas import Done, Outage, Retry
from app.storage.control_cache import CachedControl, ControlCache
from app.storage.idempotency import (
    IDEMPOTENCY_FIELD,
    IDEMPOTENCY_WINDOW,
    Remembered,
    remember,
    remembered,
    window_since,
)
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.materialise import ensure_index_entry, index_entry_put
from app.storage.metadata import Compaction, CompactionCursor, Control, IndexEntry, Pending
from app.storage.partition_append import PartitionAppend
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore, PutSpec, SendExpired


@dataclass(frozen=True)
class UploadedSlice:
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


@dataclass(frozen=True)
class Reupload:
    """Some groups' keys were committed already: they are answered, the rest (``part``)
    must be uploaded again without them, since a slice cannot be committed in part."""

    answered: dict[int, AppendOutcome]
    part: PartitionAppend


Settled = dict[int, AppendOutcome] | Reupload


@dataclass(frozen=True)
class CommitRules:
    """What every commit of one writer shares: its stores, its control records, and the
    limits every writer of a store must agree on (``LogWriter.from_settings``)."""

    oxia: OxiaStore
    layout: KeyLayout
    metrics: StoreMetrics
    controls: ControlCache
    clock: Callable[[], int]
    commit_horizon_ms: int
    outage_s: float
    step: Callable[[str], None]  # a test's crash point between protocol steps


@dataclass
class PartitionCommit:
    """One partition's commit across its CAS attempts."""

    rules: CommitRules
    part: PartitionAppend
    upload: UploadedSlice
    append_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # (expected version, start, end) of CAS attempts whose outcome is unknown.
    in_doubt: list[tuple[int, int, int]] = field(default_factory=list)
    outage: Outage = field(init=False)

    def __post_init__(self) -> None:
        self.outage = Outage(self.rules.outage_s)

    @property
    def tp(self) -> TopicPartition:
        return self.part.tp

    async def attempt_through_outage(self) -> Done[Settled] | Retry:
        """:meth:`attempt`, repeated after a growing pause while Oxia does not answer
        (a shard electing a new leader), for up to ``outage_s`` from the first failure:
        the blob is uploaded, only the commit is missing, and the next answered attempt
        settles whatever an unanswered one did."""
        try:
            outcome = await self.attempt()
        except StorageUnavailable:
            if not await self.outage.pause():
                raise
            return Retry("unavailable")
        unanswered = isinstance(outcome, Retry) and outcome.reason == "in_doubt"
        if unanswered and not await self.outage.pause():
            raise StorageUnavailable(f"{self.tp}: Oxia did not answer the commit within "
                                     f"{self.rules.outage_s} s")
        return outcome

    async def attempt(self) -> Done[Settled] | Retry:
        """One CAS attempt, as named steps; see the module docstring."""
        controls = self.rules.controls
        current = await controls.current(self.tp)
        judged = self._remembered(current.control)
        if current.cached and (current.control.fenced or judged[1]):
            # A cached record may be behind other brokers' commits: fencing can be lifted,
            # and a producer's group it calls out of order or unknown may be the next
            # one. Read again before judging anything: every step below, the
            # compare-and-set too, works from the one record (what a cached record calls
            # committed stays so; a refusal is answered only from the record as it is).
            # So a compare-and-set goes out only when that record found every sequenced
            # group the next of its producer (:meth:`settle` answered nothing).
            current = await controls.fresh(self.tp)
            judged = self._remembered(current.control)
        settled = await self.settle(current, judged)
        if settled is None:
            settled = self.without_late()
        if settled is not None:
            return Done(settled)
        self.refuse_expired()
        if current.control.fenced:
            raise PartitionFenced(f"{self.tp} is fenced: appends are refused")
        return await self.compare_and_set(current)

    async def settle(self, current: CachedControl,
                     judged: tuple[dict[int, Remembered], dict[int, AppendOutcome]]
                     ) -> Settled | None:
        """What is already true for this append, whatever this attempt would do: an
        earlier attempt committed it, its idempotency keys were committed before, or
        they may have been and were forgotten since (:meth:`_forgotten`). ``judged``:
        :meth:`_remembered` of ``current``'s record."""
        layout, control = self.rules.layout, current.control
        pending = control.pending
        if pending is not None and pending.append_id == self.append_id:
            return self.results(pending.start_offset, pending.data_key,
                                layout.index(self.tp, pending.end_offset),
                                pending.created_at_ms)
        hits, refused = judged
        if hits and all(r.data_key == self.upload.data_key for r in hits.values()):
            # Our own upload: an earlier, unanswered attempt of this commit landed.
            first = next(m for m in self.part.members if m.index in hits)
            start = hits[first.index].start - first.first
            return self.results(start, self.upload.data_key,
                                layout.index(self.tp, start + self.upload.count - 1),
                                self.upload.created_at_ms)
        if not hits and self.in_doubt:
            won = await self.find_in_doubt(current.version)
            if won is not None:
                return self.results(won, self.upload.data_key,
                                    layout.index(self.tp, won + self.upload.count - 1),
                                    self.upload.created_at_ms)
        answered: dict[int, AppendOutcome] = {
            i: r.result(self.tp, layout) for i, r in hits.items()}
        answered.update(self._forgotten(control, hits))
        answered.update(refused)
        self.part.keys_absent_through = control.sequence_counter
        self.part.evictions_seen = producer_state.evictions(control)
        if not answered:
            return None
        rest = self.part.without(answered, counted=bool(hits))
        return Reupload(answered, rest) if rest.members else answered

    def _remembered(self, control: Control
                    ) -> tuple[dict[int, Remembered], dict[int, AppendOutcome]]:
        """The groups committed before, by group index: those whose idempotency keys the
        window remembers, and those their producer's sequence shows; and the groups their
        producer's sequence refuses (out of order, not remembered, or in doubt), each
        with its error."""
        found: dict[int, Remembered] = {}
        refused: dict[int, AppendOutcome] = {}
        check: producer_state.SequenceCheck | None = None
        for m in self.part.members:
            group = m.group
            if group.producer is not None:
                if check is None:
                    check = producer_state.SequenceCheck(control, self.tp,
                                                         self.part.evictions_seen)
                verdict = check.judge(group.producer)
                if verdict is None:
                    check.accept(group.producer)
                elif isinstance(verdict, Remembered):
                    found[m.index] = verdict
                else:
                    refused[m.index] = verdict
            elif group.idempotency_key is not None:
                hit = remembered(control, group.idempotency_key)
                if hit is not None:
                    found[m.index] = hit
        return found, refused

    def _forgotten(self, control: Control, hits: dict[int, Remembered]
                   ) -> dict[int, AppendOutcome]:
        """The keyed groups not found in the window, in doubt if a key committed since
        an earlier read of this commit found none of them may have left the window
        since: another copy under the same key (a client's resend through another
        broker, or its first attempt landing late) may have been committed in between
        and forgotten, and appending blind would write the records twice. Keys found or
        not, the records of these groups were not written by this commit."""
        since = self.part.keys_absent_through
        if since is None or window_since(control, since):
            return {}
        why = (f"{self.tp}: another copy of these records under the same idempotency "
               f"key may have been committed since offset {since}: more keyed appends "
               f"than the partition remembers ({IDEMPOTENCY_WINDOW}) were committed "
               "before this commit could look again; not appended here, the records "
               "may have been written")
        return {m.index: CommitInDoubt(why) for m in self.part.members
                if m.group.idempotency_key is not None and m.index not in hits}

    async def find_in_doubt(self, current_version: int) -> int | None:
        """Did an earlier, unanswered CAS of this commit land? Its start offset if so.

        A CAS whose expected version is no longer current can never apply later. Where
        it would have put its append, the index now holds it (materialised by the next
        writer, carrying our ``append_id``), another append (it did not land), nothing
        (it did not land) -- or compaction has replaced the range, and then nothing
        shows whether it landed: :class:`CommitInDoubt`.
        """
        tp, oxia = self.tp, self.rules.oxia
        for expected_version, start, end in list(self.in_doubt):
            if expected_version == current_version:
                continue  # not applied (yet); retrying with the same version settles it
            record = await oxia.get(self.rules.layout.index(tp, end), tp.partition_key)
            entry = None if record is None else IndexEntry.from_json(record.value)
            if entry is not None and entry.type == "WAL":
                if entry.append_id == self.append_id:
                    return start
            elif await self._compacted_over(end):
                raise CommitInDoubt(
                    f"{tp}: the outcome of an unanswered commit of offsets "
                    f"[{start}, {end}] cannot be settled (compaction replaced the range); "
                    "the records may have been written")
            self.in_doubt.remove((expected_version, start, end))
        return None

    async def _compacted_over(self, offset: int) -> bool:
        """Is ``offset`` covered by compaction (finished or in flight)? Read after the
        index key: compaction deletes keys while its record exists and moves the cursor
        before it removes the record, so one of the two shows it."""
        tp, oxia, layout = self.tp, self.rules.oxia, self.rules.layout
        found = await oxia.get(layout.compaction(tp), tp.partition_key)
        if found is not None:
            record = Compaction.from_json(found.value)
            if record.start_offset <= offset <= record.end_offset:
                return True
        cursor = await oxia.get(layout.compaction_cursor(tp), tp.partition_key)
        return cursor is not None and CompactionCursor.from_json(cursor.value).offset > offset

    def without_late(self) -> Settled | None:
        """Groups past their ``commit_by`` are never committed with a control version
        read from now on: whoever sent them may send them again (a client whose produce
        deadline ended; a forwarder whose commit window ended, which answers them in
        doubt), and the resend commit, and many keyed appends after it, before this
        commit reads again (docs/protocol.md, The produce commit deadline). They are
        answered as their deadline says (``expired_as``; exact: no attempt of theirs
        can land), and the partition's other groups, repeats of the late groups' keys
        among them, are uploaded again without them. A late echo (a repeat of an
        earlier group's key, answered by that group's commit) is answered so and
        detached, its original committed without it. Not while an unanswered attempt
        expecting the current version may still land with them all (:meth:`settle`
        has ruled out the others): that attempt is sent again (:meth:`send_by`)."""
        if self.in_doubt:
            return None
        late = self.part.late(time.monotonic(), f"{self.tp}: the records were not "
                              "committed by their deadline; nothing was written")
        if not late:
            return None
        if all(i in self.part.echoes for i in late):
            self.part.detach(late)  # their records are in no slice: nothing to upload
            return None
        rest = self.part.without_unwritten(late)
        return Reupload(late, rest) if rest.members else late

    def send_by(self, expected_version: int) -> float:
        """Until when (``time.monotonic()``) a request expecting ``expected_version`` may
        be sent: the blob's commit horizon (:meth:`refuse_expired`) and its groups'
        ``commit_by`` (produce deadlines, forward windows), checked where the request
        goes out, since it may wait long before it does (behind other requests, for a
        worker thread), echoes' among them, as their original's commit answers them. Not
        the groups' deadlines when it repeats an unanswered attempt:
        that attempt read the version before them, and a resend, which comes after
        them, moves the version if it commits first (then this one fails), or finds
        this one's keys."""
        age_ms = self.rules.clock() - self.upload.created_at_ms
        deadlines = [time.monotonic() + (self.rules.commit_horizon_ms - age_ms) / 1000]
        if all(version != expected_version for version, _, _ in self.in_doubt):
            deadlines += self.part.commit_by()
        return min(deadlines)

    def refuse_expired(self) -> None:
        """A blob older than the safe share of the retry horizon may be collected by
        vacuum any time now: committing a reference to it could lose the records."""
        horizon = self.rules.commit_horizon_ms
        age = self.rules.clock() - self.upload.created_at_ms
        if age <= horizon:
            return
        if self.in_doubt:  # an unanswered attempt with the current version may yet apply
            raise CommitInDoubt(f"{self.tp}: the upload is {age} ms old and an earlier "
                                "commit attempt's outcome is unknown")
        raise CommitExpired(
                f"{self.tp}: the upload is {age} ms old, beyond the commit horizon of "
                f"{horizon} ms; nothing was committed")

    def _pending(self, control: Control) -> Pending:
        """This append as the partition's new ``pending``, after ``control``'s."""
        u, start = self.upload, control.sequence_counter + 1
        # Append times never go backwards within a partition (a lookup by time
        # searches the index), whatever the clocks of the brokers say.
        appended = max(u.created_at_ms, control.last_append_ms or 0)
        return Pending(
            append_id=self.append_id, start_offset=start, end_offset=start + u.count - 1,
            msg_count=u.count, data_key=u.data_key, encoding=u.encoding,
            byte_offset=u.byte_offset, byte_length=u.byte_length, created_at_ms=appended,
            crc32c=u.crc32c, end_bytes=(control.appended_bytes or 0) + u.byte_length,
            codec=u.codec, raw_length=u.raw_length)

    async def compare_and_set(self, current: CachedControl) -> Done[Settled] | Retry:
        """Retire the previous pending append and install ours, in one request. Only a
        record its groups were judged on (:meth:`settle`): a producer's group is
        committed only as the next of its sequence in the very record it replaces."""
        tp, control, rules = self.tp, current.control, self.rules
        mine = self._pending(control)
        extra = dict(control.extra)
        keyed = self.keyed_ranges(mine.start_offset)
        if keyed:
            extra[IDEMPOTENCY_FIELD] = remember(control, keyed)
        sequenced = self.sequenced_ranges(mine.start_offset)
        if sequenced:
            table, evicted = producer_state.remember(control, sequenced)
            extra[producer_state.PRODUCERS_FIELD] = table
            if evicted:
                extra[producer_state.EVICTED_FIELD] = evicted
        updated = dataclasses.replace(
            control, sequence_counter=mine.end_offset, pending=mine,
            last_append_ms=mine.created_at_ms, appended_bytes=mine.end_bytes, extra=extra)
        previous = control.pending
        materialise = (previous is not None
                       and rules.controls.materialised.get(tp) != previous.append_id)
        send_by = self.send_by(current.version)
        puts = [dataclasses.replace(index_entry_put(rules.layout, tp, previous),
                                    send_by=send_by)] if materialise and previous else []
        puts.append(PutSpec(rules.layout.control(tp), updated.to_json(), tp.partition_key,
                            current.version, send_by=send_by))
        outcomes = await rules.controls.put(tp, puts, control_at=len(puts) - 1)
        outcome = outcomes[-1]
        if isinstance(outcome, SendExpired):
            return Retry("not_sent")  # never sent: the next attempt says why it was late
        if isinstance(outcome, VersionMismatch):
            rules.metrics.cas_conflicts.inc()
            rules.controls.forget(tp)
            return Retry("conflict")
        if isinstance(outcome, Exception):
            self.in_doubt.append((current.version, mine.start_offset, mine.end_offset))
            rules.controls.forget(tp)
            return Retry("in_doubt")
        # Committed: the records are durable and readable from here on.
        rules.controls.keep(tp, updated, outcome)
        if materialise and previous is not None:
            await ensure_index_entry(rules.oxia, rules.layout, tp, previous, outcomes[0])
            if isinstance(outcomes[0], int):
                rules.metrics.pending_materialised.labels("next_writer").inc()
            rules.controls.materialised[tp] = previous.append_id
        rules.step("after_pending_cas")
        return Done(self.results(mine.start_offset, self.upload.data_key,
                                 rules.layout.index(tp, mine.end_offset), mine.created_at_ms))

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

    def sequenced_ranges(self, start: int) -> list[tuple[ProducerSeq, Remembered]]:
        return [(m.group.producer,
                 Remembered(start + m.first, start + m.first + len(m.group.records) - 1,
                            self.upload.data_key))
                for m in self.part.members if m.group.producer is not None]
