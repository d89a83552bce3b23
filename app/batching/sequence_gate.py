"""Which producer sequences a batcher has taken, so that a request read before the one
holding the group ahead of its own waits a moment for it instead of being refused.

A producer keeps up to five batches of a partition in flight, on as many connections,
and the broker may finish reading a later request before an earlier one (bodies of MiBs
are read in turns, a small one ends first). The later request's group then reaches a
flush ahead of the group before it: its commit finds a gap and refuses it
(``OutOfOrderSequence``), and every group of the producer behind it in flight, waiting
for that commit (app/storage/sequence_turns.py), is refused the same way. Each is sent
again: one request read out of order costs the producer and the broker about five
batches sent twice, and the records their latency.

Flushes keep a producer's order once its groups are in them; this keeps it on the way
in. A group whose producer this batcher has taken on its partition recently, with a
sequence past the next one expected, waits until the group before it is taken: at most
:data:`HOLD_S`, and never past its deadlines. A producer whose wait ran out on a
partition (its groups go to other brokers or workers too) is not held there again for
:data:`QUIET_S`, so a producer spread over many processes pays one wait per partition
now and then, not one per request. Held or not, every group is judged by its commit
exactly as before: the gate saves resends and promises nothing.

Bounded: :data:`CAPACITY` (partition, producer) pairs remembered, the least recently
used forgotten first (a forgotten pair is never held); waiters are requests the batcher
would buffer anyway.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import anyio

from app.storage.appends import AppendGroup
from app.storage.keys import TopicPartition

# How long a group waits for the one before it. A request read out of order is read
# within milliseconds of the one before it; this is several times that.
HOLD_S = 0.05
# After a wait ran out for a (partition, producer): no wait there for this long.
QUIET_S = 10.0
CAPACITY = 65_536

_Key = tuple[TopicPartition, str]  # partition, producer id


class SequenceGate:
    """See the module. ``held`` is called once per request that waited, with whether
    the groups before it came in time."""

    def __init__(self, *, hold_s: float = HOLD_S, quiet_s: float = QUIET_S,
                 capacity: int = CAPACITY,
                 clock: Callable[[], float] = time.monotonic,
                 held: Callable[[bool], None] | None = None) -> None:
        self._hold_s, self._quiet_s, self._capacity = hold_s, quiet_s, capacity
        self._clock = clock
        self._held = held
        # The next sequence expected of each (partition, producer), least recently
        # taken first, and until when a pair is not held (its last wait ran out).
        self._next: OrderedDict[_Key, int] = OrderedDict()
        self._quiet: dict[_Key, float] = {}
        self._moved: anyio.Event | None = None  # set when a group is taken, if awaited

    def __len__(self) -> int:
        return len(self._next)

    def ahead(self, groups: Sequence[AppendGroup]) -> list[tuple[_Key, int]]:
        """The (pair, sequence) of each producer's first group in ``groups`` whose
        predecessor this gate has not seen taken yet, on a pair it holds."""
        first: dict[_Key, int] = {}
        for g in groups:
            p = g.producer
            if p is not None and p.sequence > 0:
                key = (g.tp, p.producer_id)
                if p.sequence < first.get(key, p.sequence + 1):
                    first[key] = p.sequence
        if not first:
            return []
        now = self._clock()
        out = []
        for key, sequence in first.items():
            expected = self._next.get(key)
            if expected is None or expected >= sequence:
                continue
            quiet_until = self._quiet.get(key)
            if quiet_until is not None:
                if quiet_until > now:
                    continue
                del self._quiet[key]
            out.append((key, sequence))
        return out

    async def wait(self, groups: Sequence[AppendGroup], until: float | None = None) -> None:
        """Until each producer's first group in ``groups`` has its predecessor taken, or
        :data:`HOLD_S` (or ``until``, a ``time.monotonic()`` time, if sooner) has passed."""
        behind = self.ahead(groups)
        if not behind:
            return
        limit = self._hold_s if until is None else min(self._hold_s, until - self._clock())
        in_time = False
        with anyio.move_on_after(max(0.0, limit)):
            for key, sequence in behind:
                # A pair forgotten meanwhile (capacity) stops the wait: nothing to expect.
                while self._next.get(key, sequence) < sequence:
                    if self._moved is None:
                        self._moved = anyio.Event()
                    await self._moved.wait()
            in_time = True
        if not in_time:
            quiet_until = self._clock() + self._quiet_s
            for key, sequence in behind:
                if self._next.get(key, sequence) < sequence:
                    self._quiet[key] = quiet_until
        if self._held is not None:
            self._held(in_time)

    def took(self, groups: Sequence[AppendGroup]) -> None:
        """``groups`` are in the batch now (call in the same step that adds them)."""
        for g in groups:
            p = g.producer
            if p is None:
                continue
            key = (g.tp, p.producer_id)
            expected = self._next.get(key)
            if expected is None or p.sequence >= expected:
                self._next[key] = p.sequence + 1
            self._next.move_to_end(key)
        while len(self._next) > self._capacity:
            forgotten, _ = self._next.popitem(last=False)
            self._quiet.pop(forgotten, None)  # so at most as many quiet as remembered
        if self._moved is not None:
            self._moved.set()
            self._moved = None
