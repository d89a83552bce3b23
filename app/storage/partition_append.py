"""What one partition gets from one ``append_shared``: its groups in order, the body
they are packed into, and how their outcomes are recorded (an idempotency key repeated
within the request is answered with the first group's outcome)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.errors import LlogError
from app.storage import codec
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.batch import partition_body
from app.storage.keys import TopicPartition


@dataclass(frozen=True)
class _Member:
    """One group of a partition's append; its records start at ``first`` in the body."""

    index: int
    group: AppendGroup
    first: int


@dataclass(frozen=True)
class _Echo:
    """A group repeating the idempotency key, or the producer sequence, of an earlier one
    (``original``, an index)."""

    original: int
    group: AppendGroup


@dataclass
class PartitionAppend:
    """Everything one partition gets from one ``append_shared``: its groups, in order,
    minus the ones repeating an idempotency key of an earlier group (``echoes``, by
    group index). ``uploads``: the upload rounds it counts against the writer's limit.

    ``detached``: echoes answered on their own (their deadline ended before their
    original's commit was sent), by group index. ``keys_absent_through``: the sequence
    counter through which a commit of these groups found none of their keys committed
    (None before any read), carried to the next upload round so that its commit knows
    from where on a key it does not find may have been forgotten; ``evictions_seen``:
    the partition's count of forgotten producers at that read, for the same question
    about a producer. ``flush``: the writer's flush it belongs to (its turn among the
    flushes under way, app/storage/sequence_turns.py)."""

    tp: TopicPartition
    members: list[_Member] = field(default_factory=list)
    echoes: dict[int, _Echo] = field(default_factory=dict)
    size: int = 0
    uploads: int = 1
    detached: dict[int, AppendOutcome] = field(default_factory=dict)
    keys_absent_through: int | None = None
    evictions_seen: int | None = None
    flush: int = 0  # the number of the writer's flush it belongs to (SequenceTurns)

    def add(self, index: int, group: AppendGroup) -> None:
        key = group.identity
        if key is not None:
            for m in self.members:
                if m.group.identity == key:
                    self.echoes[index] = _Echo(m.index, group)
                    return
        self.members.append(_Member(index, group, self.size))
        self.size += len(group.records)

    def holds(self, index: int) -> bool:
        """Whether the group at ``index`` is part of this append (a member or an echo)."""
        return index in self.echoes or any(m.index == index for m in self.members)

    def body(self, encoding: str) -> codec.SliceBody:
        parts, used, count = partition_body([m.group.records for m in self.members],
                                            encoding)
        # The newest view of the topic's setting among the groups (it may have changed
        # while they were buffered; each stored body says its own codec).
        compression = self.members[-1].group.compression
        return codec.SliceBody(self.tp.topic, self.tp.partition, parts, used, count,
                              compression)

    def resolve(self, outcomes: list[AppendOutcome | None],
                results: dict[int, AppendOutcome],
                again: PartitionAppend | None = None) -> None:
        """Record ``results`` (by group index) and answer the echoes of those groups,
        but those uploaded ``again`` (their own commit answers them)."""
        for index, outcome in {**self.detached, **results}.items():
            outcomes[index] = outcome
        for index, echo in self.echoes.items():
            if index in results or (again is not None and again.holds(index)):
                continue  # answered on its own, or by its own commit
            if echo.original in results:
                first = results[echo.original]
                outcomes[index] = (_as_duplicate(first) if isinstance(first, AppendResult)
                                   else first)

    def commit_by(self) -> list[float]:
        """The deadlines a commit of this append must keep: its members' and their
        echoes', since an echo is answered by its original's commit."""
        groups = [m.group for m in self.members] + [e.group for e in self.echoes.values()]
        return [g.commit_by for g in groups if g.commit_by is not None]

    def late(self, now: float, why: str) -> dict[int, AppendOutcome]:
        """The groups, echoes among them, whose ``commit_by`` is before ``now``, each
        answered as its deadline says."""
        groups = {m.index: m.group for m in self.members}
        groups.update({i: e.group for i, e in self.echoes.items()})
        return {i: g.expired_as(why) for i, g in groups.items()
                if g.commit_by is not None and g.commit_by < now}

    def detach(self, answers: dict[int, AppendOutcome]) -> None:
        """Answer the echoes in ``answers`` so, and no longer with their original."""
        for index, outcome in answers.items():
            del self.echoes[index]
            self.detached[index] = outcome

    def without(self, answered: dict[int, AppendOutcome], *, counted: bool = True
                ) -> PartitionAppend:
        """The groups not in ``answered`` (with their echoes), to be uploaded again: the
        answered ones turned out committed, or in doubt, which answers their echoes too.
        Another upload round, ``counted`` against the writer's limit unless it answers
        groups that cannot come back (in doubt: every keyed group at once)."""
        rest = PartitionAppend(self.tp, uploads=self.uploads + (1 if counted else 0),
                               keys_absent_through=self.keys_absent_through,
                               evictions_seen=self.evictions_seen, flush=self.flush)
        for m in self.members:
            if m.index not in answered:
                rest.add(m.index, m.group)
        rest.echoes.update({i: e for i, e in self.echoes.items()
                            if e.original not in answered})
        return rest

    def without_unwritten(self, dropped: dict[int, AppendOutcome]) -> PartitionAppend:
        """The groups not in ``dropped``, to be uploaded again, echoes of the dropped
        among them: those were answered with nothing written, which answers no repeat of
        their keys, so the first repeat of each takes its place. Counted as the same
        upload round: each such round answers a group, so they end by themselves."""
        rest = PartitionAppend(self.tp, uploads=self.uploads,
                               keys_absent_through=self.keys_absent_through,
                               evictions_seen=self.evictions_seen, flush=self.flush)
        groups = {m.index: m.group for m in self.members}
        groups.update({i: e.group for i, e in self.echoes.items()})
        indices = sorted(groups)
        for k in in_sequence_order([groups[i] for i in indices]):
            if indices[k] not in dropped:
                rest.add(indices[k], groups[indices[k]])
        return rest

    def fail(self, outcomes: list[AppendOutcome | None], error: LlogError) -> None:
        self.resolve(outcomes, {m.index: error for m in self.members})


def _as_duplicate(result: AppendResult) -> AppendResult:
    return AppendResult(result.tp, result.start_offset, result.end_offset, result.count,
                        result.index_key, result.wal_uri, duplicate=True)


def in_sequence_order(groups: Sequence[AppendGroup]) -> list[int]:
    """The order to append ``groups`` in (their indices): as given, but the groups of
    one producer to one partition, in the places they hold, in the order of their
    sequence. A producer with several requests in flight may have them read in another
    order than it sent them (other connections, other tasks); appended as read, the
    later one would be refused as out of order and sent again for nothing."""
    places: dict[tuple[TopicPartition, str], list[int]] = {}
    for i, g in enumerate(groups):
        if g.producer is not None:
            places.setdefault((g.tp, g.producer.producer_id), []).append(i)
    order = list(range(len(groups)))
    for indices in places.values():
        if len(indices) > 1:
            ranked = sorted(indices, key=lambda i: _sequence(groups[i]))
            for place, i in zip(indices, ranked, strict=True):
                order[place] = i
    return order


def _sequence(group: AppendGroup) -> int:
    assert group.producer is not None
    return group.producer.sequence
