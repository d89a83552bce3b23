"""The Oxia side of consumer groups: reads and conditional writes of group records,
leases and committed offsets. Every key is built by the key layout from validated
names; every answer of a scan is checked against the prefix asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from app.groups.group_records import CommittedOffset, GroupRecord, Lease
from app.storage.keys import GROUPS_PARTITION_KEY, KeyLayout, TopicPartition, group_partition_key
from app.stores.oxia.store import OxiaStore

T = TypeVar("T")


@dataclass(frozen=True)
class Versioned(Generic[T]):
    value: T
    version: int


class GroupStore:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout) -> None:
        self._oxia = oxia
        self._layout = layout

    # -- group records (one shard: the partition key _groups) ------------------------

    async def group(self, group: str) -> Versioned[GroupRecord] | None:
        found = await self._oxia.get(self._layout.group_record(group), GROUPS_PARTITION_KEY)
        return None if found is None else Versioned(GroupRecord.parse(found.value),
                                                    found.version_id)

    async def put_group(self, record: GroupRecord, expected_version: int) -> int:
        """CAS (or create with ``EXPECT_NOT_EXISTS``); raises VersionMismatch."""
        return await self._oxia.put(self._layout.group_record(record.group), record.to_json(),
                                    GROUPS_PARTITION_KEY, expected_version=expected_version)

    async def groups(self, after: str | None, limit: int) -> list[GroupRecord]:
        """Up to ``limit`` group records in name order, after the group ``after``."""
        prefix = self._layout.groups_prefix()
        # '-' is the smallest character of a name: the first name after ``after``.
        low = self._layout.group_record(after) + "-" if after else prefix
        records = await self._oxia.range_scan(low, prefix + "~", GROUPS_PARTITION_KEY,
                                              limit=limit)
        return [GroupRecord.parse(r.value) for r in records
                if r.key.startswith(prefix) and "/" not in r.key[len(prefix):]]

    # -- leases (the group's own partition key) --------------------------------------

    async def lease(self, group: str, member_id: str) -> Versioned[Lease] | None:
        found = await self._oxia.get(self._layout.group_lease(group, member_id),
                                     group_partition_key(group))
        return None if found is None else Versioned(Lease.parse(found.value), found.version_id)

    async def leases(self, group: str) -> dict[str, Versioned[Lease]]:
        prefix = self._layout.group_members_prefix(group)
        records = await self._oxia.range_scan(prefix, prefix + "~", group_partition_key(group))
        out: dict[str, Versioned[Lease]] = {}
        for r in records:
            if r.key.startswith(prefix) and "/" not in r.key[len(prefix):]:
                lease = Lease.parse(r.value)
                out[lease.member_id] = Versioned(lease, r.version_id)
        return out

    async def put_lease(self, group: str, lease: Lease, expected_version: int) -> int:
        return await self._oxia.put(self._layout.group_lease(group, lease.member_id),
                                    lease.to_json(), group_partition_key(group),
                                    expected_version=expected_version)

    async def delete_lease(self, group: str, member_id: str,
                           expected_version: int | None = None) -> None:
        await self._oxia.delete(self._layout.group_lease(group, member_id),
                                group_partition_key(group), expected_version=expected_version)

    # -- committed offsets (the group's own partition key) ---------------------------

    async def offset(self, group: str, tp: TopicPartition
                     ) -> Versioned[CommittedOffset] | None:
        found = await self._oxia.get(self._layout.group_offset(group, tp),
                                     group_partition_key(group))
        return None if found is None else Versioned(CommittedOffset.parse(found.value),
                                                    found.version_id)

    async def put_offset(self, group: str, tp: TopicPartition, committed: CommittedOffset,
                         expected_version: int) -> int:
        return await self._oxia.put(self._layout.group_offset(group, tp), committed.to_json(),
                                    group_partition_key(group),
                                    expected_version=expected_version)

    async def delete_offset(self, group: str, tp: TopicPartition, expected_version: int
                            ) -> None:
        await self._oxia.delete(self._layout.group_offset(group, tp), group_partition_key(group),
                                expected_version=expected_version)

    async def offsets(self, group: str, limit: int) -> dict[TopicPartition, CommittedOffset]:
        """The group's offset records (at most ``limit``, in partition order), pending
        commits included: :meth:`CommittedOffset.confirmed` is what readers see."""
        prefix = self._layout.group_offsets_prefix(group)
        # Offset keys are two segments below the prefix: '~/~' bounds that depth.
        records = await self._oxia.range_scan(prefix, prefix + "~/~",
                                              group_partition_key(group), limit=limit)
        out: dict[TopicPartition, CommittedOffset] = {}
        for r in records:
            tp = self._layout.parse_group_offset(group, r.key)
            if tp is not None:
                out[tp] = CommittedOffset.parse(r.value)
        return out
