"""Rendezvous (highest-random-weight) hashing: who ranks first for a partition.

Each candidate is scored with ``sha256("{seed}|{topic}|{partition}|{member}")`` and the
candidates are ranked by score, highest first (ties broken by id). The ranking of a
partition depends only on those values, so every process that knows the same candidates
computes the same ranking without talking to the others, and a candidate that comes or
goes changes only the partitions it ranks first on (docs/protocol.md, Preferred
appenders, has test vectors for other implementations).

The load generator's owner sets (app/loadtest/routing.py) and the brokers' preferred
appenders (app/cluster/membership.py) are both computed here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

ALGORITHM = "rendezvous-sha256"


def score(seed: int, topic: str, partition: int, broker_id: str) -> int:
    """The first 8 bytes of the candidate's sha256, as a big-endian integer."""
    digest = hashlib.sha256(f"{seed}|{topic}|{partition}|{broker_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def owner_set(seed: int, topic: str, partition: int, brokers: Iterable[str], size: int
              ) -> list[str]:
    """The ``size`` highest-scoring brokers, best first (ties broken by id)."""
    ranked = sorted(brokers, key=lambda b: (-score(seed, topic, partition, b), b))
    return ranked[:size]
