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


@dataclass
class Routes:
    """One client's copy of the members' map and which of their URLs failed lately."""

    clock: Callable[[], float] = time.monotonic
    urls: dict[str, str] = field(default_factory=dict)  # member id -> URL, writers only
    digest: str | None = None
    fetched_at: float | None = None
    down_until: dict[str, float] = field(default_factory=dict)
    _ids: list[str] = field(default_factory=list)

    def stale(self) -> bool:
        return self.fetched_at is None or self.clock() - self.fetched_at >= MAX_AGE_S

    def update(self, body: Any) -> None:
        """Take a ``GET /cluster`` answer; anything else leaves an empty map (the client
        then sends as it would without routing) until the next fetch."""
        self.fetched_at = self.clock()
        self.urls, self.digest = {}, None
        if isinstance(body, Mapping) and body.get("algorithm") == ALGORITHM:
            self.digest = str(body.get("digest"))
            for member in body.get("members") or ():
                if (isinstance(member, Mapping) and WRITE_ROLE in (member.get("roles") or ())
                        and isinstance(member.get("url"), str)):
                    self.urls[str(member["member_id"])] = member["url"].rstrip("/")
        self._ids = sorted(self.urls)

    def noticed(self, digest: str | None) -> None:
        """A digest an answer carried: another set of members, so fetch the map again."""
        if digest is not None and self.digest is not None and digest != self.digest:
            self.fetched_at = None

    def url_for(self, topic: str, partition: int) -> str | None:
        """The preferred broker's URL, unless it failed within :data:`DOWN_S`."""
        member = preferred(topic, partition, self._ids)
        if member is None:
            return None
        url = self.urls[member]
        until = self.down_until.get(url)
        if until is not None and self.clock() < until:
            return None
        return url

    def failed(self, url: str) -> None:
        self.down_until[url] = self.clock() + DOWN_S
        self.fetched_at = None  # the member may have gone: ask for the map again
