"""Sending a partition's records to the broker that appends them (``route="preferred"``).

With affinity on, brokers rank the members that write for each partition and the first
appends its records; any other broker forwards them there, a second hop (docs/operations.md,
Affinity). ``GET /cluster`` publishes the members and the ranking's algorithm, so a client
can rank them itself and send each request straight to its partition's preferred broker.

The map is a hint, never needed for correctness: a request goes through the client's own
broker list when the map is empty (affinity off), does not name the request's partition,
or its broker did not answer lately. Produce answers carry the members' digest
(``llog-cluster-digest``); a digest other than the map's, or the map's age, makes the
client fetch it again before its next routed request.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

ALGORITHM = "rendezvous-sha256"
SEED = 0
WRITE_ROLE = "write"
DIGEST_HEADER = "llog-cluster-digest"
# How long a map is used before it is fetched again without a cue.
MAX_AGE_S = 30.0
# How long a broker that did not answer is passed over.
DOWN_S = 5.0


def score(seed: int, topic: str, partition: int, member_id: str) -> int:
    """The first 8 bytes of ``sha256("{seed}|{topic}|{partition}|{member_id}")``."""
    digest = hashlib.sha256(f"{seed}|{topic}|{partition}|{member_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def preferred(topic: str, partition: int, member_ids: list[str]) -> str | None:
    """The first of the ranking (highest score, ties to the smaller id)."""
    if not member_ids:
        return None
    return min(member_ids, key=lambda m: (-score(SEED, topic, partition, m), m))


@dataclass(frozen=True)
class ClusterMap:
    """One ``GET /cluster`` answer: the URLs of the members that write, their ids in
    order, and the members' digest. Frozen, and replaced whole: a thread that ranks with
    one map looks its URL up in the same map."""

    urls: Mapping[str, str] = field(default_factory=dict)
    ids: tuple[str, ...] = ()
    digest: str | None = None

    @classmethod
    def parse(cls, body: Any) -> ClusterMap:
        """The writers of an answer; an empty map for anything else (another algorithm,
        no members, not the shape of the contract)."""
        if not isinstance(body, Mapping) or body.get("algorithm") != ALGORITHM:
            return cls()
        members = body.get("members")
        urls: dict[str, str] = {}
        for member in members if isinstance(members, list) else ():
            if not isinstance(member, Mapping):
                continue
            member_id, url, roles = member.get("member_id"), member.get("url"), member.get(
                "roles")
            if (isinstance(member_id, str) and isinstance(url, str)
                    and isinstance(roles, list) and WRITE_ROLE in roles):
                urls[member_id] = url.rstrip("/")
        digest = body.get("digest")
        return cls(urls, tuple(sorted(urls)), digest if isinstance(digest, str) else None)


@dataclass
class Routes:
    """One client's members' map, when to fetch it next, and which brokers failed lately.
    Shared by the threads of a sync client: each field is replaced by one assignment."""

    clock: Callable[[], float] = time.monotonic
    map: ClusterMap = field(default_factory=ClusterMap)
    due: float = -math.inf  # when to fetch the map again
    down_until: dict[str, float] = field(default_factory=dict)

    def stale(self) -> bool:
        return self.clock() >= self.due

    def update(self, body: Any) -> None:
        """Take an answer of ``GET /cluster`` (its JSON body; None when it had none): an
        unusable one leaves an empty map, and the client sends as it would without
        routing until the map's age is up."""
        self.map = ClusterMap.parse(body)
        self.due = self.clock() + MAX_AGE_S

    def unreached(self) -> None:
        """``GET /cluster`` got no answer, or a server error: keep the map, ask again soon."""
        self.due = self.clock() + DOWN_S

    def noticed(self, digest: str | None) -> None:
        """A digest an answer carried: another set of members, so fetch the map again."""
        known = self.map.digest
        if digest is not None and known is not None and digest != known:
            self.due = -math.inf

    def url_for(self, topic: str, partition: int) -> str | None:
        """The preferred broker's URL, unless it failed within :data:`DOWN_S`."""
        current = self.map
        member = preferred(topic, partition, list(current.ids))
        if member is None:
            return None
        url = current.urls[member]
        until = self.down_until.get(url)
        if until is not None and self.clock() < until:
            return None
        return url

    def failed(self, url: str) -> None:
        """A routed request got no answer from ``url``: pass it over a while, and ask for
        the map again (its member may have gone)."""
        self.down_until[url] = self.clock() + DOWN_S
        self.due = -math.inf
