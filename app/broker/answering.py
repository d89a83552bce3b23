"""Consume answers held within the process's answer budget (app/broker/answer_budget.py).

Every look a consume request makes at the log (its first read, and each read after a
long-poll's wake-up) first reserves room for what it may read through the request's
:class:`AnswerHold`: ``max_bytes`` times what reading holds per byte, or what the
answer's encoding does (:attr:`AnswerHold.factor`), whichever is more. Once the look
returns, the request holds what it read (times that factor). So a long-poll that waits
holds only the records it already has (none, usually), not its ``max_bytes``: a
thousand idle long-polls cost the budget nothing, and a thousand woken at once read
within it, the rest waiting their turn or refused with 503.

The request passes its hold to :meth:`app.broker.consume.ConsumeService.consume`; a
read given none (a caller that answers no HTTP request) is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from app.broker.answer_budget import Reservation
from app.storage import runs
from app.storage.reader import ReadOutcome, ReadResult

# What a read holds per byte while it runs: an object-store body as it arrives and as
# it is joined (bench/catchup_memory.py measures the read path).
READ_FACTOR = 2.0
# What an answer holds per record byte once read, until it is sent: a binary answer's
# parts are views of the records; a JSON answer holds the records, their values as
# text (or base64: 4/3) and the encoded body beside them while it is built.
BINARY_FACTOR = 1.0
JSON_FACTOR = 4.0
# Beside the record bytes: each record's framing (offset, time, lengths; JSON's field
# names), and the answer's own (its partitions' fields), counted as bytes held.
RECORD_OVERHEAD = 48
ANSWER_OVERHEAD = 16 * 1024


@dataclass
class AnswerHold:
    """One answer's share of the budget, and how many bytes it holds per record byte."""

    reservation: Reservation
    factor: float

    def room(self, record_bytes: int, records: int) -> int:
        """The bytes an answer of ``records`` records of ``record_bytes`` holds; none
        for no records: a long-poll that waits with nothing holds nothing, and so keeps
        no read that needs the whole budget waiting."""
        if not records:
            return 0
        return (math.ceil(record_bytes * self.factor) + records * RECORD_OVERHEAD
                + ANSWER_OVERHEAD)

    def room_to_read(self, max_bytes: int) -> int:
        """The bytes a read of at most ``max_bytes`` may hold, while it reads and after."""
        return math.ceil(max_bytes * max(self.factor, READ_FACTOR)) + ANSWER_OVERHEAD

    def hold(self, n: int) -> None:
        self.reservation.hold(n)

    async def reserve_to_read(self, max_bytes: int) -> None:
        """Room for a look of at most ``max_bytes``, beside what the outcomes of the
        previous look hold until this one replaces them; waits for it (or raises
        :class:`~app.errors.Unavailable`)."""
        await self.reservation.reserve(self.reservation.held + self.room_to_read(max_bytes))

    def keep(self, outcomes: Sequence[ReadOutcome]) -> None:
        """From now on, hold what the answer of ``outcomes`` holds."""
        self.hold(self.room(*_read(outcomes)))

    def release(self) -> None:
        self.reservation.release()


def _read(outcomes: Sequence[ReadOutcome]) -> tuple[int, int]:
    """The record bytes and the records of the outcomes."""
    results = [o for o in outcomes if isinstance(o, ReadResult)]
    return (sum(runs.records_bytes(o.records) for o in results),
            sum(len(o.records) for o in results))
