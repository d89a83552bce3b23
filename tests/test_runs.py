"""Answers as runs of stored bodies (app/storage/runs.py): budgets applied by columns
agree with the record-by-record rule, decoding gives the records and append times the
log holds, and a binary answer cut from the bodies is the answer encoded from records."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.storage import columnar, runs
from app.storage.batch import RecordBatch
from app.storage.log_record import LogRecord, Payload, payload_size
from app.wire import records as wire

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.binary(max_size=30)
record = st.builds(
    LogRecord, values, st.none() | st.binary(max_size=10), st.just(()),
    st.none() | st.integers(0, 2**62), st.integers(0, 2**40))
bodies = st.lists(st.lists(st.one_of(values, record), min_size=1, max_size=12),
                  min_size=1, max_size=4)


def _batch(payloads: list[Payload], columns: bool) -> RecordBatch | list[Payload]:
    """The records as the reader holds them: a checked v3 body, or decoded."""
    body = columnar.encode(payloads)
    layout = columnar.read_columns(body)
    if columns:
        return RecordBatch(body, columnar.ENCODING_V3, layout.count, layout.payload_bytes,
                           layout)
    return columnar.decode(layout)


def _expected(stored: list[list[Payload]], first: int, budget: int | None,
              max_records: int | None, times: list[int]
              ) -> tuple[list[tuple[int, Payload]], list[int]]:
    """Record by record, as the reader assembled answers before runs."""
    out: list[tuple[int, Payload]] = []
    out_times: list[int] = []
    size, at = 0, 1
    for payloads, entry_time in zip(stored, times, strict=True):
        for p in columnar.decode(columnar.read_columns(columnar.encode(payloads))):
            if at >= first:
                n = payload_size(p)
                if out and ((budget is not None and size + n > budget) or (
                        max_records is not None and len(out) >= max_records)):
                    return out, out_times
                appended = entry_time
                if isinstance(p, LogRecord):
                    appended = p.append_time_ms or entry_time
                    p = p.value if p.plain else LogRecord(p.value, p.key, p.headers,
                                                          p.timestamp_ms)
                out.append((at, p))
                out_times.append(appended)
                size += n
            at += 1
    return out, out_times


def _take_all(stored: list[list[Payload]], first: int, budget: int | None,
              max_records: int | None, times: list[int], columns: bool
              ) -> runs.RunRecords:
    taken: list[runs.Run] = []
    size = count = 0
    at = 1
    for payloads, entry_time in zip(stored, times, strict=True):
        batch = _batch(payloads, columns)
        if at + len(batch) <= first:
            at += len(batch)
            continue
        start = max(first - at, 0)
        run, used = runs.take(batch, start, at + start, entry_time,
                              budget=None if budget is None else budget - size,
                              max_records=None if max_records is None else max_records - count,
                              may_exceed=count == 0)
        taken.append(run)
        size, count = size + used, count + len(run)
        if run.stop < len(batch):
            break
        at += len(batch)
    return runs.RunRecords(taken, size)


@dataclass(frozen=True)
class Read:
    stored: list[list[Payload]]  # the bodies, offsets from 1
    first: int
    budget: int | None
    times: list[int]  # each body's append time


@st.composite
def reads(draw: st.DrawFn) -> Read:
    stored = draw(bodies)
    return Read(stored, draw(st.integers(1, sum(len(b) for b in stored))),
                draw(st.none() | st.integers(0, 200)),
                draw(st.lists(st.integers(1, 2**40), min_size=len(stored),
                              max_size=len(stored))))


@PROPS
@given(reads(), st.none() | st.integers(1, 30))
def test_runs_take_what_the_record_by_record_rule_takes(
        read: Read, max_records: int | None) -> None:
    stored, first, budget, times = read.stored, read.first, read.budget, read.times
    want, want_times = _expected(stored, first, budget, max_records, times)
    for columns in (True, False):
        got = _take_all(stored, first, budget, max_records, times, columns)
        assert list(got) == want
        assert got == want
        assert got.times() == want_times
        assert len(got) == len(want)
        assert got.size == sum(payload_size(v) for _, v in want)
        assert runs.counted_bytes(got) == sum(max(payload_size(v), 1) for _, v in want)
        assert got.first_offset == (want[0][0] if want else None)
        assert got.next_offset == (want[-1][0] + 1 if want else None)


@PROPS
@given(bodies, st.integers(0, 300), st.booleans())
def test_within_keeps_the_leading_records_that_fit(
        stored: list[list[Payload]], budget: int, first_of_answer: bool) -> None:
    times = [7] * len(stored)
    got = _take_all(stored, 1, None, None, times, True)
    plain = list(got)
    kept = runs.within(got, budget, first_of_answer=first_of_answer)
    assert list(kept) == list(runs.within(plain, budget, first_of_answer=first_of_answer))
    assert runs.records_bytes(kept) == runs.records_bytes(list(kept))


@PROPS
@given(reads())
def test_a_binary_answer_cut_from_bodies_is_the_one_encoded_from_records(read: Read) -> None:
    total = sum(len(b) for b in read.stored)
    got = _take_all(read.stored, read.first, read.budget, None, read.times, True)
    assert got.v3_cuts() is not None
    offset = got.first_offset or read.first

    def answer(records: object) -> bytes:
        return wire.build([wire.Records("t", 0, total, 1, offset + len(got), offset,
                                        records, got.times())])  # type: ignore[arg-type]

    # The same records and times; a cut may keep a column its records leave empty.
    assert wire.parse(answer(runs.payloads(got))) == wire.parse(answer([v for _, v in got]))
    (parsed,) = wire.parse(answer(runs.payloads(got)))
    assert isinstance(parsed, wire.Records)
    assert parsed.append_times == got.times()


def test_keys_are_cut_with_their_records() -> None:
    payloads: list[Payload] = [LogRecord(b"a", b"k1"), b"b", LogRecord(b"c", b"key3"),
                               LogRecord(b"d", None, (), 5)]
    layout = columnar.read_columns(columnar.encode(payloads))
    for first in range(4):
        for stop in range(first, 5):
            body = b"".join(columnar.join_cuts([(layout, first, stop)]))
            assert columnar.decode(columnar.read_columns(body)) == \
                columnar.decode(layout)[first:stop]


@PROPS
@given(bodies)
def test_pieces_are_the_records_of_their_bodies_in_order(stored: list[list[Payload]]) -> None:
    pieces = runs.Pieces([_batch(p, True) for p in stored])
    flat = [r for p in stored for r in columnar.decode(columnar.read_columns(
        columnar.encode(p)))]
    assert list(pieces) == flat
    assert len(pieces) == len(flat)
    assert runs.pieces_of(pieces) == pieces.pieces
    assert runs.pieces_of(flat) == [flat]
