"""Pure unit tests of ``bytes-batch-v1`` and the shared ``LLS1`` blob (app/storage/codec.py)."""

from __future__ import annotations

import contextlib
import json
import string
import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from app.errors import CorruptData, LlogError
from app.storage.codec import (
    ENCODING_V1,
    ENCODING_V2,
    MAGIC,
    MAX_BLOB_PARTITIONS,
    MAX_HEADER_BYTES,
    SliceEntry,
    crc32c,
    decode_batch,
    decode_batch_v2,
    decode_body,
    decode_shared_blob,
    decode_shared_header,
    encode_batch,
    encode_batch_v2,
    encode_body,
    encode_shared_blob,
    encoded_batch_size,
    v2_parts,
    verify_body,
)
from app.storage.log_record import LogRecord, Payload

U32 = struct.Struct(">I")
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BLOB_PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW_PROPS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])

records_st = st.lists(st.binary(max_size=48), max_size=16)
blob_records_st = st.lists(st.binary(max_size=32), max_size=6)
TOPIC_ALPHABET = string.ascii_letters + string.digits + "._-"
topics_st = st.text(TOPIC_ALPHABET, min_size=1, max_size=40).filter(lambda t: t not in (".", ".."))
partitions_st = st.integers(min_value=0, max_value=2**31 - 1)
groups_st = st.lists(st.tuples(topics_st, partitions_st, blob_records_st), max_size=4)
created_st = st.integers(min_value=0, max_value=2**63 - 1)


