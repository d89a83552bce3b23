"""A group's committed offsets: commits fenced by generation, where a member resumes,
and resets by an operator (docs/protocol.md, Consumer groups).

A committed offset is the last offset the group processed in a partition; reading
resumes one past it. Each record carries the generation that wrote it, and a commit
never replaces a record of a newer generation, so a member that lost its partitions in
a rebalance cannot move them after the new owner has committed.

The group record and the offsets live on different Oxia shards, and Oxia conditions a
write on the version of the key written only, so no write of an offset can be
conditioned on the group record. A commit therefore checks the group (the member
listed, its lease live, the generation current), writes, and reads the group again:
if it moved meanwhile, each offset written is put back by compare-and-set on the
version this commit wrote (a later commit's record stands), and the commit is refused.
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
from app.groups.membership import Membership
from app.groups.records import CommittedOffset, Member
from app.groups.store import GroupStore, Versioned
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import TopicPartition, validate_group
from app.storage.offsets import PartitionOffsets, list_offsets
from app.storage.oxia_store import EXPECT_NOT_EXISTS
from app.storage.reader import LogReader
from app.storage.records import now_ms

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
    """One offset this commit wrote: the record it replaced (None: there was none) and
    the version it wrote, so that it can be put back if the group moved meanwhile."""

    offset: int
    before: Versioned[CommittedOffset] | None
    version: int


class GroupOffsets:
    def __init__(self, store: GroupStore, membership: Membership, reader: LogReader, *,
                 clock: Callable[[], int] = now_ms) -> None:
        self._store = store
        self._membership = membership
        self._reader = reader
        self._clock = clock

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
        # them would leave offsets of a generation that may have ended.
        with anyio.CancelScope(shield=True):
            written = await each(offsets, lambda entry: self._write(
                group, entry[0], entry[1], committing, member_id))
            moved: LlogError | None = None
            if any(isinstance(w, _Written) for w in written):
                try:
                    moved = await self._moved(group, member_id, committing)
                except LlogError as exc:  # not checked: put back, as if it had moved
                    moved = exc
            if moved is not None:
                await each([(tp, w) for (tp, _), w in zip(offsets, written, strict=True)
                            if isinstance(w, _Written)],
                           lambda entry: self._undo(group, entry[0], entry[1]))
        return [moved if moved is not None and isinstance(w, _Written) else
                w.offset if isinstance(w, _Written) else w for w in written]

    async def positions(self, group: str, tps: Sequence[TopicPartition], reset: Reset
                        ) -> list[int | LlogError]:
        """Where to read each partition: one past its committed offset, or by ``reset``
        when nothing is committed or the committed offset is out of range (retention
        removed what follows it)."""
        validate_group(group)

        async def one(tp: TopicPartition) -> int:
            found = await self._store.offset(group, tp)
            bounds = await list_offsets(self._reader, tp)
            if found is not None and (bounds.log_start - 1 <= found.value.offset
                                      <= bounds.high_watermark):
                return found.value.offset + 1
            return bounds.log_start if reset == "earliest" else bounds.high_watermark + 1

        return await each(tps, one)

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
        out = await each(list(zip(targets, resolved, strict=True)), lambda pair: self._write(
            group, pair[0].tp, pair[1], view.generation, None))
        return [GroupNotEmpty(f"a member of {group!r} committed {t.tp} while it was reset")
                if isinstance(o, StaleGeneration) else
                o.offset if isinstance(o, _Written) else o
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
        """Write one committed offset by CAS, unless a newer generation wrote it."""
        # Made once: a retry after an unanswered write recognises its own record.
        committed = CommittedOffset(offset=offset, generation=generation,
                                    committed_at_ms=self._clock(), member_id=member_id)
        before: Versioned[CommittedOffset] | None = None

        async def attempt(n: int) -> Done[_Written] | Retry:
            nonlocal before
            found = await self._store.offset(group, tp)
            if n > 0 and found is not None and found.value == committed:
                return Done(_Written(offset, before, found.version))  # it had applied
            if found is not None and found.value.generation > generation:
                raise StaleGeneration(f"{tp} was committed by generation "
                                      f"{found.value.generation} of group {group!r}; this "
                                      f"commit is of generation {generation}")
            before = found
            try:
                version = await self._store.put_offset(group, tp, committed,
                                                       EXPECT_NOT_EXISTS if found is None
                                                       else found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")  # the next read shows whether it applied
            return Done(_Written(offset, found, version))

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: commit {tp}")

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

    async def _undo(self, group: str, tp: TopicPartition, written: _Written) -> None:
        """Put back the record this commit replaced, expecting the version it wrote: if
        anything wrote the offset since (a newer generation's commit, a reset), that
        record stands."""

        async def attempt(_: int) -> Done[None] | Retry:
            found = await self._store.offset(group, tp)
            if found is None or found.version != written.version:
                return Done(None)  # put back already (an unanswered attempt), or replaced
            try:
                if written.before is None:
                    await self._store.delete_offset(group, tp, written.version)
                else:
                    await self._store.put_offset(group, tp, written.before.value,
                                                 written.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")
            return Done(None)

        try:
            await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: undo {tp}")
        except LlogError as exc:  # the refusal is answered all the same
            log.warning("group %s: a refused commit of %s stays written (offset %d): %s",
                        group, tp, written.offset, exc)


def _refuse_members(group: str) -> Callable[[list[Member]], list[Member]]:
    def edit(live: list[Member]) -> list[Member]:
        if live:
            raise GroupNotEmpty(f"group {group!r} has {len(live)} live members; offsets "
                                "are reset only while no member is live")
        return live

    return edit

