"""A broker worker as a member of the cluster, and a view of the live members.

A :class:`BrokerMember` is what a worker announces in its Oxia record (docs/protocol.md,
MEMBER). A :class:`MemberView` is one process's picture of the live set: frozen, so
every caller that holds it ranks partitions the same way, and cheap to ask again (the
preferred appender of a partition is remembered per view).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from app.cluster.rendezvous import owner_set
from app.errors import InvalidRequest
from app.storage.keys import TopicPartition, validate_member_id

RECORD_VERSION = 1
SEED = 0
WRITE_ROLE = "write"
# Partitions whose preferred appender one view remembers (each costs a sha256 per
# candidate to rank again).
PREFERRED_CACHE_SIZE = 65_536


@dataclass(frozen=True)
class BrokerMember:
    member_id: str
    broker_id: str
    url: str
    forward: str  # "host:port" of its forward listener, "" if none
    roles: tuple[str, ...]
    incarnation: str

    def __post_init__(self) -> None:
        validate_member_id(self.member_id)

    @property
    def appends(self) -> bool:
        """A candidate preferred appender: it writes and others can forward to it."""
        return WRITE_ROLE in self.roles and bool(self.forward)

    def to_record(self, *, pid: int | None = None, started_at_ms: int | None = None
                  ) -> bytes:
        """The Oxia record's value (docs/protocol.md, MEMBER)."""
        return json.dumps({
            "v": RECORD_VERSION, "member_id": self.member_id, "broker_id": self.broker_id,
            "pid": os.getpid() if pid is None else pid,
            "incarnation": self.incarnation, "url": self.url, "forward": self.forward,
            "roles": list(self.roles),
            "started_at_ms": int(time.time() * 1000) if started_at_ms is None
            else started_at_ms,
        }, separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, value: bytes) -> BrokerMember:
        """Raises ValueError for a record this version cannot read."""
        try:
            data: Any = json.loads(value)
            if not isinstance(data, dict) or data.get("v") != RECORD_VERSION:
                raise ValueError(f"not a version {RECORD_VERSION} member record")
            roles = data["roles"]
            if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
                raise ValueError("roles: expected a list of strings")
            fields = {name: data[name] for name in
                      ("member_id", "broker_id", "url", "forward", "incarnation")}
            if not all(isinstance(v, str) for v in fields.values()):
                raise ValueError("expected string fields")
            return cls(roles=tuple(roles), **fields)
        except (KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a member record: {exc!r}") from None
        except InvalidRequest as exc:  # an id that is no member id
            raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class MemberView:
    """The live members (sorted by id) and the ones this process suspects to be down."""

    members: tuple[BrokerMember, ...] = ()
    suspects: frozenset[str] = frozenset()
    digest: str = field(init=False)
    _writers: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _by_id: dict[str, BrokerMember] = field(init=False, repr=False, compare=False)
    # Used on the event loop only, so without a lock.
    _preferred: OrderedDict[TopicPartition, BrokerMember | None] = field(
        init=False, repr=False, compare=False, default_factory=OrderedDict)

    def __post_init__(self) -> None:
        members = tuple(sorted(self.members, key=lambda m: m.member_id))
        set_ = object.__setattr__
        set_(self, "members", members)
        ids = [m.member_id for m in members]
        # The clients' cue to fetch the map again: the ids only (suspects are local).
        set_(self, "digest", hashlib.sha256("\n".join(ids).encode()).hexdigest()[:12])
        set_(self, "_by_id", {m.member_id: m for m in members})
        set_(self, "_writers", tuple(m.member_id for m in members
                                     if m.appends and m.member_id not in self.suspects))

    def member(self, member_id: str) -> BrokerMember | None:
        return self._by_id.get(member_id)

    @property
    def writer_count(self) -> int:
        """Members that partitions are preferred for: those that write and are trusted."""
        return len(self._writers)

    def ids(self) -> list[str]:
        return [m.member_id for m in self.members]

    def preferred(self, tp: TopicPartition, *, remember: bool = True) -> BrokerMember | None:
        """The partition's preferred appender: rendezvous over the members that write,
        have a forward listener and are not suspected; None when there is none.
        ``remember=False`` (a page of the console, from a worker thread) never touches
        the cache the produce path routes by, which only the event loop may."""
        if not remember:
            return self._first_writer(tp)
        if tp in self._preferred:
            self._preferred.move_to_end(tp)
            return self._preferred[tp]
        found = self._first_writer(tp)
        self._preferred[tp] = found
        if len(self._preferred) > PREFERRED_CACHE_SIZE:
            self._preferred.popitem(last=False)
        return found

    def _first_writer(self, tp: TopicPartition) -> BrokerMember | None:
        # Reads only what never changes once the view is made: safe from any thread.
        if not self._writers:
            return None
        (first,) = owner_set(SEED, tp.topic, tp.partition, self._writers, 1)
        return self._by_id[first]
