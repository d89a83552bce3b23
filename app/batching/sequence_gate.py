"""Which producer sequences a batcher has taken, so that a request read before the one
holding the group ahead of its own waits a moment for it instead of being refused.

A producer keeps up to five batches of a partition in flight, on as many connections,
and the broker may finish reading a later request before an earlier one (bodies of MiBs
are read in turns, a small one ends first). The later request's group then reaches a
flush ahead of the group before it: its commit finds a gap and refuses it
(``OutOfOrderSequence``; ``UnknownProducer`` for a new producer's first groups), and
every group of the producer behind it in flight, waiting for that commit
(app/storage/sequence_turns.py), is refused the same way. Each is sent again: one
request read out of order costs the producer and the broker about five batches sent
twice, and their records the latency.

Flushes keep a producer's order once its groups are in them; this keeps it on the way
in. A request waits when one of its producers' first group in it is past the next one
expected on its partition by fewer than the groups a producer keeps in flight
(:data:`~app.storage.producer_state.PRODUCER_BATCHES`), where that producer's last group
there was taken within :data:`RECENT_S` (a producer not seen on the partition: when its
group is one of its first). It waits until the group before it is taken: at most
:data:`HOLD_S`, ending a batch window and a flush's usual time before its commit
deadline (the batcher gives that as ``until``). A producer whose whole hold ran out (its
groups go to other brokers or workers too) is not held again for :data:`QUIET_S`, so a
producer spread over many processes pays one wait now and then, not one per request.

Only the batcher that commits holds, and only a producer's own requests: a forwarding
broker's lanes do not (they see part of the requests), nor do forwarded frames (a frame
mixes many producers' groups, and one of them waiting would hold every other; frames of
several brokers could each wait for the other). A request held delays only itself: it is
outside the batch while it waits. Held or not, every group is judged by its commit
exactly as before: the gate saves resends and promises nothing.

Bounded: :data:`CAPACITY` (partition, producer) pairs remembered, the least recently
taken forgotten first (a request waiting on one is let go); a request waits only while
the buffer has room for it, each :data:`HOLD_S` at most, and one event per pair waited
on.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import anyio

from app.storage.appends import AppendGroup
from app.storage.keys import TopicPartition
from app.storage.producer_state import PRODUCER_BATCHES

# How long a request waits for the group before one of its own. A request read out of
# order is read within milliseconds of the one before it; this is several times that.
HOLD_S = 0.05
# A pair whose last group was taken longer ago than this is not waited for: the group
# before has likely gone another way (a reconnect, a failover).
RECENT_S = 2.0
# After a producer's wait ran out: no wait for its groups for this long.
QUIET_S = 10.0
CAPACITY = 65_536

_Key = tuple[TopicPartition, str]  # partition, producer id


class SequenceGate:
    """See the module. ``held`` is called once per request that waited, with whether
    every group it waited for came."""

    def __init__(self, *, hold_s: float = HOLD_S, recent_s: float = RECENT_S,
                 quiet_s: float = QUIET_S, capacity: int = CAPACITY,
                 clock: Callable[[], float] = time.monotonic,
                 held: Callable[[bool], None] | None = None) -> None:
        self._hold_s, self._recent_s, self._quiet_s = hold_s, recent_s, quiet_s
        self._capacity = capacity
        self._clock = clock
        self._held = held
        # Each pair's next sequence expected and when its last group was taken, least
        # recently taken first; producers not held until a time (their wait ran out).
        self._next: OrderedDict[_Key, tuple[int, float]] = OrderedDict()
        # In the order set, which is the order they end (QUIET_S is one for all).
        self._quiet: OrderedDict[str, float] = OrderedDict()
        # A pair's event, while a request waits on it: set when the pair moves on.
        self._moved: dict[_Key, anyio.Event] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._next)

    def ahead(self, groups: Sequence[AppendGroup]) -> list[tuple[_Key, int, bool]]:
        """The (pair, sequence, whether the pair is known) of each producer's first
        group in ``groups`` worth waiting for the group before (see the module)."""
        first: dict[_Key, int] = {}
        for g in groups:
            p = g.producer
            if p is not None and p.sequence > 0:
                key = (g.tp, p.producer_id)
                if p.sequence < first.get(key, p.sequence + 1):
                    first[key] = p.sequence
        if not first or self._closed:
            return []
        now = self._clock()
        out = []
        for key, sequence in first.items():
            seen = self._next.get(key)
            if seen is None:
                expected, recent = 0, True  # one of a new producer's first groups?
            else:
                expected, recent = seen[0], now - seen[1] <= self._recent_s
            if not (recent and expected < sequence < expected + PRODUCER_BATCHES):
                continue
            quiet_until = self._quiet.get(key[1])
            if quiet_until is not None:
                if quiet_until > now:
                    continue
                del self._quiet[key[1]]
            out.append((key, sequence, seen is not None))
        return out

    def _waits(self, key: _Key, sequence: int, known: bool) -> bool:
        """Whether the group before ``sequence`` is still to be taken (a known pair
        forgotten meanwhile is not waited for any more)."""
        seen = self._next.get(key)
        if seen is None:
            return not known and not self._closed
        return seen[0] < sequence and not self._closed

    async def wait(self, groups: Sequence[AppendGroup], until: float | None = None) -> None:
        """Until each of :meth:`ahead`'s groups has the group before it taken, at most
        :data:`HOLD_S`, or until ``until`` (a ``time.monotonic()`` time) if sooner, or the
        gate closes."""
        behind = self.ahead(groups)
        if behind:
            await self.hold(behind, until)

    async def hold(self, behind: list[tuple[_Key, int, bool]], until: float | None) -> None:
        """:meth:`wait` for groups :meth:`ahead` found (a caller that has them need not
        look twice, nor make a coroutine for a request that does not wait)."""
        limit = self._hold_s
        if until is not None:
            limit = min(limit, until - self._clock())
            if limit <= 0:
                return
        with anyio.move_on_after(limit):
            for key, sequence, known in behind:
                while self._waits(key, sequence, known):
                    event = self._moved.get(key)
                    if event is None:
                        event = self._moved[key] = anyio.Event()
                    try:
                        await event.wait()
                    finally:  # nobody left waiting on it: drop it (bounded)
                        if (not event.is_set() and self._moved.get(key) is event
                                and not event.statistics().tasks_waiting):
                            del self._moved[key]
        if self._closed:
            return  # the batcher refuses the request: no hold to count
        missing = [key for key, sequence, known in behind
                   if self._waits(key, sequence, known)]
        if missing and limit >= self._hold_s:  # the whole hold ran out, not a deadline
            quiet_until = self._clock() + self._quiet_s
            for key in missing:
                self._quiet[key[1]] = quiet_until
                self._quiet.move_to_end(key[1])
        if self._held is not None:
            self._held(not missing)

    def took(self, groups: Sequence[AppendGroup]) -> None:
        """``groups`` are in the batch now (call in the same step that adds them)."""
        now = self._clock()
        for g in groups:
            p = g.producer
            if p is None:
                continue
            key = (g.tp, p.producer_id)
            seen = self._next.get(key)
            if seen is None or p.sequence >= seen[0]:
                self._next[key] = (p.sequence + 1, now)
                event = self._moved.pop(key, None)
                if event is not None:
                    event.set()
            else:
                self._next[key] = (seen[0], now)
            self._next.move_to_end(key)
        while len(self._next) > self._capacity:
            forgotten, _ = self._next.popitem(last=False)
            event = self._moved.pop(forgotten, None)
            if event is not None:
                event.set()  # its waiters wait no more for a pair forgotten
        # Quiet producers end in the order set: the ended ones are first.
        while self._quiet and (len(self._quiet) > self._capacity
                               or next(iter(self._quiet.values())) <= now):
            self._quiet.popitem(last=False)

    def close(self) -> None:
        """No more waits: a batcher closing or failed answers its requests at once."""
        self._closed = True
        for event in self._moved.values():
            event.set()
        self._moved.clear()
