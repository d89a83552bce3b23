"""The producers' sequences kept inside ``meta/control`` (pure functions).

The control record's ``producers`` field maps each producer recently appending to the
partition to its last committed sequence number and where its last few groups were
committed: ``{producer_id: [last_sequence, [[start, end, data_key], ...]]}``, the ranges
of sequences ``last_sequence - len + 1 .. last_sequence``, oldest first, and the
producers least recently committed first. The same CAS that commits an append updates
it, so "committed" and "remembered" never disagree (docs/protocol.md, Idempotent
producers).

Unlike the idempotency window, which forgets a key once 64 other keyed groups were
committed, a producer is forgotten only once :data:`PRODUCER_WINDOW` other producers
have committed since its last group: a busy producer never pushes out its own resends,
and the number of producers, not of appends, bounds what a resend may meet.
``producers_evicted`` counts the producers forgotten so far, so that a commit which did
not find its producer can tell whether it may have been forgotten since it last looked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.errors import (
    CommitInDoubt,
    DuplicateSequence,
    LlogError,
    OutOfOrderSequence,
    UnknownProducer,
)
from app.storage.appends import ProducerSeq
from app.storage.idempotency import Remembered
from app.storage.keys import TopicPartition
from app.storage.metadata import Control

PRODUCERS_FIELD = "producers"
EVICTED_FIELD = "producers_evicted"
PRODUCER_WINDOW = 64  # producers remembered per partition
PRODUCER_BATCHES = 5  # groups remembered per producer: resends of that many in flight (Kafka: 5)


@dataclass
class _Producer:
    last: int
    ranges: list[Remembered]

    def first(self) -> int:
        return self.last - len(self.ranges) + 1


def _read(control: Control, producer_id: str) -> _Producer | None:
    table = control.extra.get(PRODUCERS_FIELD)
    if not isinstance(table, dict):
        return None
    entry = table.get(producer_id)
    if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], int):
        return None
    ranges = []
    for r in entry[1] if isinstance(entry[1], list) else ():
        if (not isinstance(r, list) or len(r) != 3 or not isinstance(r[0], int)
                or not isinstance(r[1], int)):
            return None  # unreadable: treated as unknown, which never writes a gap
        ranges.append(Remembered(r[0], r[1], str(r[2])))
    return _Producer(entry[0], ranges)


def evictions(control: Control) -> int:
    """How many producers the partition has forgotten, ever."""
    value = control.extra.get(EVICTED_FIELD)
    return value if isinstance(value, int) else 0


class SequenceCheck:
    """One read of the control record, judging a commit's sequenced groups in order:
    each group accepted moves its producer on for the groups after it, as the commit
    would (``accept``)."""

    def __init__(self, control: Control, tp: TopicPartition,
                 evictions_before: int | None) -> None:
        self._control = control
        self._tp = tp
        self._evictions_before = evictions_before
        self._accepted: dict[str, int] = {}

    def judge(self, seq: ProducerSeq) -> Remembered | LlogError | None:
        """None: the next group of its producer, to append. A :class:`Remembered`: a
        repeat of a group committed before. An error: not to append (nothing written by
        this group; :class:`CommitInDoubt` when a copy may have been)."""
        pid, n = seq.producer_id, seq.sequence
        state = _read(self._control, pid)
        if state is not None and state.first() <= n <= state.last:
            return state.ranges[n - state.first()]  # committed, whatever came before it here
        last = self._accepted.get(pid)
        if last is not None:
            return None if n == last + 1 else OutOfOrderSequence(
                f"{self._tp}: producer {pid!r} sent sequence {n} after {last} in one append")
        if state is None:
            forgotten = (self._evictions_before is not None
                         and evictions(self._control) > self._evictions_before)
            if forgotten:
                return CommitInDoubt(
                    f"{self._tp}: producer {pid!r} is not remembered and other producers "
                    "were forgotten since this commit last looked: a copy of sequence "
                    f"{n} may have been committed and forgotten; not appended here")
            if n == 0:
                return None
            return UnknownProducer(
                f"{self._tp}: producer {pid!r} is not remembered (its sequence starts "
                f"at 0; {PRODUCER_WINDOW} other producers may have appended since its "
                f"last group); sequence {n} not appended")
        if n == state.last + 1:
            return None
        if n > state.last:
            return OutOfOrderSequence(
                f"{self._tp}: producer {pid!r} sent sequence {n}, the next is "
                f"{state.last + 1}; not appended (send the earlier groups first)")
        return DuplicateSequence(
            f"{self._tp}: producer {pid!r}'s sequence {n} was committed before (the "
            f"last is {state.last}), where is no longer remembered; not appended again")

    def accept(self, seq: ProducerSeq) -> None:
        self._accepted[seq.producer_id] = seq.sequence


def remember(control: Control, entries: Iterable[tuple[ProducerSeq, Remembered]]
             ) -> tuple[dict[str, list[object]], int]:
    """The producers' table and eviction count after committing ``entries`` (each the
    next of its producer, in order)."""
    table = control.extra.get(PRODUCERS_FIELD)
    out: dict[str, list[object]] = dict(table) if isinstance(table, dict) else {}
    evicted = evictions(control)
    for seq, where in entries:
        previous = out.pop(seq.producer_id, None)
        ranges: list[object] = []
        if (previous is not None and isinstance(previous, list) and len(previous) == 2
                and previous[0] == seq.sequence - 1 and isinstance(previous[1], list)):
            ranges = list(previous[1])
        ranges.append([where.start, where.end, where.data_key])
        out[seq.producer_id] = [seq.sequence, ranges[-PRODUCER_BATCHES:]]
    while len(out) > PRODUCER_WINDOW:
        del out[next(iter(out))]
        evicted += 1
    return out, evicted
