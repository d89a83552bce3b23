"""The records of an answer as runs of stored bodies, decoded only when someone asks.

A read answer is consecutive records lifted from a few bodies: WAL slices, tail-cache
chunks. Decoding each record into a Python object, only for a binary answer to encode
them into columns again, cost most of a catch-up read's CPU. A :class:`Run` names
*which* records of which body; budgets are applied to the body's size column with a few
calls into C, and a bytes-batch-v3 body's runs go into a binary answer column by column
(:func:`app.storage.columnar.join_cuts`), its record bytes copied once. A JSON answer,
or anyone iterating, gets the ``(offset, payload)`` pairs, decoded on first use.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import overload

from app.storage import columnar
from app.storage.batch import RecordBatch
from app.storage.log_record import LogRecord, Payload, payload_size

Pair = tuple[int, Payload]


@dataclass(frozen=True, slots=True)
class Run:
    """Records ``first .. stop - 1`` of ``records``; ``records[first]`` is at ``offset``
    of the log. Records without an append time of their own were appended at
    ``append_time_ms`` (their index entry's)."""

    records: Sequence[Payload]  # a RecordBatch (columns, for bytes-batch-v3) or payloads
    first: int
    stop: int
    offset: int
    append_time_ms: int

    def __len__(self) -> int:
        return self.stop - self.first

    @property
    def columns(self) -> columnar.Columns | None:
        records = self.records
        return records.columns if isinstance(records, RecordBatch) else None

    def sizes(self) -> Sequence[int]:
        """Each record's bytes as budgets count them."""
        return record_sizes(self.records, self.first, self.stop)

    def pairs(self) -> list[Pair]:
        """``(offset, payload)`` of each record; append times are not part of a payload
        (they are in :meth:`times`)."""
        values = self.records[self.first:self.stop]
        return [(at, _timeless(v)) for at, v in zip(range(self.offset, self.offset + len(self)),
                                                    values, strict=True)]

    def times(self) -> list[int]:
        """The append time of each record."""
        c = self.columns
        entry = self.append_time_ms
        if c is not None:
            if c.append_times is None:
                return [entry] * len(self)
            return [t or entry for t in c.append_times[self.first:self.stop]]
        return [(v.append_time_ms or entry) if isinstance(v, LogRecord) else entry
                for v in self.records[self.first:self.stop]]


def _timeless(value: Payload) -> Payload:
    if isinstance(value, bytes):
        return value
    if value.plain:
        return value.value
    return value if not value.append_time_ms else dataclasses.replace(value,
                                                                      append_time_ms=0)


def record_sizes(records: Sequence[Payload], first: int = 0, stop: int | None = None
                 ) -> Sequence[int]:
    """Each record's bytes as budgets count them; of records ``first .. stop - 1`` only,
    when given, reckoning only those: a read of a few records of a large chunk does not
    pay for the whole chunk's sizes."""
    if isinstance(records, RecordBatch) and records.columns is not None:
        return records.columns.record_sizes(first, stop)
    return [payload_size(p) for p in records[first:stop]]


def take(records: Sequence[Payload], first: int, offset: int, append_time_ms: int, *,
         budget: int | None, max_records: int | None, may_exceed: bool
         ) -> tuple[Run, int]:
    """The leading records of ``records[first:]`` within ``budget`` bytes and
    ``max_records`` (None: no limit; with ``may_exceed``, the first record even beyond
    the budget), and their bytes."""
    total = len(records)
    stop = total if max_records is None else min(total, first + max(0, max_records))
    cumulative = list(accumulate(record_sizes(records, first, stop)))
    n = len(cumulative) if budget is None else bisect_right(cumulative, budget)
    if n == 0 and may_exceed and cumulative:
        n = 1
    return Run(records, first, first + n, offset, append_time_ms), \
        (cumulative[n - 1] if n else 0)


class Pieces(Sequence[Payload]):
    """The records of consecutive bodies as one sequence (the chunks of a compacted
    blob): an answer takes runs of each piece."""

    __slots__ = ("_flat", "pieces")

    def __init__(self, pieces: list[Sequence[Payload]]) -> None:
        self.pieces = pieces
        self._flat: list[Payload] | None = None

    def __len__(self) -> int:
        return sum(len(p) for p in self.pieces)

    @overload
    def __getitem__(self, index: int) -> Payload: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Payload]: ...

    def __getitem__(self, index: int | slice) -> Payload | Sequence[Payload]:
        if self._flat is None:
            self._flat = [r for piece in self.pieces for r in piece]
        return self._flat[index]


def pieces_of(records: Sequence[Payload]) -> list[Sequence[Payload]]:
    return records.pieces if isinstance(records, Pieces) else [records]


