"""``bytes-batch-v1`` bodies and the shared ``LLS1`` WAL blob.

Decoders treat their input as hostile: every length is checked against the bytes that
are actually there before anything is allocated, and every failure is a
:class:`~app.storage.errors.CorruptData`.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import crc32c as _crc32c

from app.errors import CorruptData
from app.storage import columnar
from app.storage.compression import (
    NO_COMPRESSION,
    Codec,
    Compression,
    compress,
    decompress,
    parse_codec,
)
from app.storage.log_record import LogRecord, Payload

MAGIC = b"LLS1"
LLS1_VERSION = 1
_U32 = struct.Struct(">I")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_BLOB_PARTITIONS = 100_000
# No writer makes a body larger than this (the ceiling of LLOG_BATCH_MAX_BYTES and of
# LLOG_MAX_REQUEST_BYTES): a stored body that says it decompresses to more is corrupt.
MAX_RAW_BODY_BYTES = 1024 * 1024 * 1024


def crc32c(data: bytes | memoryview, value: int = 0) -> int:
    """CRC-32C of ``data`` (continuing from ``value``); reads views without copying."""
    return int(_crc32c.crc32c(data, value))


# -- bytes-batch-v1 -------------------------------------------------------------------

ENCODING_V1 = "bytes-batch-v1"
ENCODING_V2 = "bytes-batch-v2"
ENCODING_V3 = columnar.ENCODING_V3
ENCODINGS = (ENCODING_V1, ENCODING_V2, ENCODING_V3)
# COMPACTED entries only: a count, then bytes-batch-v3 bodies back to back, one per row
# of the entry's chunk table (docs/protocol.md, Encodings).
ENCODING_V3_CHUNKED = "bytes-batch-v3-chunked"
ENTRY_ENCODINGS = (*ENCODINGS, ENCODING_V3_CHUNKED)


def encoded_batch_size(records: Sequence[bytes]) -> int:
    return 4 + 4 * len(records) + sum(len(r) for r in records)


def encode_batch(records: Sequence[bytes]) -> bytes:
    parts: list[bytes] = [_U32.pack(len(records))]
    for record in records:
        parts.append(_U32.pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def _batch_count(view: memoryview, name: str, expected_count: int | None,
                 min_record: int) -> int:
    """The record count of a body, bounded by what its bytes can hold."""
    size = len(view)
    if size < 4:
        raise CorruptData(f"{name} body of {size} bytes is shorter than its header")
    (count,) = _U32.unpack_from(view, 0)
    # Each record needs at least its fixed fields: bound the count before allocating.
    if count > (size - 4) // min_record:
        raise CorruptData(f"{name} claims {count} records in {size} bytes")
    if expected_count is not None and count != expected_count:
        raise CorruptData(f"{name} holds {count} records, the index says {expected_count}")
    return int(count)


def decode_records_v1(view: memoryview, pos: int, end: int, count: int
                      ) -> tuple[list[bytes], int]:
    """``count`` records from ``pos`` (never reading at or past ``end``); next position."""
    records: list[bytes] = []
    for i in range(count):
        if pos + 4 > end:
            raise CorruptData(f"bytes-batch-v1 truncated at record {i} length")
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        if length > end - pos:
            raise CorruptData(f"bytes-batch-v1 record {i} of {length} bytes overruns the body")
        records.append(bytes(view[pos:pos + length]))
        pos += length
    return records, pos


def decode_batch(body: bytes | memoryview, expected_count: int | None = None) -> list[bytes]:
    """Decode one bytes-batch-v1 body; its lengths must add up to exactly its size."""
    view = memoryview(body)
    count = _batch_count(view, ENCODING_V1, expected_count, 4)
    records, pos = decode_records_v1(view, 4, len(view), count)
    if pos != len(view):
        raise CorruptData(f"bytes-batch-v1 has {len(view) - pos} trailing bytes")
    return records


# -- bytes-batch-v2 -------------------------------------------------------------------

_V2_HEAD = struct.Struct(">IBq")  # length, attributes, append_time_ms
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
ATTR_KEY, ATTR_HEADERS, ATTR_TIMESTAMP = 0x01, 0x02, 0x04
_KNOWN_ATTRS = ATTR_KEY | ATTR_HEADERS | ATTR_TIMESTAMP
MAX_HEADERS = 0xFFFF


def _record_v2(payload: Payload) -> bytes:
    if isinstance(payload, bytes):
        return _V2_HEAD.pack(9 + len(payload), 0, 0) + payload
    attrs, fields = 0, []
    if payload.timestamp_ms is not None:
        attrs |= ATTR_TIMESTAMP
        fields.append(_I64.pack(payload.timestamp_ms))
    if payload.key is not None:
        attrs |= ATTR_KEY
        fields += [_U32.pack(len(payload.key)), payload.key]
    if payload.headers:
        attrs |= ATTR_HEADERS
        fields.append(_U16.pack(len(payload.headers)))
        for name, value in payload.headers:
            raw = name.encode()
            fields += [_U16.pack(len(raw)), raw, _U32.pack(len(value)), value]
    rest = b"".join([*fields, payload.value])
    return _V2_HEAD.pack(9 + len(rest), attrs, payload.append_time_ms) + rest


def encode_batch_v2(payloads: Sequence[Payload]) -> bytes:
    return b"".join([_U32.pack(len(payloads)), *(_record_v2(p) for p in payloads)])


def _number(view: memoryview, pos: int, end: int, field: struct.Struct, what: str
            ) -> tuple[int, int]:
    if pos + field.size > end:
        raise CorruptData(f"bytes-batch-v2 {what} overruns its record")
    return int(field.unpack_from(view, pos)[0]), pos + field.size


def _bytes(view: memoryview, pos: int, end: int, length: int, what: str
           ) -> tuple[bytes, int]:
    if length > end - pos:
        raise CorruptData(f"bytes-batch-v2 {what} overruns its record")
    return bytes(view[pos:pos + length]), pos + length


def _decode_v2_fields(view: memoryview, pos: int, end: int, attrs: int, append_time: int
                      ) -> LogRecord:
    """The fields after a record's fixed head, up to ``end`` (the record's end)."""
    timestamp = key = None
    headers: list[tuple[str, bytes]] = []
    if attrs & ATTR_TIMESTAMP:
        timestamp, pos = _number(view, pos, end, _I64, "timestamp")
    if attrs & ATTR_KEY:
        length, pos = _number(view, pos, end, _U32, "key length")
        key, pos = _bytes(view, pos, end, length, "key")
    if attrs & ATTR_HEADERS:
        count, pos = _number(view, pos, end, _U16, "header count")
        for _ in range(count):
            length, pos = _number(view, pos, end, _U16, "header name length")
            raw, pos = _bytes(view, pos, end, length, "header name")
            length, pos = _number(view, pos, end, _U32, "header value length")
            value, pos = _bytes(view, pos, end, length, "header value")
            try:
                headers.append((raw.decode(), value))
            except UnicodeDecodeError:
                raise CorruptData("bytes-batch-v2 header name is not UTF-8") from None
    return LogRecord(bytes(view[pos:end]), key, tuple(headers), timestamp, append_time)


def decode_records_v2(view: memoryview, pos: int, end: int, count: int
                      ) -> tuple[list[Payload], int]:
    """``count`` records from ``pos`` (never reading at or past ``end``); next position.
    A record with nothing but a value (and no append time of its own) is plain bytes."""
    records: list[Payload] = []
    for i in range(count):
        if pos + _V2_HEAD.size > end:
            raise CorruptData(f"bytes-batch-v2 truncated at record {i}")
        length, attrs, append_time = _V2_HEAD.unpack_from(view, pos)
        record_end = pos + 4 + length
        if length < 9 or record_end > end:
            raise CorruptData(f"bytes-batch-v2 record {i} of {length} bytes overruns the body")
        if attrs & ~_KNOWN_ATTRS:
            raise CorruptData(f"bytes-batch-v2 record {i} has unknown attributes {attrs:#x}")
        body = pos + _V2_HEAD.size
        if attrs == 0:
            value = bytes(view[body:record_end])
            records.append(LogRecord(value, append_time_ms=append_time) if append_time
                           else value)
        else:
            records.append(_decode_v2_fields(view, body, record_end, attrs, append_time))
        pos = record_end
    return records, pos


def decode_batch_v2(body: bytes | memoryview, expected_count: int | None = None
                    ) -> list[Payload]:
    view = memoryview(body)
    count = _batch_count(view, ENCODING_V2, expected_count, _V2_HEAD.size)
    records, pos = decode_records_v2(view, 4, len(view), count)
    if pos != len(view):
        raise CorruptData(f"bytes-batch-v2 has {len(view) - pos} trailing bytes")
    return records


def v2_parts(body: bytes | memoryview, encoding: str, append_time_ms: int
             ) -> list[bytes | memoryview]:
    """The records of a decoded-valid ``body`` as bytes-batch-v2 record bytes (without
    the count), each carrying its append time: its own, or ``append_time_ms`` for one
    that has none (every bytes-batch-v1 record). Record bytes are not copied."""
    if encoding in (ENCODING_V3, ENCODING_V3_CHUNKED):  # re-encoded record by record
        bodies = (chunked_bodies(body) if encoding == ENCODING_V3_CHUNKED
                  else [columnar.read_columns(body)])
        timed = [p if isinstance(p, bytes) or p.append_time_ms else
                 dataclasses.replace(p, append_time_ms=append_time_ms)
                 for c in bodies for p in columnar.decode(c)]
        return [_V2_HEAD.pack(9 + len(p), 0, append_time_ms) + p if isinstance(p, bytes)
                else _record_v2(p) for p in timed]
    view = memoryview(body)
    (count,) = _U32.unpack_from(view, 0)
    parts: list[bytes | memoryview] = []
    pos = 4
    for _ in range(count):
        (length,) = _U32.unpack_from(view, pos)
        if encoding == ENCODING_V1:
            parts += [_V2_HEAD.pack(9 + length, 0, append_time_ms),
                      view[pos + 4:pos + 4 + length]]
        else:
            _, attrs, own = _V2_HEAD.unpack_from(view, pos)
            parts += [_V2_HEAD.pack(length, attrs, own or append_time_ms),
                      view[pos + _V2_HEAD.size:pos + 4 + length]]
        pos += 4 + length
    return parts


# -- by encoding ----------------------------------------------------------------------


def encode_body(payloads: Sequence[Payload]) -> tuple[bytes, str]:
    """The body for ``payloads``: bytes-batch-v1 when every record is plain bytes (as
    readers of every release expect), bytes-batch-v2 otherwise."""
    if all(isinstance(p, bytes) for p in payloads):
        return encode_batch(payloads), ENCODING_V1  # type: ignore[arg-type]
    return encode_batch_v2(payloads), ENCODING_V2


def chunked_bodies(body: bytes | memoryview, expected_count: int | None = None
                   ) -> list[columnar.Columns]:
    """The checked bytes-batch-v3 bodies of a bytes-batch-v3-chunked body, in order."""
    view = memoryview(body)
    if len(view) < 4:
        raise CorruptData("bytes-batch-v3-chunked body is shorter than its count")
    (total,) = _U32.unpack_from(view, 0)
    if expected_count is not None and total != expected_count:
        raise CorruptData(f"bytes-batch-v3-chunked holds {total} records, the index says "
                          f"{expected_count}")
    out: list[columnar.Columns] = []
    pos, seen = 4, 0
    while pos < len(view):
        end = columnar.body_end(view, pos)
        out.append(columnar.read_columns(view, pos, end))
        seen += out[-1].count
        pos = end
    if seen != total:
        raise CorruptData(f"bytes-batch-v3-chunked bodies hold {seen} records, its count "
                          f"says {total}")
    return out


def decode_body(body: bytes | memoryview, encoding: str,
                expected_count: int | None = None) -> list[Payload]:
    if encoding == ENCODING_V1:
        return list(decode_batch(body, expected_count))
    if encoding == ENCODING_V2:
        return list(decode_batch_v2(body, expected_count))
    if encoding == ENCODING_V3:
        return columnar.decode(columnar.read_columns(body) if expected_count is None
                               else columnar.read_counted(body, expected_count))
    if encoding == ENCODING_V3_CHUNKED:
        return [p for c in chunked_bodies(body, expected_count) for p in columnar.decode(c)]
    raise CorruptData(f"encoding {encoding!r} is not one this release reads "
                      f"{ENTRY_ENCODINGS}")


def decode_records(view: memoryview, pos: int, end: int, count: int, encoding: str
                   ) -> tuple[list[Payload], int]:
    """``count`` records of a body area in ``encoding``: a body without its count (a
    chunk of a compacted body, or a tail-cache segment). A bytes-batch-v3 area runs to
    ``end``."""
    if encoding == ENCODING_V1:
        v1, pos = decode_records_v1(view, pos, end, count)
        return list(v1), pos
    if encoding == ENCODING_V2:
        v2, pos = decode_records_v2(view, pos, end, count)
        return list(v2), pos
    if encoding == ENCODING_V3:
        return columnar.decode(columnar.read_columns(view, pos, end, count)), end
    raise CorruptData(f"encoding {encoding!r} is not one this release reads {ENCODINGS}")


# -- LLS1 shared blob -----------------------------------------------------------------


@dataclass(frozen=True)
class SliceEntry:
    """One partition's body inside a shared blob (offsets absolute from the blob start).
    ``body_length`` and ``crc32c`` describe the stored bytes; compressed (``codec``),
    they decompress to ``raw_length`` bytes of ``encoding``."""

    topic: str
    partition: int
    msg_count: int
    body_offset: int
    body_length: int
    crc32c: int
    encoding: str = ENCODING_V1
    codec: Codec = Codec.NONE
    raw_length: int | None = None


def encode_shared_blob(
    groups: Sequence[tuple[str, int, Sequence[Payload]]], created_at_ms: int
) -> tuple[bytes, list[SliceEntry]]:
    """Pack one body per (topic, partition, records) group into an LLS1 blob (the
    encodings of releases before bytes-batch-v3: tools and tests)."""
    bodies = []
    for topic, partition, records in groups:
        body, encoding = encode_body(records)
        bodies.append(SliceBody(topic, partition, [body], encoding, len(records)))
    return pack_shared_blob(bodies, created_at_ms)


@dataclass(frozen=True)
class SliceBody:
    """One partition's body for a shared blob, as parts to be joined, and how it is to
    be stored (compressed when that pays: :func:`~app.storage.compression.compress`)."""

    topic: str
    partition: int
    parts: Sequence[bytes | memoryview]
    encoding: str
    count: int
    compression: Compression = NO_COMPRESSION


@dataclass(frozen=True)
class _Stored:
    parts: Sequence[bytes | memoryview]
    size: int
    crc32c: int
    codec: Codec
    raw_length: int | None


def _stored(body: SliceBody) -> _Stored:
    """A body as it goes into the blob: compressed if its setting says so and that
    pays, and the CRC32C of those stored bytes."""
    parts, used, raw_length = body.parts, Codec.NONE, None
    if body.compression.codec is not Codec.NONE:
        raw = b"".join(body.parts)
        used, packed = compress(raw, body.compression)
        if used is not Codec.NONE:
            parts, raw_length = [packed], len(raw)
    crc, size = 0, 0
    for part in parts:
        crc = crc32c(part, crc)
        size += len(part)
    return _Stored(parts, size, crc, used, raw_length)


def compresses(bodies: Sequence[SliceBody]) -> bool:
    """Whether packing ``bodies`` compresses any (a writer does that in a worker
    thread, off the event loop)."""
    return any(b.compression.codec is not Codec.NONE for b in bodies)


def pack_shared_blob(bodies: Sequence[SliceBody], created_at_ms: int
                     ) -> tuple[bytes, list[SliceEntry]]:
    """The LLS1 blob of ``bodies``: their parts are copied once, into the blob (or
    compressed into it)."""
    parts, entries = pack_shared_parts(bodies, created_at_ms)
    return b"".join(parts), entries


def pack_shared_parts(bodies: Sequence[SliceBody], created_at_ms: int
                      ) -> tuple[list[bytes | memoryview], list[SliceEntry]]:
    """The LLS1 blob of ``bodies`` as the parts it is made of, in order: its head, then
    each body's parts as they are (views into the requests they came in, or a body
    compressed), for an upload that writes them without joining them first."""
    stored = [_stored(b) for b in bodies]
    # body_offset depends on the header length, which depends on the offsets' digits:
    # iterate until the header length is stable (at most a couple of rounds).
    header_len = 0
    while True:
        parts: list[SliceEntry] = []
        pos = 8 + header_len
        for b, st in zip(bodies, stored, strict=True):
            parts.append(SliceEntry(b.topic, b.partition, b.count, pos, st.size, st.crc32c,
                                  b.encoding, st.codec, st.raw_length))
            pos += st.size
        header = json.dumps(
            {
                "version": LLS1_VERSION,
                "created_at_ms": created_at_ms,
                "partitions": [_part_to_dict(p) for p in parts],
            },
            separators=(",", ":"),
        ).encode()
        if len(header) == header_len:
            break
        header_len = len(header)
    return [MAGIC + _U32.pack(len(header)) + header,
            *(part for st in stored for part in st.parts)], parts


def _part_to_dict(p: SliceEntry) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": p.topic,
        "partition": p.partition,
        "msg_count": p.msg_count,
        "encoding": p.encoding,
        "body_offset": p.body_offset,
        "body_length": p.body_length,
        "crc32c": p.crc32c,
    }
    if p.codec is not Codec.NONE:  # absent: stored raw (what every release reads)
        out["codec"] = p.codec.value
        out["raw_length"] = p.raw_length
    return out


@dataclass(frozen=True)
class SharedBlobHeader:
    version: int
    created_at_ms: int
    parts: list[SliceEntry]
    header_end: int


def decode_shared_header(blob: bytes | memoryview) -> SharedBlobHeader:
    """Parse and validate an LLS1 header against the blob's actual size."""
    view = memoryview(blob)
    size = len(view)
    if size < 8 or bytes(view[:4]) != MAGIC:
        raise CorruptData("not an LLS1 blob (bad magic or too short)")
    (header_len,) = _U32.unpack_from(view, 4)
    if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
        raise CorruptData(f"LLS1 header length {header_len} exceeds the blob ({size} bytes)")
    try:
        header = json.loads(bytes(view[8:8 + header_len]))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CorruptData(f"LLS1 header is not JSON: {exc!s:.200}") from None
    if not isinstance(header, dict) or not isinstance(header.get("partitions"), list):
        raise CorruptData("LLS1 header lacks a partitions list")
    version = _typed(header, "version", int)
    if version != LLS1_VERSION:
        raise CorruptData(f"LLS1 version {version} is not one this release reads "
                          f"({LLS1_VERSION})")
    if len(header["partitions"]) > MAX_BLOB_PARTITIONS:
        raise CorruptData("LLS1 header lists too many partitions")
    header_end = 8 + header_len
    parts: list[SliceEntry] = []
    for raw in header["partitions"]:
        try:
            part = SliceEntry(
                topic=_typed(raw, "topic", str),
                partition=_typed(raw, "partition", int),
                msg_count=_typed(raw, "msg_count", int),
                body_offset=_typed(raw, "body_offset", int),
                body_length=_typed(raw, "body_length", int),
                crc32c=_typed(raw, "crc32c", int) if "crc32c" in raw else -1,
                encoding=raw.get("encoding", "bytes-batch-v1"),
                codec=parse_codec(raw.get("codec")),
                raw_length=_typed(raw, "raw_length", int) if "raw_length" in raw else None,
            )
        except (TypeError, AttributeError) as exc:
            raise CorruptData(f"LLS1 header entry is malformed: {exc}") from None
        if part.body_offset < header_end or part.body_length < 4 or (
            part.body_offset + part.body_length > size
        ):
            raise CorruptData(
                f"LLS1 body of {part.topic}:{part.partition} lies outside the blob"
            )
        parts.append(part)
    return SharedBlobHeader(
        version=version,
        created_at_ms=_typed(header, "created_at_ms", int) if "created_at_ms" in header else 0,
        parts=parts,
        header_end=header_end,
    )


