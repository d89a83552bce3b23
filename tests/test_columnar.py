"""bytes-batch-v3 (app/storage/columnar.py) and the record batches built on it
(app/storage/batch.py): round trips, joins and cuts that never touch a record, and
hostile input that is refused as CorruptData, never more."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import CorruptData
from app.storage import codec, columnar
from app.storage.batch import RecordBatch, partition_body
from app.storage.log_record import LogRecord, Payload

PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

values = st.binary(max_size=40)
plain = st.lists(values, min_size=0, max_size=20)
record = st.builds(
    LogRecord, values, st.none() | st.binary(max_size=10), st.just(()),
    st.none() | st.integers(0, 2**62), st.integers(0, 2**40))
mixed = st.lists(st.one_of(values, record), max_size=20)


def _normal(payloads: list[Payload]) -> list[Payload]:
    """What a decoder gives back: plain bytes for a record with nothing but a value."""
    return [p if isinstance(p, bytes) or not (p.plain and not p.append_time_ms)
            else p.value for p in payloads]


@PROPS
@given(mixed)
def test_round_trip(payloads: list[Payload]) -> None:
    body = columnar.encode(payloads)
    layout = columnar.read_columns(body)
    assert layout.count == len(payloads)
    assert columnar.decode(layout) == _normal(payloads)
    assert layout.payload_bytes == sum(len(p) if isinstance(p, bytes) else
                                       len(p.value) + len(p.key or b"") for p in payloads)
    # The records area alone (a tail-cache segment) decodes the same.
    assert codec.decode_records(memoryview(body), 4, len(body), len(payloads),
                                codec.ENCODING_V3) == (_normal(payloads), len(body))
    assert codec.decode_body(body, codec.ENCODING_V3, len(payloads)) == _normal(payloads)


sent = st.lists(st.one_of(values, st.builds(  # as a client sends them: no append times
    LogRecord, values, st.none() | st.binary(max_size=10), st.just(()),
    st.none() | st.integers(0, 2**62), st.just(0))), max_size=20)


@PROPS
@given(sent, st.binary(max_size=8), st.binary(max_size=8))
def test_a_batch_detached_from_a_request_keeps_its_columns(
        payloads: list[Payload], before: bytes, after: bytes) -> None:
    """A body checked where it lies in a request, then copied out (the tail cache's
    copy): the copy's columns are the ones its own bytes give; so are those of a layout
    read from a larger buffer, which are read again."""
    body = columnar.encode(payloads)
    held = memoryview(before + body + after)[len(before):len(before) + len(body)]
    batch = RecordBatch.checked(held, columnar.ENCODING_V3)
    copy = batch.detached()
    assert isinstance(copy.body, bytes) and copy.body == body
    assert copy.columns == columnar.read_columns(copy.body)
    assert copy.decoded() == _normal(payloads)
    wide = columnar.read_columns(before + body, len(before))  # within a larger buffer
    assert columnar.copied(wide, body) == columnar.read_columns(body)


@PROPS
@given(st.lists(mixed, min_size=1, max_size=5))
def test_join_is_the_concatenation(bodies: list[list[Payload]]) -> None:
    layouts = [columnar.read_columns(columnar.encode(b)) for b in bodies]
    joined = b"".join(columnar.join(layouts))
    assert columnar.decode(columnar.read_columns(joined)) == _normal(
        [p for b in bodies for p in b])


@PROPS
@given(mixed, st.data())
def test_cut_keeps_a_range(payloads: list[Payload], data: st.DataObject) -> None:
    first = data.draw(st.integers(0, len(payloads)))
    stop = data.draw(st.integers(first, len(payloads)))
    layout = columnar.read_columns(columnar.encode(payloads))
    cut = b"".join(columnar.cut(layout, first, stop))
    assert columnar.decode(columnar.read_columns(cut)) == _normal(payloads[first:stop])


@PROPS
@given(st.binary(max_size=200))
def test_hostile_bytes_are_corrupt_data_or_a_valid_body(data: bytes) -> None:
    try:
        layout = columnar.read_columns(data)
    except CorruptData:
        return
    assert layout.end == len(data)
    columnar.decode(layout)


@PROPS
@given(mixed.filter(bool), st.data())
def test_every_truncation_is_refused(payloads: list[Payload], data: st.DataObject) -> None:
    body = columnar.encode(payloads)
    cut = data.draw(st.integers(0, len(body) - 1))
    with pytest.raises(CorruptData):
        columnar.read_columns(body[:cut])


@pytest.mark.parametrize("body, why", [
    (struct.pack(">IB", 1, 0x80) + struct.pack(">I", 0), "unknown columns"),
    (struct.pack(">IB", 2**31, 0), "claims"),
    (struct.pack(">IBIi", 1, columnar.KEYS, 1, -2) + b"x", "negative key length"),
    (struct.pack(">IBIq", 1, columnar.TIMESTAMPS, 1, -5) + b"x", "negative timestamp"),
    (struct.pack(">IBI", 1, 0, 3) + b"xx", "add up"),
    (struct.pack(">IBI", 1, 0, 1) + b"xx", "add up"),
])
def test_malformed_bodies_say_what_is_wrong(body: bytes, why: str) -> None:
    with pytest.raises(CorruptData, match=why):
        columnar.read_columns(body)


def test_a_client_body_may_not_carry_append_times() -> None:
    body = columnar.encode([LogRecord(b"x", append_time_ms=5)])
    with pytest.raises(CorruptData, match="append times"):
        RecordBatch.checked(body, codec.ENCODING_V3)
    with pytest.raises(CorruptData, match="append times"):
        RecordBatch.checked(codec.encode_batch_v2([LogRecord(b"x", append_time_ms=5)]),
                            codec.ENCODING_V2)


def test_a_checked_batch_is_a_lazy_sequence_and_owns_its_bytes_when_detached() -> None:
    request = bytearray(b"junk" + columnar.encode([b"a", b"bc"]) + b"tail")
    batch = RecordBatch.checked(memoryview(request)[4:-4], codec.ENCODING_V3)
    assert (len(batch), batch.size, list(batch.record_sizes())) == (2, 3, [1, 2])
    owned = batch.detached()
    request[:] = bytes(len(request))  # the request buffer is reused
    assert list(owned) == [b"a", b"bc"] and owned[1] == b"bc"


@pytest.mark.parametrize("encoding, expected", [
    (codec.ENCODING_V3, codec.ENCODING_V3), (codec.ENCODING_V1, codec.ENCODING_V1)])
def test_a_partition_body_joins_batches_in_the_configured_encoding(
        encoding: str, expected: str) -> None:
    batches: list[list[Payload] | RecordBatch] = [
        [b"json-1", b"json-2"],
        RecordBatch.checked(codec.encode_batch([b"v1"]), codec.ENCODING_V1),
        RecordBatch.checked(columnar.encode([b"v3"]), codec.ENCODING_V3),
    ]
    parts, used, count = partition_body(batches, encoding)
    assert (used, count) == (expected, 4)
    body = b"".join(parts)
    assert codec.decode_body(body, used, 4) == [b"json-1", b"json-2", b"v1", b"v3"]


def test_a_record_with_headers_makes_the_body_v2() -> None:
    batches = [[b"a"], [LogRecord(b"b", headers=(("h", b"1"),))]]
    parts, used, _ = partition_body(batches, codec.ENCODING_V3)
    assert used == codec.ENCODING_V2
    assert codec.decode_body(b"".join(parts), used) == [
        b"a", LogRecord(b"b", headers=(("h", b"1"),))]
