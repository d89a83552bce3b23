"""Membership: each broker worker announces itself in Oxia, and sees the live set.

A worker puts its :class:`BrokerMember` record as an Oxia ephemeral record under
``{root}/_brokers/{member_id}`` (docs/protocol.md, MEMBER), so the record goes when the
worker's session does: at once on a clean stop (:meth:`ClusterMembership.leave`), within
``LLOG_OXIA_SESSION_TIMEOUT_MS`` when the process dies. Every ``refresh_s`` it lists the
members again (one range scan of one shard) and makes a new :class:`MemberView`, from
which every worker computes the same preferred appender per partition.

The view is a routing hint, never a basis for correctness: any worker may append to any
partition whatever its view says. So the loop favours staying up over being exact: a
listing that fails keeps the last view; a record of ours that went missing (our session
expired while the process stalled) is put again; a record of our id put by another
process (two processes given one ``LLOG_BROKER_ID``) is reported, not fought over. This
process then acts as a non-member, which is only slower.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry

from app.cluster.members import BrokerMember, MemberView
from app.cluster.metrics import MembershipMetrics
from app.errors import LlogError, VersionMismatch
from app.storage.keys import MEMBERS_PARTITION_KEY, KeyLayout
from app.stores.oxia.store import OxiaStore, Record

__all__ = ["BrokerMember", "ClusterMembership", "MemberView"]
log = logging.getLogger(__name__)
# Bound of one Oxia call of the loop (the store's own deadline is usually shorter).
CALL_TIMEOUT_S = 10.0


class ClusterMembership:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout, me: BrokerMember, *, refresh_s: float,
                 registry: CollectorRegistry | None = None,
                 call_timeout_s: float = CALL_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._oxia = oxia
        self._layout = layout
        self._me = me
        self._key = layout.member(me.member_id)
        self._refresh_s = refresh_s
        self._timeout = call_timeout_s
        self._clock = clock
        self._metrics = MembershipMetrics(registry, me.member_id)
        self._started_at_ms = int(time.time() * 1000)
        self._view = MemberView()
        self._listed = False
        self._suspects: dict[str, float] = {}  # member id -> monotonic deadline
        self._version: int | None = None  # of our record, as last put or listed
        self._dirty = True  # our record is to be put (start, `me` changed, went missing)
        self._clash = False  # the record of our id is another process's
        self._left = False
        self._failing = False
        self._bad_records: set[tuple[str, int]] = set()
        self._writes = anyio.Lock()
        self._wake = anyio.Event()
        self._changed = anyio.Event()
        self._watchers: list[Callable[[MemberView], None]] = []
        self.registrations = 0  # times our record was put

    @property
    def me(self) -> BrokerMember:
        return self._me

    def view(self) -> MemberView:
        """The current view; suspicions that ran out are dropped first."""
        if self._suspects:
            now = self._clock()
            expired = [m for m, until in self._suspects.items() if until <= now]
            if expired:
                for member_id in expired:
                    del self._suspects[member_id]
                self._set_view(self._view.members)
        return self._view

    def on_change(self, watcher: Callable[[MemberView], None]) -> None:
        """Call ``watcher`` with the view now and with every new view, in the step that
        makes it (so nothing acts on the old view in between); it must not raise."""
        self._watchers.append(watcher)
        watcher(self._view)

    async def next_change(self) -> None:
        """Return at the next change of the view, or of our own registration."""
        await self._changed.wait()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Register, list, report started once there is a view; then list again every
        ``refresh_s`` (at once after :meth:`update_me`) until cancelled."""
        while not await self.refresh():
            await self._pause()
        task_status.started()
        while True:
            await self._pause()
            await self.refresh()

    def update_me(self, forward: str) -> None:
        """Our forward listener's address changed: put our record again soon."""
        if forward != self._me.forward:
            self._me = dataclasses.replace(self._me, forward=forward)
            self._dirty = True
            self._wake.set()

    def suspect(self, member_id: str, for_s: float) -> None:
        """Preferences skip ``member_id`` for ``for_s`` seconds (it did not answer)."""
        if member_id == self._me.member_id or for_s <= 0:
            return
        until = self._clock() + for_s
        if self._suspects.get(member_id, 0.0) >= until:
            return
        fresh = member_id not in self._suspects
        self._suspects[member_id] = until
        if fresh:
            self._metrics.changes["suspected"].inc()
            self._set_view(self._view.members)

    async def leave(self) -> None:
        """Delete our record (at its version, so never another process's) and stop
        putting it. Idempotent; raises LlogError or TimeoutError when Oxia does not
        answer (the record then goes with our session)."""
        self._left = True
        with anyio.CancelScope(shield=True), anyio.fail_after(self._timeout):
            async with self._writes:
                version = self._version
                if version is None or self._clash:
                    return
                with contextlib.suppress(VersionMismatch):  # another process's since
                    await self._oxia.delete(self._key, MEMBERS_PARTITION_KEY,
                                            expected_version=version)
                self._version = None
        self._set_view(m for m in self._view.members if m.member_id != self._me.member_id)

    # -- the loop --------------------------------------------------------------------

    async def _pause(self) -> None:
        with anyio.move_on_after(self._refresh_s):
            await self._wake.wait()
        self._wake = anyio.Event()

    async def refresh(self) -> bool:
        """One round now: put our record if due, list, adopt the listing. False (the
        last view kept) when Oxia did not answer. The loop runs one every
        ``refresh_s``; call it on learning of a change."""
        try:
            if self._dirty:
                await self._put()
            with anyio.fail_after(self._timeout):
                records = await self._oxia.range_scan(
                    self._layout.members_prefix(), self._layout.members_prefix() + "~",
                    MEMBERS_PARTITION_KEY)
            found = self._parse(records)
            if self._own_record_missing(found):
                await self._put()
                if self._version is not None:
                    found[self._me.member_id] = self._me
        except (LlogError, TimeoutError) as exc:
            if not self._failing:
                log.warning("membership of %s: Oxia did not answer (%s); keeping the last "
                            "view and trying again every %.1f s", self._me.member_id,
                            exc or type(exc).__name__, self._refresh_s)
            self._failing = True
            return False
        if self._failing:
            log.info("membership of %s: Oxia answers again", self._me.member_id)
            self._failing = False
        self._adopt(found.values())
        return True

    async def _put(self) -> None:
        with anyio.fail_after(self._timeout):
            async with self._writes:
                if self._left or self._clash:
                    return
                me = self._me
                self._version = await self._oxia.put(
                    self._key, me.to_record(started_at_ms=self._started_at_ms),
                    MEMBERS_PARTITION_KEY, ephemeral=True)
                self._dirty = me != self._me  # changed while it was being put
                self.registrations += 1
        self._announce()

    def _parse(self, records: list[Record]) -> dict[str, BrokerMember]:
        found: dict[str, BrokerMember] = {}
        for record in records:
            member_id = self._layout.parse_member_key(record.key)
            if member_id is None:
                continue  # deeper: a topic named _brokers
            try:
                member = BrokerMember.from_record(record.value)
                if member.member_id != member_id:
                    raise ValueError(f"it names {member.member_id!r}")
            except ValueError as exc:
                if (record.key, record.version_id) not in self._bad_records:
                    self._bad_records.add((record.key, record.version_id))
                    log.warning("membership: ignoring the record %s: %s", record.key, exc)
                continue
            if member_id == self._me.member_id:
                if self._left:
                    continue  # a listing read before our delete landed: we are gone
                self._check_own(member, record.version_id)
            found[member_id] = member
        return found

    def _check_own(self, listed: BrokerMember, version: int) -> None:
        if listed.incarnation == self._me.incarnation:
            self._version, self._clash = version, False
            return
        if not self._clash:
            log.error("membership: another process registered as %s (incarnation %s, "
                      "ours %s): are two brokers given one LLOG_BROKER_ID? This one leaves "
                      "it to the other and appends without a preference", listed.member_id,
                      listed.incarnation, self._me.incarnation)
            self._metrics.changes["id_clash"].inc()
        self._clash = True

    def _own_record_missing(self, found: dict[str, BrokerMember]) -> bool:
        """Our record went (our session expired, or the other process of our id
        stopped): it is to be put again."""
        if self._left or self._me.member_id in found:
            return False
        if self._version is not None or self._clash:
            log.warning("membership: the record of %s went missing (the Oxia session "
                        "expired?); putting it again", self._me.member_id)
            self._metrics.changes["reregistered"].inc()
        self._clash = False
        return True

    def _adopt(self, listed: Iterable[BrokerMember]) -> None:
        members = tuple(sorted(listed, key=lambda m: m.member_id))
        before = set(self._view.ids())
        after = {m.member_id for m in members}
        first, self._listed = not self._listed, True
        if not first:  # the first listing is no change
            self._metrics.changes["joined"].inc(len(after - before))
            self._metrics.changes["left"].inc(len(before - after))
        self._metrics.members.set(len(members))
        if first or members != self._view.members:
            self._set_view(members)

    def _set_view(self, members: Iterable[BrokerMember]) -> None:
        self._view = MemberView(tuple(members), frozenset(self._suspects))
        for watcher in self._watchers:
            watcher(self._view)
        self._announce()

    def _announce(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
