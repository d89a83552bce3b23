"""Which of a writer's flushes under way hold which producer's groups, so that a later
flush commits a partition after an earlier one that holds the group before its own.

Two flushes of one writer upload at once, and the later one's upload may end first: its
commit would find its producer's group before the one in the earlier flush not yet
committed and refuse it (``OutOfOrderSequence``), and the producer would send it again
for nothing. Its commit of that partition waits for the earlier flush's commit of the
partition instead: only for an earlier flush (flushes are numbered as they begin), so no
two flushes ever wait for each other; until that partition's commit is over (the writer
releases a partition's groups as soon as its commit settles them, every round of it), so
the wait is no longer than the earlier commit would have held the partition's lock; and
never past the waiting groups' own deadline (the writer bounds it), after which their
commit answers them as late, exactly as without the wait.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import anyio

from app.storage.appends import AppendGroup, ProducerSeq
from app.storage.keys import TopicPartition

_Key = tuple[TopicPartition, str, int]  # partition, producer id, sequence


@dataclass
class Flush:
    """One ``append_shared`` under way: its number and the groups it registered, by
    partition."""

    number: int
    keys: dict[TopicPartition, list[_Key]] = field(default_factory=dict)


class SequenceTurns:
    """See the module."""

    def __init__(self) -> None:
        self._numbers = itertools.count(1)
        self._held: dict[_Key, tuple[int, anyio.Event]] = {}

    def begin(self, groups: Sequence[AppendGroup]) -> Flush:
        """Register ``groups``' producer sequences (a group another flush holds already,
        a resend, stays that flush's)."""
        flush = Flush(next(self._numbers))
        for g in groups:
            if g.producer is None:
                continue
            key = (g.tp, g.producer.producer_id, g.producer.sequence)
            if key not in self._held:
                self._held[key] = (flush.number, anyio.Event())
                flush.keys.setdefault(g.tp, []).append(key)
        return flush

    def release(self, flush: Flush, tp: TopicPartition) -> None:
        """``flush``'s commit of ``tp`` is over: whoever waits for its groups there goes
        on."""
        for key in flush.keys.pop(tp, ()):
            held = self._held.pop(key, None)
            if held is not None:
                held[1].set()

    def end(self, flush: Flush) -> None:
        """``flush`` is over (whatever became of it): every group it holds is released."""
        for tp in list(flush.keys):
            self.release(flush, tp)

    async def wait(self, number: int, tp: TopicPartition,
                   producers: Iterable[ProducerSeq]) -> None:
        """Until no earlier flush than ``number`` holds the group before one of
        ``producers``' on ``tp``."""
        for p in producers:
            if p.sequence == 0:
                continue
            held = self._held.get((tp, p.producer_id, p.sequence - 1))
            if held is not None and held[0] < number:
                await held[1].wait()

    def __len__(self) -> int:
        return len(self._held)
