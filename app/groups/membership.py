"""Joining, heartbeating and leaving a group, and the one change every membership
operation goes through (docs/protocol.md, Consumer groups).

The group record lists the members and carries the generation; each member's lease is
a record of its own, renewed by its heartbeats through any broker. Whoever reads the
group (a join, a leave, a heartbeat now and then, a describe, a commit without a member,
a reset) settles it: members whose lease is gone or expired are dropped, partition
counts are refreshed, and if anything changed the record is rewritten by
compare-and-set with the generation bumped. A heartbeat writes only its own lease, so
members never contend on the group record while nothing changes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import anyio
from cachetools import LRUCache, TTLCache

from app.errors import (
    GroupFull,
    InvalidRequest,
    LlogError,
    PayloadTooLarge,
    StorageUnavailable,
    UnknownMember,
    VersionMismatch,
)
from app.groups.assignment import Assignment, Subscription, assign
from app.groups.group_records import GroupMember, GroupRecord, Lease
from app.groups.store import GroupStore, Versioned
from app.settings import GroupSettings, default_broker_id
from app.storage.cas import Done, Retry, cas_loop
from app.storage.keys import TopicPartition, validate_group, validate_topic
from app.storage.metadata import now_ms
from app.stores.oxia.store import EXPECT_NOT_EXISTS

log = logging.getLogger(__name__)
PartitionCount = Callable[[str], Awaitable[int]]  # a topic's partitions (0: no such topic)
Edit = Callable[[list[GroupMember]], list[GroupMember]]
_ATTEMPTS = 16
CLEANUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GroupView:
    """A group record as read (or just written), with its Oxia version and, when it was
    settled, the leases seen."""

    record: GroupRecord
    version: int
    leases: dict[str, Versioned[Lease]] | None = None

    @property
    def generation(self) -> int:
        return self.record.generation


class GroupMembership:
    def __init__(self, store: GroupStore, groups: GroupSettings, partitions_of: PartitionCount,
                 *, broker_id: str | None = None, clock: Callable[[], int] = now_ms) -> None:
        """``broker_id``: the broker a lease names as its renewer (LLOG_BROKER_ID; none:
        the default broker id)."""
        self._store = store
        self._settings = groups
        self._broker_id = broker_id or default_broker_id()
        self._partitions_of = partitions_of
        self._clock = clock
        self._assignments: LRUCache[tuple[str, int, int], Assignment] = LRUCache(1024)
        # When this broker last settled a group: heartbeats settle at most this often.
        self._settled: TTLCache[str, bool] = TTLCache(
            maxsize=100_000, ttl=groups.group_min_session_timeout_ms / 2000)

    def assignment(self, view: GroupView) -> Assignment:
        """The group's assignment (cached: a generation never changes its inputs; the
        creation time tells a group from one of the same name in a store reset since)."""
        key = (view.record.group, view.record.created_at_ms, view.generation)
        found = self._assignments.get(key)
        if found is None:
            found = self._assignments[key] = assign(
                (Subscription(m.member_id, frozenset(m.topics)) for m in view.record.members),
                view.record.partitions)
        return found

    def owned(self, view: GroupView, member_id: str) -> tuple[TopicPartition, ...]:
        return self.assignment(view).get(member_id, ())

    async def current(self, group: str) -> GroupView | None:
        """The group record as it is, without settling it."""
        found = await self._store.group(validate_group(group))
        return None if found is None else GroupView(found.value, found.version)

    async def standing(self, group: str, member_id: str) -> tuple[GroupView | None, bool]:
        """The group record as it is (not settled) and whether the member's lease is
        live, both read at the same time."""
        found, lease = await self._both(group, member_id)
        view = None if found is None else GroupView(found.value, found.version)
        return view, lease is not None and lease.value.alive(self._clock())

    # -- join, heartbeat, leave --------------------------------------------------------

    async def join(self, group: str, topics: Iterable[str], *, client_id: str | None,
                   session_timeout_ms: int | None) -> tuple[GroupView, GroupMember]:
        """A new member with a fresh lease, listed in a new generation."""
        validate_group(group)
        member = GroupMember(member_id=uuid.uuid4().hex, topics=self._subscription(topics),
                        session_timeout_ms=self._session(session_timeout_ms),
                        joined_at_ms=self._clock(), client_id=client_id)
        await self._check_room(group, member)
        # The lease first: a settle that runs between the two writes sees a fresh lease
        # that no record lists yet and leaves it alone.
        await self._store.put_lease(group, self._lease(member), EXPECT_NOT_EXISTS)

        def add(live: list[GroupMember]) -> list[GroupMember]:
            others = [m for m in live if m.member_id != member.member_id]
            if len(others) >= self._full():
                raise GroupFull(f"group {group!r} has {len(others)} members; the limit "
                                f"is {self._full()} (LLOG_GROUP_MAX_MEMBERS)")
            return [*others, member]

        try:
            view = await self.settle(group, add, create=True)
        except BaseException:
            await self._drop_lease(group, member.member_id)
            raise
        assert view is not None
        return view, member

    async def heartbeat(self, group: str, member_id: str) -> tuple[GroupView, GroupMember]:
        """Renew the member's lease; the group as it stands (settled now and then)."""
        found, lease = await self._both(group, member_id)
        member = None if found is None else found.value.member(member_id)
        if found is None or member is None:
            raise UnknownMember(f"{member_id!r} is not a member of group {group!r}; "
                                "join again")
        if lease is None or not lease.value.alive(self._clock()):
            await self.settle(group)
            raise UnknownMember(f"the session of {member_id!r} in group {group!r} expired "
                                "and its partitions moved; join again")
        await self._renew(group, member, lease)
        view = GroupView(found.value, found.version)
        if group not in self._settled:
            view = await self.settle(group) or view
            if view.record.member(member_id) is None:
                raise UnknownMember(f"{member_id!r} left group {group!r}; join again")
        return view, member

    async def leave(self, group: str, member_id: str) -> tuple[GroupView | None, bool]:
        """Drop the member (a new generation if it was one); whether it was."""
        before = await self.current(group)
        was_member = before is not None and before.record.member(member_id) is not None
        view = await self.settle(group, lambda live: [m for m in live
                                                      if m.member_id != member_id])
        await self._drop_lease(group, member_id)
        return view, was_member

    # -- the one change ----------------------------------------------------------------

    async def settle(self, group: str, edit: Edit | None = None, *, create: bool = False,
                     bump: bool = False) -> GroupView | None:
        """Read the group and its leases, drop members without a live lease, apply
        ``edit`` to the live members, refresh partition counts; if anything changed
        (or ``bump``), write the record with the next generation by compare-and-set.
        None when the group does not exist (and ``create`` is off)."""
        validate_group(group)

        async def attempt(_: int) -> Done[GroupView | None] | Retry:
            found = await self._store.group(group)
            if found is None and not create:
                return Done(None)
            now = self._clock()
            record = found.value if found else GroupRecord(group=group, created_at_ms=now)
            leases = await self._store.leases(group)
            live = [m for m in record.members
                    if (lease := leases.get(m.member_id)) and lease.value.alive(now)]
            members = sorted(edit(live) if edit else live, key=lambda m: m.member_id)
            partitions = await self._counts(members)
            if (found is not None and not bump and tuple(members) == record.members
                    and partitions == record.partitions):
                return Done(GroupView(record, found.version, leases))
            updated = record.model_copy(update={
                "generation": record.generation + 1, "members": tuple(members),
                "partitions": partitions, "updated_at_ms": now})
            try:
                version = await self._store.put_group(
                    updated, EXPECT_NOT_EXISTS if found is None else found.version)
            except VersionMismatch:
                return Retry("conflict")
            except StorageUnavailable:
                return Retry("in_doubt")  # the next read tells whether it applied
            return Done(GroupView(updated, version, leases))

        view = await cas_loop(attempt, attempts=_ATTEMPTS, what=f"group {group}")
        self._settled[group] = True
        if view is not None and view.leases:
            await self._sweep(group, view.leases)
        return view

    # -- helpers -------------------------------------------------------------------------

    def _subscription(self, topics: Iterable[str]) -> tuple[str, ...]:
        wanted = sorted({validate_topic(t) for t in topics})
        if not wanted:
            raise InvalidRequest("a member subscribes to at least one topic")
        if len(wanted) > self._settings.group_max_topics:
            raise PayloadTooLarge(f"{len(wanted)} topics; a member subscribes to at most "
                                  f"{self._settings.group_max_topics} "
                                  "(LLOG_GROUP_MAX_TOPICS)")
        return tuple(wanted)

    def _session(self, requested: int | None) -> int:
        s = self._settings
        if requested is None:
            return s.group_session_timeout_ms
        if not s.group_min_session_timeout_ms <= requested <= s.group_max_session_timeout_ms:
            raise InvalidRequest(f"session_timeout_ms {requested} is outside "
                                 f"{s.group_min_session_timeout_ms}.."
                                 f"{s.group_max_session_timeout_ms}")
        return requested

    def _lease(self, member: GroupMember) -> Lease:
        now = self._clock()
        return Lease(member_id=member.member_id, expires_at_ms=now + member.session_timeout_ms,
                     renewed_at_ms=now, broker_id=self._broker_id)

    async def _check_room(self, group: str, member: GroupMember) -> None:
        """Refuse, before writing anything, a join to a group that is full (after
        settling it) or that the subscription would take over LLOG_GROUP_MAX_PARTITIONS
        (the settle itself enforces the member limit, under concurrent joins too)."""
        current = await self.current(group)
        if current is not None and len(current.record.members) >= self._full():
            current = await self.settle(group)
            if current is not None and len(current.record.members) >= self._full():
                raise GroupFull(f"group {group!r} has {len(current.record.members)} "
                                f"members; the limit is {self._full()} "
                                "(LLOG_GROUP_MAX_MEMBERS)")
        topics = set(member.topics) | set(current.record.partitions if current else ())
        total = sum([await self._partitions_of(t) for t in sorted(topics)])
        if total > self._settings.group_max_partitions:
            raise GroupFull(f"group {group!r} would read {total} partitions; the "
                            f"limit is {self._settings.group_max_partitions} "
                            "(LLOG_GROUP_MAX_PARTITIONS)")

    def _full(self) -> int:
        return self._settings.group_max_members

    async def _counts(self, members: list[GroupMember]) -> dict[str, int]:
        topics = sorted({t for m in members for t in m.topics})
        return {t: await self._partitions_of(t) for t in topics}

    async def _both(self, group: str, member_id: str
                    ) -> tuple[Versioned[GroupRecord] | None, Versioned[Lease] | None]:
        """The group record and the member's lease, read at the same time."""
        validate_group(group)
        found: Versioned[GroupRecord] | None = None
        lease: Versioned[Lease] | None = None
        failed: LlogError | None = None

        # A failed read fails the whole as a sequential read would (503, or the commit's
        # own handling), not as the task group's ExceptionGroup, which no handler knows.
        async def read_group() -> None:
            nonlocal found, failed
            try:
                found = await self._store.group(group)
            except LlogError as exc:
                failed = exc
                tg.cancel_scope.cancel()

        async def read_lease() -> None:
            nonlocal lease, failed
            try:
                lease = await self._store.lease(group, member_id)
            except LlogError as exc:
                failed = exc
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_group)
            tg.start_soon(read_lease)
        if failed is not None:
            raise failed
        return found, lease

    async def _renew(self, group: str, member: GroupMember, lease: Versioned[Lease]) -> None:
        """Extend the lease by CAS on the version read: a settle that deleted it in
        between wins, and the member is told to join again."""
        try:
            await self._store.put_lease(group, self._lease(member), lease.version)
        except VersionMismatch:
            again = await self._store.lease(group, member.member_id)
            if again is None or not again.value.alive(self._clock()):
                raise UnknownMember(f"the session of {member.member_id!r} in group "
                                    f"{group!r} ended; join again") from None
            # Renewed meanwhile by the same member through another broker: fine.

    async def _sweep(self, group: str, leases: dict[str, Versioned[Lease]]) -> None:
        """Delete expired leases (of members just dropped, or of joins that never made
        it into the record), each only if unchanged since it was read."""
        now = self._clock()
        for member_id, lease in leases.items():
            if not lease.value.alive(now):
                try:
                    await self._store.delete_lease(group, member_id, lease.version)
                except (VersionMismatch, StorageUnavailable) as exc:
                    log.debug("group %s: lease %s not swept: %r", group, member_id, exc)

    async def _drop_lease(self, group: str, member_id: str) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT_S):
            try:
                await self._store.delete_lease(group, member_id)
            except StorageUnavailable as exc:
                log.warning("group %s: the lease of %s stays until it expires: %s",
                            group, member_id, exc)
