"""The producer's sequences: each batch of a partition gets its place in the producer's
sequence for that partition, so the broker appends it once and in order however often it
is sent (docs/http-api.md, Idempotent producers). Free of I/O; called with the
producer's lock held.

The producer id is random per producer, with a suffix per partition that changes when
the partition's sequence breaks: a batch that fails for good leaves a gap the broker
would hold every later batch behind (its sequence may even still commit, if an attempt
of it is in doubt), so the partition goes on under a new id from 0. Batches the broker
places by key (no partition yet) carry idempotency keys instead.
"""

from __future__ import annotations

import uuid

from llog_client._accumulator import Batch

Place = tuple[str, int]  # topic, partition


class ProducerSequences:
    """See the module."""

    def __init__(self, base: str | None = None) -> None:
        self._base = base or uuid.uuid4().hex
        self._next: dict[Place, int] = {}  # the next sequence of each partition
        self._epochs: dict[Place, int] = {}  # how many times its sequence broke
        self._ids: dict[Place, str] = {}  # each partition's id now (made once per epoch)

    def producer_id(self, place: Place) -> str:
        found = self._ids.get(place)
        if found is None:
            found = self._ids[place] = f"{self._base}.{self._epochs.get(place, 0)}"
        return found

    def position(self, place: Place) -> tuple[str, int]:
        """The partition's producer id now and the sequence its next batch takes."""
        return self.producer_id(place), self._next.get(place, 0)

    def assign(self, batch: Batch) -> bool:
        """Give ``batch`` its place in its partition's sequence on its first attempt
        (kept for every retry); False for a batch placed by key."""
        if batch.producer_id:
            return True
        topic, partition, _ = batch.route
        if partition < 0:
            return False
        place = (topic, partition)
        batch.producer_id = self.producer_id(place)
        batch.sequence = self._next.get(place, 0)
        self._next[place] = batch.sequence + 1
        return True

    def broken(self, batch: Batch) -> bool:
        """``batch`` failed for good, or its partition forgot the producer: the
        partition's next batches start a new sequence. False when ``batch`` belongs to a
        sequence left already (nothing changes)."""
        place = (batch.topic, batch.partition)
        if not batch.producer_id or batch.producer_id != self.producer_id(place):
            return False
        self._epochs[place] = self._epochs.get(place, 0) + 1
        self._ids.pop(place, None)
        self._next[place] = 0
        return True

    def left(self, batch: Batch) -> bool:
        """Whether ``batch`` holds a place in a sequence its partition has left."""
        return bool(batch.producer_id) and batch.producer_id != self.producer_id(
            (batch.topic, batch.partition))