def _typed(raw: Any, name: str, kind: type) -> Any:
    value = raw.get(name) if isinstance(raw, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CorruptData(f"LLS1 header field {name!r} is missing or not {kind.__name__}")
    return value


def verify_body(body: bytes | memoryview, expected_crc32c: int | None) -> None:
    """Check a body against the CRC32C recorded for it (skipped when none was recorded)."""
    if expected_crc32c is None or expected_crc32c < 0:
        return
    actual = crc32c(body)
    if actual != expected_crc32c:
        raise CorruptData(f"crc32c mismatch: stored {expected_crc32c:#010x}, read {actual:#010x}")


def raw_body(stored: bytes | memoryview, expected_crc32c: int | None, codec: object,
             raw_length: object) -> bytes | memoryview:
    """The body of a stored WAL slice, as its index entry or LLS1 header entry
    describes it: ``stored`` verified against ``expected_crc32c`` (which covers the
    stored bytes), then, when ``codec`` names one, decompressed to exactly
    ``raw_length`` bytes (never more than :data:`MAX_RAW_BODY_BYTES`). Every failure is
    :class:`CorruptData`; an uncompressed body is returned as it is."""
    verify_body(stored, expected_crc32c)
    used = parse_codec(codec)
    if used is Codec.NONE:
        return stored
    if (not isinstance(raw_length, int) or isinstance(raw_length, bool)
            or not 4 <= raw_length <= MAX_RAW_BODY_BYTES):
        raise CorruptData(f"a {used.value} body with raw_length {raw_length!r}")
    raw = decompress(used, stored, max_size=raw_length)
    if len(raw) != raw_length:
        raise CorruptData(f"a {used.value} body decodes to {len(raw)} bytes, its entry "
                          f"says {raw_length}")
    return raw


def decode_shared_blob(blob: bytes | memoryview) -> list[tuple[SliceEntry, list[Payload]]]:
    """Decode a whole LLS1 blob, verifying every body (audit and tools)."""
    view = memoryview(blob)
    header = decode_shared_header(view)
    out = []
    for part in header.parts:
        stored = view[part.body_offset:part.body_offset + part.body_length]
        body = raw_body(stored, part.crc32c, part.codec, part.raw_length)
        out.append((part, decode_body(body, part.encoding, part.msg_count)))
    return out