class RunRecords(Sequence[Pair]):
    """An answer's records as runs: a ``Sequence[(offset, payload)]`` that decodes on
    first use, with its size, append times and offsets known without decoding."""

    __slots__ = ("_pairs", "runs", "size")

    def __init__(self, runs: list[Run], size: int) -> None:
        self.runs = [r for r in runs if len(r)]
        self.size = size  # value, key and header bytes
        self._pairs: list[Pair] | None = None

    def pairs(self) -> list[Pair]:
        if self._pairs is None:
            self._pairs = [p for run in self.runs for p in run.pairs()]
        return self._pairs

    def times(self) -> list[int]:
        return [t for run in self.runs for t in run.times()]

    @property
    def next_offset(self) -> int | None:
        """One past the last record's offset (None: no records)."""
        if not self.runs:
            return None
        last = self.runs[-1]
        return last.offset + len(last)

    @property
    def first_offset(self) -> int | None:
        return self.runs[0].offset if self.runs else None

    def counted_bytes(self) -> int:
        """Bytes toward ``min_bytes``: an empty record counts one."""
        return self.size + sum(run.sizes().count(0) for run in self.runs)

    def within(self, budget: int, *, first_of_answer: bool) -> RunRecords:
        """The leading records within ``budget`` bytes (with ``first_of_answer``, the
        first record even beyond it)."""
        runs: list[Run] = []
        size = 0
        for run in self.runs:
            cut, used = take(run.records, run.first, run.offset, run.append_time_ms,
                             budget=budget - size, max_records=len(run),
                             may_exceed=first_of_answer and not runs)
            if len(cut):
                runs.append(cut)
            size += used
            if len(cut) < len(run):
                break
        return RunRecords(runs, size)

    def v3_cuts(self) -> list[tuple[columnar.Columns, int, int]] | None:
        """The runs as cuts of bytes-batch-v3 bodies, or None when one is not."""
        cuts = []
        for run in self.runs:
            c = run.columns
            if c is None:
                return None
            cuts.append((c, run.first, run.stop))
        return cuts

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    @overload
    def __getitem__(self, index: int) -> Pair: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Pair]: ...

    def __getitem__(self, index: int | slice) -> Pair | Sequence[Pair]:
        return self.pairs()[index]

    def __iter__(self) -> Iterator[Pair]:
        return iter(self.pairs())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return self.pairs() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RunRecords({self.pairs()!r})"


class RunPayloads(Sequence[Payload]):
    """The payloads of :class:`RunRecords`, in order (what a binary answer encodes)."""

    __slots__ = ("records",)

    def __init__(self, records: RunRecords) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    @overload
    def __getitem__(self, index: int) -> Payload: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Payload]: ...

    def __getitem__(self, index: int | slice) -> Payload | Sequence[Payload]:
        if isinstance(index, slice):
            return [v for _, v in self.records.pairs()[index]]
        return self.records.pairs()[index][1]


def payloads(records: Sequence[Pair]) -> Sequence[Payload]:
    """The payloads of ``(offset, payload)`` records (not decoded for runs)."""
    if isinstance(records, RunRecords):
        return RunPayloads(records)
    return [v for _, v in records]


def records_bytes(records: Sequence[Pair]) -> int:
    """The bytes of ``(offset, payload)`` records as budgets count them."""
    if isinstance(records, RunRecords):
        return records.size
    return sum(payload_size(v) for _, v in records)


def counted_bytes(records: Sequence[Pair]) -> int:
    """Bytes toward ``min_bytes``: an empty record counts one."""
    if isinstance(records, RunRecords):
        return records.counted_bytes()
    return sum(max(payload_size(v), 1) for _, v in records)


def first_offset(records: Sequence[Pair]) -> int | None:
    if isinstance(records, RunRecords):
        return records.first_offset
    return records[0][0] if records else None


def next_offset(records: Sequence[Pair]) -> int | None:
    """One past the last record's offset (None: no records)."""
    if isinstance(records, RunRecords):
        return records.next_offset
    return records[-1][0] + 1 if records else None


def within(records: Sequence[Pair], budget: int, *, first_of_answer: bool
           ) -> Sequence[Pair]:
    """The leading records that fit ``budget`` (the first of the answer always does)."""
    if isinstance(records, RunRecords):
        return records.within(budget, first_of_answer=first_of_answer)
    kept: list[Pair] = []
    size = 0
    for offset, value in records:
        value_size = payload_size(value)
        if size + value_size > budget and not (first_of_answer and not kept):
            break
        kept.append((offset, value))
        size += value_size
    return kept
