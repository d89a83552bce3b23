"""A group's committed offsets: commits fenced by generation, where a member resumes,
and resets by an operator (docs/protocol.md, Consumer groups).

A committed offset is the last offset the group processed in a partition; reading
resumes one past it. Each record carries the generation that wrote it, and a commit
never replaces a record of a newer generation, so a member that lost its partitions in
a rebalance cannot move them after the new owner has committed.

Oxia conditions a write on the version of the key written only, so no write of an
offset can be conditioned on the group record. A commit therefore checks the group
(the member listed, its lease live, the generation current), writes its offset as a
*pending* commit beside the confirmed one, reads the group again, and only then
confirms it (a compare-and-set on the version it wrote). No reader takes a pending
commit for the group's position, and the first reader of a newer generation drops an
older generation's pending commit by compare-and-set, which fences it: its
confirmation then fails and the commit is refused. So the position a new owner reads
is never an offset whose commit was refused, and a refusal writes nothing anyone sees.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import anyio

from app.errors import (
    GroupNotEmpty,
    InvalidRequest,
    LlogError,
    OffsetBeyondHighWatermark,
    PartitionNotAssigned,
    StaleGeneration,
    StorageUnavailable,
    UnknownMember,
    VersionMismatch,
)
from app.groups.bounded import each, first_error
from app.groups.group_records import CommittedOffset, GroupMember, PendingCommit
from app.groups.membership import GroupMembership
from app.groups.store import GroupStore
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import TopicPartition, validate_group
from app.storage.log_positions import PartitionOffsets, list_offsets
from app.storage.metadata import now_ms
from app.storage.reader import LogReader
from app.stores.oxia.store import EXPECT_NOT_EXISTS

log = logging.getLogger(__name__)
Reset = Literal["earliest", "latest"]
_ATTEMPTS = 16


@dataclass(frozen=True)
class ResetTarget:
    """Exactly one of ``to``, ``timestamp_ms`` (the first offset appended at or after
    it is read next) or ``offset`` (the committed offset itself)."""

    tp: TopicPartition
    to: Reset | None = None
    timestamp_ms: int | None = None
    offset: int | None = None


@dataclass(frozen=True)
class _Written:
    """One offset this commit wrote (as pending, or directly), the version of the record
    written, which its confirmation or withdrawal expects, and the confirmed commit it
    replaced (what a direct write's withdrawal puts back)."""

    pending: PendingCommit
    version: int
    replaced: CommittedOffset | None
    direct: bool

    @property
    def offset(self) -> int:
        return self.pending.offset


class GroupOffsets:
    def __init__(self, store: GroupStore, membership: GroupMembership, reader: LogReader, *,
                 clock: Callable[[], int] = now_ms,
                 putback_failed: Callable[[], None] = lambda: None,
                 pending: bool = True) -> None:
        self._store = store
        self._membership = membership
        self._reader = reader
        self._clock = clock
        # Counted (llog_group_putback_failures_total) and alerted on: a refused commit
        # whose pending record could not be withdrawn. Harmless to readers (a pending
        # commit is never a position), but it says Oxia refused writes for a while.
        self._putback_failed = putback_failed
        # False (LLOG_GROUP_PENDING_COMMITS=false) while a release before pending commits
        # may still run: commits are written directly, checked, and put back if refused,
        # the protocol those releases follow (a refused offset is visible until then).
        self._pending = pending

    async def authorise(self, group: str, member_id: str | None, generation: int | None,
                        tps: Sequence[TopicPartition]) -> int:
        """The generation to commit ``tps`` with, or the reason this caller may not:
        a member must be listed, in the current generation, and own every partition;
        without a member id the group must have no live members."""
        if member_id is None:
            view = await self._membership.settle(group, create=True)
            assert view is not None
            if view.record.members:
                raise GroupNotEmpty(f"group {group!r} has {len(view.record.members)} live "
                                    "members: commit as one of them (member_id, generation)")
            return view.generation
        view, live = await self._membership.standing(group, member_id)
        if view is None or view.record.member(member_id) is None:
            raise UnknownMember(f"{member_id!r} is not a member of group {group!r}; "
                                "join again")
        if not live:  # still listed only because nobody settled the group since
            await self._membership.settle(group)  # its partitions move now
            raise UnknownMember(f"the session of {member_id!r} in group {group!r} "
                                "expired; join again")
        if generation != view.generation:
            raise StaleGeneration(f"group {group!r} is in generation {view.generation}, "
                                  f"not {generation}: heartbeat for the current assignment")
        owned = set(self._membership.owned(view, member_id))
        foreign = [str(tp) for tp in tps if tp not in owned]
        if foreign:
            raise PartitionNotAssigned(f"{', '.join(foreign[:10])} not assigned to "
                                       f"{member_id!r} in generation {generation}")
        return view.generation

    async def commit(self, group: str, member_id: str | None, generation: int | None,
                     offsets: Sequence[tuple[TopicPartition, int]], *,
                     check_bounds: bool = True) -> list[int | LlogError]:
        """Commit each (partition, last processed offset); one outcome each. Refused as
        a whole, before anything is written, for a caller :meth:`authorise` refuses or
        an offset beyond the high watermark."""
        validate_group(group)
        if len({tp for tp, _ in offsets}) != len(offsets):
            raise InvalidRequest("a partition appears more than once; commit it once")
        if check_bounds:  # first: bad input writes nothing, not even a group record
            await self._check_bounds(offsets)
        committing = await self.authorise(group, member_id, generation,
                                          [tp for tp, _ in offsets])
        # Shielded from here: a commit cancelled between its writes and the check after
        # them would leave pending commits for a reader of a newer generation to drop.
        with anyio.CancelScope(shield=True):
            written = await each(offsets, lambda entry: self._write(
                group, entry[0], entry[1], committing, member_id))
            outcomes = await self._settle_written(group, member_id, committing,
                                                  [tp for tp, _ in offsets], written)
        return outcomes

    async def _settle_written(self, group: str, member_id: str | None, generation: int,
                              tps: Sequence[TopicPartition],
                              written: Sequence[_Written | LlogError]
                              ) -> list[int | LlogError]:
        """Check the group after the writes, then confirm each pending commit (the group
        still in ``generation``, the member live) or withdraw it; one outcome each."""
        mine = [(tp, w) for tp, w in zip(tps, written, strict=True) if isinstance(w, _Written)]
        if not mine:
            return [w for w in written if isinstance(w, LlogError)]
        moved: LlogError | None
        try:
            moved = await self._moved(group, member_id, generation)
        except LlogError as exc:  # not checked: refused, as if it had moved
            moved = exc
        if moved is not None:
            await each(mine, lambda entry: self._withdraw(group, entry[0], entry[1]))
            settled: dict[TopicPartition, int | LlogError] = {tp: moved for tp, _ in mine}
        elif not self._pending:
            settled = {tp: w.offset for tp, w in mine}
        else:
            confirmed = await each(mine, lambda entry: self._confirm(group, *entry))
            settled = {tp: _refusal(group, member_id, generation, tp) if c is None else c
                       for (tp, _), c in zip(mine, confirmed, strict=True)}
        return [settled[tp] if isinstance(w, _Written) else w
                for tp, w in zip(tps, written, strict=True)]

    async def positions(self, group: str, tps: Sequence[TopicPartition], reset: Reset
                        ) -> list[int | LlogError]:
        """Where to read each partition: one past its committed offset, or by ``reset``
        when nothing is committed or the committed offset is out of range (retention
        removed what follows it)."""
        validate_group(group)

        # The generation is read first: every commit of an older one that is still
        # pending when its partition is read below is fenced there, so what is read is
        # the position for good (its commit can no longer be confirmed over it).
        view = await self._membership.current(group)
        current = 0 if view is None else view.generation

        async def one(tp: TopicPartition) -> int:
            found = await self._fenced(group, tp, current)
            bounds = await list_offsets(self._reader, tp)
            if found is not None and (bounds.log_start - 1 <= found.offset
                                      <= bounds.high_watermark):
                return found.offset + 1
            return bounds.log_start if reset == "earliest" else bounds.high_watermark + 1

        return await each(tps, one)

    async def _fenced(self, group: str, tp: TopicPartition, generation: int
                      ) -> CommittedOffset | None:
        """The confirmed commit of ``tp``, after dropping a pending commit of a
        generation older than ``generation`` (a pending one of ``generation`` is in
        flight and left alone: only its own generation's owner or reset writes it)."""

        async def attempt(_: int) -> Done[CommittedOffset | None] | Retry:
            found = await self._store.offset(group, tp)
            if found is None:
                return Done(None)
            record = found.value
            if record.pending is None or record.pending.generation >= generation:
                return Done(record.confirmed())
            try:
                await self._put_confirmed(group, tp, record.confirmed(), found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")
            return Done(record.confirmed())

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: read {tp}")

    async def _put_confirmed(self, group: str, tp: TopicPartition,
                             confirmed: CommittedOffset | None, version: int) -> None:
        """Replace the record at ``version`` by its confirmed commit alone (deleted when
        there is none)."""
        if confirmed is None:
            await self._store.delete_offset(group, tp, version)
        else:
            await self._store.put_offset(group, tp, confirmed, version)

    async def reset(self, group: str, targets: Sequence[ResetTarget]) -> list[int | LlogError]:
        """Set committed offsets of a group without live members. The targets are
        resolved first (nothing is written if one is invalid); then the group moves to
        a new generation (refused while a member lives), which the offsets are written
        with, so no commit of an earlier generation can land on top of them."""
        validate_group(group)
        if len({t.tp for t in targets}) != len(targets):
            raise InvalidRequest("a partition appears more than once; reset it once")
        outcomes = await each(targets, self._resolve)
        error = first_error(outcomes)
        if error is not None:
            raise error
        resolved = [o for o in outcomes if isinstance(o, int)]
        view = await self._membership.settle(group, _refuse_members(group), create=True,
                                             bump=True)
        assert view is not None
        # As a commit without a member: pending, checked after, then confirmed. A member
        # that joins in between reads the old positions (it fences the pending offsets),
        # and the reset is refused rather than confirmed under it.
        with anyio.CancelScope(shield=True):
            written = await each(list(zip(targets, resolved, strict=True)),
                                 lambda pair: self._write(group, pair[0].tp, pair[1],
                                                          view.generation, None))
            out = await self._settle_written(group, None, view.generation,
                                             [t.tp for t in targets], written)
        return [GroupNotEmpty(f"a member of {group!r} committed {t.tp} while it was reset")
                if isinstance(o, StaleGeneration) else o
                for t, o in zip(targets, out, strict=True)]

    async def _resolve(self, target: ResetTarget) -> int:
        bounds: PartitionOffsets = await list_offsets(self._reader, target.tp,
                                                      target.timestamp_ms)
        if target.offset is not None:
            if target.offset > bounds.high_watermark:
                raise OffsetBeyondHighWatermark(
                    f"offset {target.offset} for {target.tp} is beyond its high watermark "
                    f"{bounds.high_watermark}")
            return target.offset
        if bounds.for_time is not None:
            return bounds.for_time - 1
        return bounds.log_start - 1 if target.to == "earliest" else bounds.high_watermark

    async def _check_bounds(self, offsets: Sequence[tuple[TopicPartition, int]]) -> None:
        found = await each(offsets, lambda entry: list_offsets(self._reader, entry[0]))
        error = first_error(found)
        if error is not None:
            raise error
        for (tp, offset), bounds in zip(offsets, found, strict=True):
            assert isinstance(bounds, PartitionOffsets)
            if offset > bounds.high_watermark:
                raise OffsetBeyondHighWatermark(
                    f"offset {offset} for {tp} is beyond its high watermark "
                    f"{bounds.high_watermark}: commit the last offset processed")

    async def _write(self, group: str, tp: TopicPartition, offset: int, generation: int,
                     member_id: str | None) -> _Written:
        """Write one commit as pending by CAS, unless a newer generation wrote (or is
        writing) the partition. A pending commit of this or an older generation is
        replaced: that commit's confirmation then fails, and it is refused."""
        # Made once: a retry after an unanswered write recognises its own record.
        pending = PendingCommit(offset=offset, generation=generation,
                                committed_at_ms=self._clock(), member_id=member_id)

        direct = not self._pending
        replaced: CommittedOffset | None = None

        async def attempt(n: int) -> Done[_Written] | Retry:
            nonlocal replaced
            found = await self._store.offset(group, tp)
            if n > 0 and found is not None and (
                    found.value == CommittedOffset.confirming(pending) if direct
                    else found.value.pending == pending):
                return Done(_Written(pending, found.version, replaced, direct))  # applied
            confirmed = replaced = None if found is None else found.value.confirmed()
            in_flight = None if found is None else found.value.pending
            newest = max([c.generation for c in (confirmed, in_flight) if c is not None],
                         default=-1)
            if newest > generation:
                raise StaleGeneration(f"{tp} was committed by generation {newest} of "
                                      f"group {group!r}; this commit is of generation "
                                      f"{generation}")
            record = (CommittedOffset.confirming(pending) if direct
                      else CommittedOffset.holding(confirmed, pending))
            try:
                version = await self._store.put_offset(
                    group, tp, record, EXPECT_NOT_EXISTS if found is None else found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")  # the next read shows whether it applied
            return Done(_Written(pending, version, confirmed, direct))

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: commit {tp}")

    async def _confirm(self, group: str, tp: TopicPartition, written: _Written
                       ) -> int | None:
        """Make the pending commit the confirmed one, expecting the version it wrote:
        its offset, or None if it was dropped first (fenced). StorageUnavailable, saying
        so, when a confirmation went unanswered and the record has moved on since: it
        may have landed, and been read as a position."""
        mine = CommittedOffset.confirming(written.pending)
        unanswered = False

        async def attempt(n: int) -> Done[int | None] | Retry:
            nonlocal unanswered
            version = written.version
            if n > 0:  # after a conflict or an unanswered write: where does it stand?
                found = await self._store.offset(group, tp)
                if found is not None and found.value.confirmed() == mine:
                    # It had applied (another commit of the partition may be pending
                    # on top of it: this one stands until that one is confirmed).
                    return Done(written.offset)
                if found is None or found.value.pending != written.pending:
                    if unanswered:
                        raise StorageUnavailable(
                            f"the confirmation of the commit of {tp} went unanswered and "
                            "the offset has moved on since: it may have been committed; "
                            "read the group's committed offsets")
                    return Done(None)  # fenced by a reader, or replaced by a commit
                version = found.version
            try:
                await self._store.put_offset(group, tp, mine, version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                unanswered = True
                return Retry("in_doubt")
            return Done(written.offset)

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: confirm {tp}")

    async def _moved(self, group: str, member_id: str | None, generation: int
                     ) -> LlogError | None:
        """Why the commit no longer holds, read after its writes (None: it holds). The
        writes came before this read, so if the group is still in the generation (and
        the member live), they landed before any rebalance that follows."""
        if member_id is None:
            view = await self._membership.current(group)
            if view is None or view.generation != generation:
                return GroupNotEmpty(f"group {group!r} left generation {generation} while "
                                     "this commit was written (a member joined, or its "
                                     "offsets were reset); nothing was committed")
            return None
        view, live = await self._membership.standing(group, member_id)
        if view is None or view.record.member(member_id) is None or not live:
            return UnknownMember(f"the session of {member_id!r} in group {group!r} ended "
                                 "while this commit was written; nothing was committed; "
                                 "join again")
        if view.generation != generation:
            return StaleGeneration(f"group {group!r} moved to generation {view.generation} "
                                   f"while this commit of generation {generation} was "
                                   "written; nothing was committed: heartbeat for the "
                                   "current assignment")
        return None

    async def _withdraw(self, group: str, tp: TopicPartition, written: _Written) -> None:
        """Drop this refused commit's pending record, if it is still there: the record
        keeps its confirmed commit (or goes, where there is none). Retried; a withdrawal
        that still fails is counted, and harms no reader (a pending commit is never a
        position, and the first reader of a newer generation drops it)."""

        async def attempt(_: int) -> Done[None] | Retry:
            found = await self._store.offset(group, tp)
            if written.direct:  # put back what it replaced, unless written over since
                if found is None or found.value != CommittedOffset.confirming(
                        written.pending):
                    return Done(None)
                back = written.replaced
            elif found is None or found.value.pending != written.pending:
                return Done(None)  # dropped already (by a reader, a commit, or us)
            else:
                back = found.value.confirmed()
            try:
                await self._put_confirmed(group, tp, back, found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")
            return Done(None)

        try:
            await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: withdraw {tp}")
        except LlogError as exc:  # the refusal is answered all the same
            self._putback_failed()
            log.warning("group %s: a refused commit of %s (offset %d) stays pending: %s",
                        group, tp, written.offset, exc)



def _refusal(group: str, member_id: str | None, generation: int, tp: TopicPartition
             ) -> LlogError:
    """Why a commit whose pending record was dropped before its confirmation is refused:
    a reader of a newer generation fenced it, or another commit replaced it."""
    if member_id is None:
        return GroupNotEmpty(f"a member of {group!r} joined, or another commit wrote "
                             f"{tp}, before this commit was confirmed; nothing was "
                             "committed")
    return StaleGeneration(f"group {group!r} moved past generation {generation}, or "
                           f"another commit of {tp} by {member_id!r} replaced this one, "
                           "before it was confirmed; nothing was committed: heartbeat "
                           "for the current assignment")


def _refuse_members(group: str) -> Callable[[list[GroupMember]], list[GroupMember]]:
    def edit(live: list[GroupMember]) -> list[GroupMember]:
        if live:
            raise GroupNotEmpty(f"group {group!r} has {len(live)} live members; offsets "
                                "are reset only while no member is live")
        return live

    return edit

