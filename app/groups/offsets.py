"""A group's committed offsets: commits fenced by generation, where a member resumes,
and resets by an operator (docs/protocol.md, Consumer groups).

A committed offset is the last offset the group processed in a partition; reading
resumes one past it. Each record carries the generation that wrote it, and a commit
never replaces a record of a newer generation, so a member that lost its partitions in
a rebalance cannot move them after the new owner has committed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

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
from app.groups.store import GroupStore
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import TopicPartition, validate_group
from app.storage.offsets import PartitionOffsets, list_offsets
from app.storage.oxia_store import EXPECT_NOT_EXISTS
from app.storage.reader import LogReader
from app.storage.records import now_ms

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
        view = await self._membership.current(group)
        if view is None or view.record.member(member_id) is None:
            raise UnknownMember(f"{member_id!r} is not a member of group {group!r}; "
                                "join again")
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
        return await each(offsets, lambda entry: self._write(
            group, entry[0], entry[1], committing, member_id))

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
                     member_id: str | None) -> int:
        """Write one committed offset by CAS, unless a newer generation wrote it."""

        async def attempt(_: int) -> Done[int] | Retry:
            found = await self._store.offset(group, tp)
            if found is not None and found.value.generation > generation:
                raise StaleGeneration(f"{tp} was committed by generation "
                                      f"{found.value.generation} of group {group!r}; this "
                                      f"commit is of generation {generation}")
            committed = CommittedOffset(offset=offset, generation=generation,
                                        committed_at_ms=self._clock(), member_id=member_id)
            try:
                await self._store.put_offset(group, tp, committed,
                                             EXPECT_NOT_EXISTS if found is None
                                             else found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")  # writing the same value again is harmless
            return Done(offset)

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}: commit {tp}")


def _refuse_members(group: str) -> Callable[[list[Member]], list[Member]]:
    def edit(live: list[Member]) -> list[Member]:
        if live:
            raise GroupNotEmpty(f"group {group!r} has {len(live)} live members; offsets "
                                "are reset only while no member is live")
        return live

    return edit

