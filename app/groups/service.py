"""What a broker offers about consumer groups: membership, offsets, and the operator's
views (list, describe)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from app.errors import UnknownGroup
from app.groups.assignment import Assignment
from app.groups.bounded import each, first_error
from app.groups.committed_offsets import GroupOffsets
from app.groups.group_records import CommittedOffset, GroupRecord
from app.groups.membership import GroupMembership, GroupView, PartitionCount
from app.groups.store import GroupStore
from app.settings import GroupSettings
from app.storage.keys import KeyLayout, TopicPartition, validate_group
from app.storage.log_positions import PartitionOffsets, list_offsets
from app.storage.reader import LogReader
from app.stores.oxia.store import OxiaStore


@dataclass(frozen=True)
class PartitionLag:
    tp: TopicPartition
    owner: str | None
    committed: CommittedOffset | None
    log_start: int
    high_watermark: int

    @property
    def lag(self) -> int | None:
        """Records not yet processed: the high watermark minus the committed offset."""
        return None if self.committed is None else self.high_watermark - self.committed.offset


@dataclass(frozen=True)
class GroupDescription:
    view: GroupView
    assignment: Assignment
    partitions: list[PartitionLag]


class GroupService:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout, reader: LogReader,
                 groups: GroupSettings, partitions_of: PartitionCount, *,
                 broker_id: str, registry: CollectorRegistry | None = None) -> None:
        self._store = GroupStore(oxia, layout)
        self._reader = reader
        self._settings = groups
        self.membership = GroupMembership(self._store, groups, partitions_of, broker_id=broker_id)
        self.putback_failures = Counter(
            "llog_group_putback_failures", "Refused group commits whose pending offset could "
            "not be withdrawn (Oxia refusing writes; readers are unaffected)",
            registry=registry)
        self.offsets = GroupOffsets(self._store, self.membership, reader,
                                    putback_failed=self.putback_failures.inc,
                                    pending=groups.group_pending_commits)

    async def describe(self, group: str) -> GroupDescription:
        """The group settled now: its members and their leases, the assignment, and per
        partition (those of its topics, and any other it committed) the committed
        offset and the lag."""
        view = await self.membership.settle(validate_group(group))
        if view is None:
            raise UnknownGroup(f"group {group!r} does not exist")
        limit = self._settings.group_max_partitions
        # What was confirmed: a pending commit is nobody's position
        # (app/groups/committed_offsets.py).
        committed = {tp: confirmed for tp, record in (await self._store.offsets(group, limit)
                                                      ).items()
                     if (confirmed := record.confirmed()) is not None}
        assignment = self.membership.assignment(view)
        owners = {tp: member for member, tps in assignment.items() for tp in tps}
        tps = sorted(set(owners) | set(committed))[:limit]
        bounds = await each(tps, lambda tp: list_offsets(self._reader, tp))
        error = first_error(bounds)
        if error is not None:
            raise error
        return GroupDescription(view, assignment, [
            PartitionLag(tp, owners.get(tp), committed.get(tp), b.log_start, b.high_watermark)
            for tp, b in zip(tps, bounds, strict=True) if isinstance(b, PartitionOffsets)])

    async def page(self, after: str | None, limit: int) -> tuple[list[GroupRecord], str | None]:
        """A page of groups in name order, and the name to continue after (None: the
        last page)."""
        if after is not None:
            validate_group(after)
        found = await self._store.groups(after, limit + 1)
        page = found[:limit]
        return page, page[-1].group if len(found) > limit else None
