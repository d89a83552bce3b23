"""Membership metrics: the live set's size as this member sees it, and its changes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

CHANGE_KINDS = ("joined", "left", "suspected", "reregistered", "id_clash")


class MembershipMetrics:
    def __init__(self, registry: CollectorRegistry | None, member_id: str) -> None:
        r = registry if registry is not None else CollectorRegistry()
        # Labelled by member, so the workers of one server (one metrics directory) stay
        # apart; each sees the same set, so the largest live view is the server's.
        self._members = Gauge("llog_membership_members",
                              "Live broker members in this member's view", ["member"],
                              registry=r, multiprocess_mode="livemax")
        self._changes = Counter(
            "llog_membership_changes",
            "Membership changes seen by this member: members that joined or left its view, "
            "members it suspected, its own record put again, its id used by another process",
            ["member", "kind"], registry=r)
        self.members = self._members.labels(member_id)
        self.changes = {kind: self._changes.labels(member_id, kind) for kind in CHANGE_KINDS}