def lls1(header: object, tail: bytes = b"") -> bytes:
    """An LLS1 blob with an arbitrary (JSON-serialised) header and tail."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return MAGIC + U32.pack(len(raw)) + raw + tail


def build_blob(header: dict[str, object], bodies: list[bytes], lengths: list[int] | None = None,
               ) -> bytes:
    """An LLS1 blob whose header entries point at ``bodies`` (offsets fixed up in place)."""
    entries = header["partitions"]
    assert isinstance(entries, list)
    raw = b""
    for _ in range(5):
        pos = 8 + len(raw)
        for i, (entry, body) in enumerate(zip(entries, bodies, strict=True)):
            entry["body_offset"] = pos
            entry["body_length"] = len(body) if lengths is None else lengths[i]
            pos += len(body)
        raw = json.dumps(header, separators=(",", ":")).encode()
    return lls1(raw, b"".join(bodies))


def header_json(blob: bytes) -> dict[str, object]:
    (length,) = U32.unpack_from(blob, 4)
    parsed = json.loads(blob[8:8 + length])
    assert isinstance(parsed, dict)
    return parsed


# -- bytes-batch-v1 -------------------------------------------------------------------


@PROPS
@given(records_st)
def test_batch_round_trip(records: list[bytes]) -> None:
    body = encode_batch(records)
    assert len(body) == encoded_batch_size(records)
    assert decode_batch(body) == records
    assert decode_batch(body, expected_count=len(records)) == records
    assert decode_batch(memoryview(body)) == records


def test_batch_layout_is_big_endian_count_then_length_prefixed_records() -> None:
    body = encode_batch([b"ab", b"", b"xyz"])
    assert body == (
        b"\x00\x00\x00\x03" + b"\x00\x00\x00\x02ab" + b"\x00\x00\x00\x00"
        + b"\x00\x00\x00\x03xyz"
    )


@pytest.mark.parametrize("records", [[], [b""], [b"", b"", b""], [b"", b"x", b""]])
def test_batch_round_trip_with_empty_records(records: list[bytes]) -> None:
    assert decode_batch(encode_batch(records), expected_count=len(records)) == records


@PROPS
@given(records_st, st.integers(min_value=0, max_value=2**32))
def test_batch_expected_count_mismatch_is_corrupt(records: list[bytes], expected: int) -> None:
    assume(expected != len(records))
    with pytest.raises(CorruptData):
        decode_batch(encode_batch(records), expected_count=expected)


@PROPS
@given(records_st)
def test_batch_every_truncation_is_corrupt(records: list[bytes]) -> None:
    body = encode_batch(records)
    for cut in range(len(body)):
        with pytest.raises(CorruptData):
            decode_batch(body[:cut])


@PROPS
@given(records_st, st.binary(min_size=1, max_size=8))
def test_batch_trailing_bytes_are_corrupt(records: list[bytes], extra: bytes) -> None:
    with pytest.raises(CorruptData):
        decode_batch(encode_batch(records) + extra)


def _decode_or_corrupt(data: bytes) -> None:
    try:
        records = decode_batch(data)
    except CorruptData:
        return
    # A body that decodes has lengths adding up exactly: it re-encodes to itself.
    assert encode_batch(records) == data


@PROPS
@given(st.binary(max_size=256))
def test_batch_random_bytes_decode_exactly_or_are_corrupt(data: bytes) -> None:
    _decode_or_corrupt(data)


@PROPS
@given(st.integers(min_value=0, max_value=8), st.binary(max_size=64))
def test_batch_small_count_random_tail(count: int, tail: bytes) -> None:
    # A plausible count makes the decoder walk into the random lengths.
    _decode_or_corrupt(U32.pack(count) + tail)


@PROPS
@given(records_st, st.data())
def test_batch_single_byte_mutation_decodes_exactly_or_is_corrupt(
    records: list[bytes], data: st.DataObject
) -> None:
    body = bytearray(encode_batch(records))
    i = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    body[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    _decode_or_corrupt(bytes(body))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\x00\x00\x00",
        b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00",
        b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x02" + b"\x00\x00\x00\x00",  # 2 records need at least 8 more bytes
        b"\x00\x00\x00\x01" + b"\xff\xff\xff\xff",  # record length overruns the body
        b"\x00\x00\x00\x01" + b"\x00\x00\x00\x05abcd",
        b"\x00\x00\x00\x00" + b"\x00",
    ],
)
def test_batch_malformed_bodies_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptData):
        decode_batch(data)


def test_batch_huge_claimed_count_rejected_without_allocating() -> None:
    tracemalloc.start()
    try:
        with pytest.raises(CorruptData, match="claims"):
            decode_batch(b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_corrupt_data_is_a_log_error() -> None:
    with pytest.raises(LlogError) as info:
        decode_batch(b"")
    assert info.value.error_type == "CorruptData"


# -- crc32c -----------------------------------------------------------------------------


def test_crc32c_known_vector() -> None:
    # The CRC-32C (Castagnoli) check value.
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283


def test_verify_body() -> None:
    body = encode_batch([b"x"])
    verify_body(body, crc32c(body))
    verify_body(body, None)  # no CRC recorded: skipped
    verify_body(body, -1)
    with pytest.raises(CorruptData, match="crc32c"):
        verify_body(body, crc32c(body) ^ 1)


# -- LLS1 -------------------------------------------------------------------------------


@BLOB_PROPS
@given(groups_st, created_st)
def test_shared_blob_round_trip(
    groups: list[tuple[str, int, list[bytes]]], created_at_ms: int
) -> None:
    blob, parts = encode_shared_blob(groups, created_at_ms)
    assert blob[:4] == MAGIC
    decoded = decode_shared_blob(blob)
    assert [p for p, _ in decoded] == parts
    assert [recs for _, recs in decoded] == [recs for _, _, recs in groups]
    for part, (topic, partition, records) in zip(parts, groups, strict=True):
        assert (part.topic, part.partition, part.msg_count) == (topic, partition, len(records))
        assert part.encoding == "bytes-batch-v1"
    header = decode_shared_header(blob)
    assert header.version == 1
    assert header.created_at_ms == created_at_ms
    assert header.parts == parts
    assert header.header_end == 8 + U32.unpack_from(blob, 4)[0]


@BLOB_PROPS
@given(groups_st, created_st)
def test_shared_blob_body_offsets_are_absolute_and_contiguous(
    groups: list[tuple[str, int, list[bytes]]], created_at_ms: int
) -> None:
    blob, parts = encode_shared_blob(groups, created_at_ms)
    header_end = 8 + U32.unpack_from(blob, 4)[0]
    pos = header_end
    for part, (_, _, records) in zip(parts, groups, strict=True):
        assert part.body_offset == pos
        body = blob[part.body_offset:part.body_offset + part.body_length]
        assert body == encode_batch(records)
        assert decode_batch(body, part.msg_count) == records
        assert part.crc32c == crc32c(body) == crc32c(body[3:], crc32c(body[:3]))
        pos += part.body_length
    assert pos == len(blob)


@BLOB_PROPS
@given(groups_st, created_st)
def test_shared_blob_header_uses_protocol_field_names(
    groups: list[tuple[str, int, list[bytes]]], created_at_ms: int
) -> None:
    blob, parts = encode_shared_blob(groups, created_at_ms)
    header = header_json(blob)
    assert header["version"] == 1
    assert header["created_at_ms"] == created_at_ms
    entries = header["partitions"]
    assert isinstance(entries, list)
    assert len(entries) == len(parts)
    for entry, part in zip(entries, parts, strict=True):
        assert entry == {
            "topic": part.topic,
            "partition": part.partition,
            "msg_count": part.msg_count,
            "encoding": "bytes-batch-v1",
            "body_offset": part.body_offset,
            "body_length": part.body_length,
            "crc32c": part.crc32c,
        }


def test_shared_blob_body_offset_stable_across_digit_boundaries() -> None:
    # Enough groups that the header's own length changes the offsets' digit counts.
    groups = [(f"t{i}", i, [b"x" * (i % 7)]) for i in range(300)]
    blob, parts = encode_shared_blob(groups, 1_700_000_000_000)
    for part, (_, _, records) in zip(parts, groups, strict=True):
        assert blob[part.body_offset:part.body_offset + part.body_length] == encode_batch(records)
    assert decode_shared_header(blob).parts == parts


def test_shared_blob_without_groups() -> None:
    blob, parts = encode_shared_blob([], 5)
    assert parts == []
    assert decode_shared_blob(blob) == []
    assert decode_shared_header(blob).created_at_ms == 5


@BLOB_PROPS
@given(
    st.lists(st.tuples(topics_st, partitions_st, blob_records_st), min_size=1, max_size=4),
    st.data(),
)
def test_shared_blob_flipped_body_byte_fails_crc(
    groups: list[tuple[str, int, list[bytes]]], data: st.DataObject
) -> None:
    blob, parts = encode_shared_blob(groups, 0)
    part = data.draw(st.sampled_from(parts))
    i = data.draw(
        st.integers(min_value=part.body_offset, max_value=part.body_offset + part.body_length - 1)
    )
    mutated = bytearray(blob)
    mutated[i] ^= data.draw(st.integers(min_value=1, max_value=255))
    # The header still parses (only a body changed) ...
    assert decode_shared_header(bytes(mutated)).parts == parts
    # ... but the checksum catches the change.
    with pytest.raises(CorruptData, match="crc32c"):
        decode_shared_blob(bytes(mutated))


def test_shared_blob_without_crc_still_decodes_and_skips_verification() -> None:
    body = encode_batch([b"a", b"bc"])
    entry: dict[str, object] = {"topic": "t", "partition": 0, "msg_count": 2}
    blob = build_blob({"version": 1, "created_at_ms": 1, "partitions": [entry]}, [body])
    [(part, records)] = decode_shared_blob(blob)
    assert part.crc32c == -1
    assert part.encoding == "bytes-batch-v1"
    assert records == [b"a", b"bc"]


def test_shared_blob_extra_header_fields_are_ignored() -> None:
    blob, parts = encode_shared_blob([("t", 3, [b"r"])], 7)
    header = header_json(blob)
    header["writer"] = "future"
    entries = header["partitions"]
    assert isinstance(entries, list)
    entries[0]["future_field"] = [1, 2]
    [(part, records)] = decode_shared_blob(build_blob(header, [encode_batch([b"r"])]))
    assert records == [b"r"]
    assert part.crc32c == parts[0].crc32c


@SLOW_PROPS
@given(groups_st, created_st)
def test_shared_blob_every_truncation_is_corrupt(
    groups: list[tuple[str, int, list[bytes]]], created_at_ms: int
) -> None:
    blob, _ = encode_shared_blob(groups, created_at_ms)
    for cut in range(len(blob)):
        with pytest.raises(CorruptData):
            decode_shared_blob(blob[:cut])


def _shared_decode_or_corrupt(data: bytes) -> None:
    with contextlib.suppress(CorruptData):
        decode_shared_blob(data)


@PROPS
@given(st.binary(max_size=256))
def test_shared_blob_random_bytes_only_corrupt(data: bytes) -> None:
    _shared_decode_or_corrupt(data)


@PROPS
@given(st.binary(max_size=256))
def test_shared_blob_random_after_magic_only_corrupt(data: bytes) -> None:
    _shared_decode_or_corrupt(MAGIC + data)


@PROPS
@given(st.binary(max_size=128), st.binary(max_size=128))
def test_shared_blob_random_header_bytes_only_corrupt(header: bytes, tail: bytes) -> None:
    _shared_decode_or_corrupt(lls1(header, tail))


json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
entry_keys = ["topic", "partition", "msg_count", "encoding", "body_offset", "body_length",
              "crc32c"]
fuzzed_entries = st.dictionaries(st.sampled_from(entry_keys), json_values) | json_values


@BLOB_PROPS
@given(
    st.integers(min_value=0, max_value=2**40),
    st.lists(fuzzed_entries, max_size=3) | json_values,
    st.binary(max_size=64),
)
def test_shared_blob_fuzzed_header_fields_only_corrupt(
    created_at_ms: int, partitions: object, tail: bytes
) -> None:
    header = {"version": 1, "created_at_ms": created_at_ms, "partitions": partitions}
    _shared_decode_or_corrupt(lls1(json.dumps(header).encode(), tail))


@BLOB_PROPS
@given(
    st.lists(st.tuples(topics_st, partitions_st, blob_records_st), max_size=3),
    st.integers(min_value=0, max_value=999),
    st.data(),
)
def test_shared_blob_single_byte_mutation_only_corrupt(
    groups: list[tuple[str, int, list[bytes]]], created_at_ms: int, data: st.DataObject
) -> None:
    blob = bytearray(encode_shared_blob(groups, created_at_ms)[0])
    i = data.draw(st.integers(min_value=0, max_value=len(blob) - 1))
    blob[i] = data.draw(st.integers(min_value=0, max_value=255))
    _shared_decode_or_corrupt(bytes(blob))


def test_shared_blob_bad_magic() -> None:
    blob, _ = encode_shared_blob([("t", 0, [b"x"])], 0)
    for bad in (b"LLS2", b"lls1", b"\x00\x00\x00\x00", b"SLL1"):
        with pytest.raises(CorruptData, match="magic"):
            decode_shared_blob(bad + blob[4:])
    for short in (b"", b"LLS", b"LLS1", b"LLS1\x00\x00\x00"):
        with pytest.raises(CorruptData):
            decode_shared_blob(short)


@pytest.mark.parametrize(
    "blob",
    [
        MAGIC + U32.pack(1000) + b"{}",
        MAGIC + U32.pack(3) + b"{}",
        MAGIC + U32.pack(0xFFFFFFFF) + b"{}",
        MAGIC + U32.pack(MAX_HEADER_BYTES + 1) + b"\x00" * 64,
    ],
)
def test_shared_blob_header_length_beyond_blob(blob: bytes) -> None:
    with pytest.raises(CorruptData, match="header length"):
        decode_shared_header(blob)


def _entry(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"topic": "t", "partition": 0, "msg_count": 1,
                               "body_offset": 0, "body_length": 8}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"not json",
        b"\xff\xfe\xfd",
        b"[]",
        b"null",
        {"version": 1},
        {"version": 1, "partitions": {}},
        {"version": 1, "partitions": [1]},
        {"version": 1, "partitions": [None]},
        {"partitions": []},  # no version
        {"version": "1", "partitions": []},
        {"version": True, "partitions": []},
        {"version": 2, "partitions": []},  # a layout this release does not know
        {"version": 0, "partitions": []},
        {"version": 1, "partitions": [_entry(topic=None)]},
        {"version": 1, "partitions": [_entry(topic=5)]},
        {"version": 1, "partitions": [_entry(partition="0")]},
        {"version": 1, "partitions": [_entry(partition=True)]},
        {"version": 1, "partitions": [_entry(partition=1.0)]},
        {"version": 1, "partitions": [_entry(msg_count=None)]},
        {"version": 1, "partitions": [_entry(crc32c="abc")]},
        {"version": 1, "partitions": [_entry(body_offset=0)]},  # inside the header
        {"version": 1, "partitions": [_entry(body_offset=10**6)]},  # beyond the blob
        {"version": 1, "partitions": [_entry(body_offset=-1)]},
        {"version": 1, "partitions": [_entry(body_length=2**64)]},
    ],
)
def test_shared_blob_malformed_headers_are_corrupt(header: object) -> None:
    with pytest.raises(CorruptData):
        decode_shared_blob(lls1(header, b"\x00" * 64))


def test_shared_blob_body_shorter_than_a_batch_header_is_corrupt() -> None:
    entry: dict[str, object] = {"topic": "t", "partition": 0, "msg_count": 0}
    blob = build_blob({"version": 1, "partitions": [entry]}, [b"\x00" * 3])
    with pytest.raises(CorruptData, match="outside"):
        decode_shared_header(blob)


def test_shared_blob_body_length_beyond_blob_is_corrupt() -> None:
    entry: dict[str, object] = {"topic": "t", "partition": 0, "msg_count": 1}
    blob = build_blob({"version": 1, "partitions": [entry]}, [encode_batch([b"x"])], [10])
    with pytest.raises(CorruptData, match="outside"):
        decode_shared_header(blob)


def test_shared_blob_msg_count_disagreeing_with_body_is_corrupt() -> None:
    entry: dict[str, object] = {"topic": "t", "partition": 0, "msg_count": 3}
    blob = build_blob({"version": 1, "partitions": [entry]}, [encode_batch([b"a", b"b"])])
    with pytest.raises(CorruptData, match="index says"):
        decode_shared_blob(blob)


def test_shared_blob_too_many_partitions() -> None:
    header = {"version": 1, "partitions": [{}] * (MAX_BLOB_PARTITIONS + 1)}
    with pytest.raises(CorruptData, match="too many"):
        decode_shared_header(lls1(header))


def test_blob_part_is_frozen() -> None:
    part = SliceEntry("t", 0, 1, 8, 8, 0)
    with pytest.raises(AttributeError):
        part.topic = "u"  # type: ignore[misc]


# -- hostile input: the decoder promises CorruptData, nothing else ----------------


def test_shared_blob_deeply_nested_header_is_corrupt() -> None:
    with pytest.raises(CorruptData):
        decode_shared_header(lls1(b"[" * 100_000))


@pytest.mark.parametrize("value", [b'"x"', b"[]", b"null", b"NaN", b"1e400"])
def test_shared_blob_bad_created_at_ms_is_corrupt(value: bytes) -> None:
    raw = b'{"version":1,"created_at_ms":' + value + b',"partitions":[]}'
    with pytest.raises(CorruptData):
        decode_shared_header(lls1(raw))


# -- bytes-batch-v2 ----------------------------------------------------------------------

_bytes_st = st.binary(max_size=40)
_header_st = st.tuples(st.text(min_size=1, max_size=8), _bytes_st)
_log_record_st = st.builds(
    LogRecord, _bytes_st, st.none() | _bytes_st,
    st.lists(_header_st, max_size=3).map(tuple),
    st.none() | st.integers(min_value=-2**63, max_value=2**63 - 1),
    st.integers(min_value=0, max_value=2**62))
_payloads_st = st.lists(_bytes_st | _log_record_st, max_size=20)


def _normal(p: Payload) -> Payload:
    """What decoding gives back for ``p``: bytes for a record with nothing but a value."""
    if isinstance(p, LogRecord) and p.plain and not p.append_time_ms:
        return p.value
    return p


@PROPS
@given(_payloads_st)
def test_v2_round_trips_every_payload(payloads: list[Payload]) -> None:
    body = encode_batch_v2(payloads)
    assert decode_batch_v2(body, expected_count=len(payloads)) == [_normal(p) for p in payloads]
    assert decode_body(body, ENCODING_V2) == [_normal(p) for p in payloads]


@PROPS
@given(_payloads_st.filter(bool), st.data())
def test_v2_truncated_or_padded_bodies_are_corrupt(payloads: list[Payload],
                                                    data: st.DataObject) -> None:
    body = encode_batch_v2(payloads)
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    with pytest.raises(CorruptData):
        decode_batch_v2(body[:cut])
    with pytest.raises(CorruptData):
        decode_batch_v2(body + b"\x00")


def test_v2_byte_level_example() -> None:
    """The example in docs/protocol.md, byte for byte."""
    body = encode_batch_v2([b"hi", LogRecord(b"v", b"k", (("h", b"x"),), 5)])
    assert body.hex() == (
        "00000002"                                   # two records
        "0000000b" "00" "0000000000000000" "6869"    # 11 bytes: plain, no time, "hi"
        "00000021" "07" "0000000000000000"           # 33 bytes: key+headers+timestamp
        "0000000000000005"                           # timestamp 5
        "00000001" "6b"                              # key "k"
        "0001" "0001" "68" "00000001" "78"           # one header: "h" = "x"
        "76")                                        # value "v"


def test_unknown_v2_attributes_and_encodings_are_corrupt() -> None:
    body = bytearray(encode_batch_v2([LogRecord(b"v", b"k")]))
    body[8] |= 0x80  # an attribute bit this release does not know
    with pytest.raises(CorruptData, match="unknown attributes"):
        decode_batch_v2(bytes(body))
    with pytest.raises(CorruptData, match="bytes-batch-v9"):
        decode_body(encode_batch([b"x"]), "bytes-batch-v9")


def test_plain_records_keep_the_v1_encoding() -> None:
    assert encode_body([b"a", b"b"]) == (encode_batch([b"a", b"b"]), ENCODING_V1)
    body, encoding = encode_body([b"a", LogRecord(b"b", key=b"k")])
    assert encoding == ENCODING_V2
    assert decode_body(body, encoding) == [b"a", LogRecord(b"b", key=b"k")]


@PROPS
@given(_payloads_st.filter(bool), st.integers(min_value=1, max_value=2**40))
def test_v2_parts_give_every_record_its_append_time(payloads: list[Payload],
                                                    default: int) -> None:
    for body, encoding in (encode_body(payloads), (encode_batch_v2(payloads), ENCODING_V2)):
        merged = b"".join([body[:4], *v2_parts(body, encoding, default)])
        got = decode_batch_v2(merged, len(payloads))
        for before, after in zip(payloads, got, strict=True):
            assert isinstance(after, LogRecord)
            own = before.append_time_ms if isinstance(before, LogRecord) else 0
            assert after.append_time_ms == (own or default)
            assert after.value == (before if isinstance(before, bytes) else before.value)
