"""A read's answer: records from each plan's offset within its request's budgets and
the call's total budget, as runs of the fetched bodies. The total is spent unit by unit
in the order the plans were trimmed to it (app/storage/read_plan.py, :func:`merged`:
request order, except slices of shared WAL objects, object by object across
partitions), so a partition is never cut for the share of one that comes before it only
in request order. The first record of the whole answer is returned even if it alone
exceeds the budget, so a reader is never stuck."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.errors import LlogError
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.read_plan import UNLIMITED, ReadPlan, SpanFetch, merged
from app.storage.runs import Run, RunRecords, pieces_of, records_bytes, take


@dataclass
class ReadResult:
    tp: TopicPartition
    records: Sequence[tuple[int, Payload]]  # RunRecords, read from the log
    high_watermark: int
    next_offset: int
    # The broker's append time of each record, in step with ``records``.
    append_times: list[int] = field(default_factory=list)
    log_start: int = 1
    # Planned from a control record read *ahead* of the read (app/storage/plan_ahead.py),
    # possibly before its caller began: ``high_watermark`` may predate a change the
    # caller had already heard of when it called, so such an answer must not convince
    # the caller that it is up to date (app/broker/consume.py).
    looked_up_ahead: bool = False

    @property
    def size(self) -> int:
        return records_bytes(self.records)


ReadOutcome = ReadResult | LlogError


def assemble_all(plans: list[ReadPlan | LlogError], max_bytes: int | None,
                 oversized_first: bool) -> list[ReadOutcome]:
    """Each plan's answer (or its error), sharing ``max_bytes`` unit by unit in the
    order of :func:`merged`. ``oversized_first``: the answer's first record may exceed
    the budgets."""
    remaining = max_bytes if max_bytes is not None else UNLIMITED
    parts: list[_Answer | LlogError] = [
        _Answer(plan) if isinstance(plan, ReadPlan) else plan for plan in plans]
    first = oversized_first
    for i, unit in merged(plans):
        part = parts[i]
        if isinstance(part, LlogError) or part.done:
            continue
        try:
            remaining -= part.add(unit, remaining, may_exceed=first)
        except LlogError as exc:
            parts[i] = exc
            continue
        first = first and part.count == 0
    return [part if isinstance(part, LlogError) else part.result() for part in parts]


class _Answer:
    """One plan's records as its units are taken: within the request's budgets and what
    the call's total has left when each unit's turn comes."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self.taken: list[Run] = []
        self.size = 0
        self.count = 0
        self.nxt = plan.offset
        self.done = False  # a budget is spent, or the plan's records stop (hole, error)

    def add(self, unit: SpanFetch, remaining: int, *, may_exceed: bool) -> int:
        """Take the unit's records from the next offset wanted; the bytes taken."""
        request = self.plan.request
        if unit.error is not None:
            if self.taken:
                self.done = True  # serve what precedes it; the next read reports the error
                return 0
            raise unit.error
        assert unit.records is not None
        if unit.first_offset > self.nxt:
            self.done = True  # a hole after what we have: the next read reports it
            return 0
        budget = min((request.max_bytes or UNLIMITED) - self.size, remaining)
        at, used_here = unit.first_offset, 0
        for piece in pieces_of(unit.records):  # the chunks of a compacted blob
            if at + len(piece) > self.nxt:
                run, used = take(piece, self.nxt - at, self.nxt, unit.span.entry.created_at_ms,
                                 budget=budget - used_here,
                                 max_records=None if request.max_records is None
                                 else request.max_records - self.count,
                                 may_exceed=may_exceed and self.count == 0)
                self.taken.append(run)
                used_here += used
                self.size, self.count, self.nxt = \
                    self.size + used, self.count + len(run), self.nxt + len(run)
                if run.stop < len(piece):
                    self.done = True  # a budget is spent
                    break
            at += len(piece)
        return used_here

    def result(self) -> ReadResult:
        plan = self.plan
        records = RunRecords(self.taken, self.size)
        return ReadResult(plan.request.tp, records, plan.high_watermark, self.nxt,
                          records.times(), plan.log_start, plan.looked_up_ahead)
