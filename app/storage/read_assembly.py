"""A read's answer: records from each plan's offset within its request's budgets and
the call's total budget, in request order, as runs of the fetched bodies. The first
record of the whole answer is returned even if it alone exceeds the budget, so a reader
is never stuck."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.errors import LlogError
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.read_plan import UNLIMITED, ReadPlan
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
    """Each plan's answer (or its error), sharing ``max_bytes`` in request order."""
    remaining = [max_bytes if max_bytes is not None else UNLIMITED]
    out: list[ReadOutcome] = []
    for plan in plans:
        if isinstance(plan, LlogError):
            out.append(plan)
            continue
        try:
            out.append(assemble(plan, remaining, first_of_answer=oversized_first and not any(
                isinstance(o, ReadResult) and o.records for o in out)))
        except LlogError as exc:
            out.append(exc)
    return out


def assemble(plan: ReadPlan, remaining: list[int], *, first_of_answer: bool) -> ReadResult:
    """Records from the plan's offset within the request's budgets and ``remaining``
    (the call's total budget left, shared across plans), as runs of the fetched bodies."""
    request = plan.request
    taken: list[Run] = []
    size, count, nxt = 0, 0, plan.offset
    budget = min(request.max_bytes or UNLIMITED, remaining[0])
    for unit in plan.units:
        if unit.error is not None:
            if taken:
                break  # serve what precedes it; the next read reports the error
            raise unit.error
        assert unit.records is not None
        if unit.first_offset > nxt:
            break  # a hole after what we have: the next read reports it
        at = unit.first_offset
        spent = False
        for piece in pieces_of(unit.records):  # the chunks of a compacted blob
            if at + len(piece) > nxt:
                run, used = take(piece, nxt - at, nxt, unit.span.entry.created_at_ms,
                                 budget=budget - size,
                                 max_records=None if request.max_records is None
                                 else request.max_records - count,
                                 may_exceed=first_of_answer and count == 0)
                taken.append(run)
                size, count, nxt = size + used, count + len(run), nxt + len(run)
                spent = run.stop < len(piece)
                if spent:
                    break
            at += len(piece)
        if spent:
            break  # a budget is spent
    remaining[0] -= size
    records = RunRecords(taken, size)
    return ReadResult(request.tp, records, plan.high_watermark, nxt, records.times(),
                      plan.log_start, plan.looked_up_ahead)
