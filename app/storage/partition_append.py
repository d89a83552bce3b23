"""What one partition gets from one ``append_shared``: its groups in order, the body
they are packed into, and how their outcomes are recorded (an idempotency key repeated
within the request is answered with the first group's outcome)."""

from __future__ import annotations

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


@dataclass
class PartitionAppend:
    """Everything one partition gets from one ``append_shared``: its groups, in order,
    minus the ones repeating an idempotency key of an earlier group (``echoes``: group
    index -> the index of the group it repeats)."""

    tp: TopicPartition
    members: list[_Member] = field(default_factory=list)
    echoes: dict[int, int] = field(default_factory=dict)
    size: int = 0

    def add(self, index: int, group: AppendGroup) -> None:
        key = group.idempotency_key
        if key is not None:
            for m in self.members:
                if m.group.idempotency_key == key:
                    self.echoes[index] = m.index
                    return
        self.members.append(_Member(index, group, self.size))
        self.size += len(group.records)

    def body(self, encoding: str) -> codec.SliceBody:
        parts, used, count = partition_body([m.group.records for m in self.members],
                                            encoding)
        # The newest view of the topic's setting among the groups (it may have changed
        # while they were buffered; each stored body says its own codec).
        compression = self.members[-1].group.compression
        return codec.SliceBody(self.tp.topic, self.tp.partition, parts, used, count,
                              compression)

    def resolve(self, outcomes: list[AppendOutcome | None],
                results: dict[int, AppendOutcome]) -> None:
        """Record ``results`` (by group index) and answer the echoes of those groups."""
        for index, outcome in results.items():
            outcomes[index] = outcome
        for index, original in self.echoes.items():
            if original in results:
                first = results[original]
                outcomes[index] = (_as_duplicate(first) if isinstance(first, AppendResult)
                                   else first)

    def without(self, answered: dict[int, AppendOutcome]) -> PartitionAppend:
        """The groups not in ``answered`` (with their echoes), to be uploaded again."""
        rest = PartitionAppend(self.tp)
        for m in self.members:
            if m.index not in answered:
                rest.add(m.index, m.group)
        rest.echoes.update({i: o for i, o in self.echoes.items() if o not in answered})
        return rest

    def fail(self, outcomes: list[AppendOutcome | None], error: LlogError) -> None:
        self.resolve(outcomes, {m.index: error for m in self.members})


def _as_duplicate(result: AppendResult) -> AppendResult:
    return AppendResult(result.tp, result.start_offset, result.end_offset, result.count,
                        result.index_key, result.wal_uri, duplicate=True)
