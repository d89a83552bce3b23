"""Oxia's messages in protobuf wire format, for the calls made on the event loop.

The messages are small and fixed, so they are written and read with a few lines of wire
format, after Oxia's ``client.proto`` (the ``oxia`` package's messages are pure Python and
cost more than the calls they describe):

- ``ReadRequest{shard = 1, gets = 2}``, ``GetRequest{key = 1, include_value = 2}``,
  ``ReadResponse{gets = 1}``, ``GetResponse{status = 1, version = 2, value = 3, key = 4}``,
  ``Version{version_id = 1}``;
- ``RangeScanRequest{shard = 1, start_inclusive = 2, end_exclusive = 3}``,
  ``RangeScanResponse{records = 1}`` (each a ``GetResponse``);
- ``WriteRequest{shard = 1, puts = 2}``, ``PutRequest{key = 1, value = 2,
  expected_version_id = 3, partition_key = 6}``, ``WriteResponse{puts = 1}``,
  ``PutResponse{status = 1, version = 2}``.

tests/test_oxia_reads.py and tests/test_oxia_writes.py check them byte for byte against
the package's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

OK, KEY_NOT_FOUND, UNEXPECTED_VERSION_ID = 0, 1, 2
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_INT64 = (1 << 64) - 1


class NotUnderstood(Exception):
    """An answer (or a state of the discovery) this client does not handle."""


class SendExpired(Exception):
    """A put whose ``send_by`` had passed when its request was about to go out: it was
    not sent, so it can never apply (internal to the engine, as VersionMismatch is)."""


class Found:
    """A record as a get found it."""

    __slots__ = ("key", "value", "version_id")

    def __init__(self, key: str, value: bytes, version_id: int) -> None:
        self.key, self.value, self.version_id = key, value, version_id


@dataclass(frozen=True)
class PutSpec:
    """One put of a group: ``expected_version`` None (blind), a version (CAS) or
    ``EXPECT_NOT_EXISTS`` (-1, create-if-absent).

    ``send_by``: a ``time.monotonic()`` time past which the put is not sent (answered
    :class:`SendExpired`). A commit must not start after its deadline, and a put may
    wait long between being asked for and going out (behind other requests in the
    coalescer, for a worker thread), so the deadline is checked where the request is
    sent, by whichever path sends it (:func:`in_time`)."""

    key: str
    value: bytes
    partition_key: str
    expected_version: int | None = None
    send_by: float | None = None


def in_time(puts: Sequence[PutSpec]) -> tuple[list[int], list[int | Exception]]:
    """The indexes of the puts that may be sent now (no ``send_by``, or not passed), and
    an outcome per put: :class:`SendExpired` for the others, a placeholder for these
    (the sender puts their outcomes in its place)."""
    now = time.monotonic()
    sendable = [i for i, p in enumerate(puts) if p.send_by is None or now <= p.send_by]
    late = SendExpired("not sent: its deadline to be sent had passed")
    return sendable, [late] * len(puts)


class PutOutcome:
    """What a ``PutResponse`` says: ``status`` and, when it is OK, ``version_id``."""

    __slots__ = ("status", "version_id")

    def __init__(self, status: int, version_id: int | None) -> None:
        self.status, self.version_id = status, version_id


def _varint(value: int) -> bytes:
    """A varint; a negative int64 as its two's complement, in ten bytes."""
    value &= _INT64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_get(shard: int, key: str) -> bytes:
    """``ReadRequest{shard, gets: [GetRequest{key, include_value: true}]}``."""
    get = _text(b"\x0a", key) + b"\x10\x01"
    return b"\x08" + _varint(shard) + b"\x12" + _varint(len(get)) + get


def encode_range_scan(shard: int, start: str, end: str) -> bytes:
    """``RangeScanRequest{shard, start_inclusive, end_exclusive}`` (an empty string, as
    proto3 writes it: not at all)."""
    out = b"\x08" + _varint(shard)
    for tag, text in ((b"\x12", start), (b"\x1a", end)):
        if text:
            out += _text(tag, text)
    return out


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise NotUnderstood("a varint runs past the message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)``: an int for varints and fixed-width fields, bytes for
    length-delimited ones."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, value
        elif wire == _BYTES:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise NotUnderstood("a field runs past the message")
            yield number, buf[pos:pos + length]
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if pos + width > len(buf):
                raise NotUnderstood("a field runs past the message")
            yield number, int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        else:
            raise NotUnderstood(f"wire type {wire} in an answer")


def decode_get(answer: bytes, asked: str) -> Found | None:
    """The first ``GetResponse`` of a ``ReadResponse``: the record, or None when the key
    is not found; :class:`NotUnderstood` for any other status."""
    response = next((v for n, v in _fields(answer) if n == 1 and isinstance(v, bytes)), None)
    if response is None:
        raise NotUnderstood("a ReadResponse without a GetResponse")
    return _get_response(response, asked)


def decode_range_scan(answer: bytes) -> list[Found]:
    """The records of one ``RangeScanResponse`` (a scan's answer comes in several); each
    must carry its key and be found."""
    found: list[Found] = []
    for number, field in _fields(answer):
        if number != 1 or not isinstance(field, bytes):
            continue
        record = _get_response(field, None)
        if record is None:
            raise NotUnderstood("a range scan answered a record as not found")
        found.append(record)
    return found


def _get_response(response: bytes, asked: str | None) -> Found | None:
    """One ``GetResponse``; ``asked`` is its key when it carries none (None: it must)."""
    status, value, key, version_id = OK, b"", asked, None
    for number, field in _fields(response):
        if number == 1 and isinstance(field, int):
            status = field
        elif number == 2 and isinstance(field, bytes):
            version_id = _version_id(field)
        elif number == 3 and isinstance(field, bytes):
            value = field
        elif number == 4 and isinstance(field, bytes):
            key = field.decode()
    if status == KEY_NOT_FOUND:
        return None
    if status != OK or version_id is None:
        raise NotUnderstood(f"a GetResponse with status {status}")
    if key is None:
        raise NotUnderstood("a scanned record without its key")
    return Found(key, value, version_id)


def _version_id(version: bytes) -> int:
    """``Version.version_id``: an int64, two's complement on the wire (0 when absent)."""
    value = next((v for n, v in _fields(version) if n == 1 and isinstance(v, int)), 0)
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(tag: bytes, text: str) -> bytes:
    raw = text.encode()
    return tag + _varint(len(raw)) + raw


def encode_write(shard: int, puts: Sequence[PutSpec]) -> bytes:
    """``WriteRequest{shard, puts: [PutRequest{key, value, expected_version_id,
    partition_key}]}``; the shard is always written (it is optional, so 0 is too)."""
    parts = [b"\x08", _varint(shard)]
    for put in puts:
        request = _text(b"\x0a", put.key) if put.key else b""  # proto3: "" is not written
        if put.value:
            request += b"\x12" + _varint(len(put.value)) + put.value
        if put.expected_version is not None:
            request += b"\x18" + _varint(put.expected_version)
        request += _text(b"\x32", put.partition_key)
        parts += (b"\x12", _varint(len(request)), request)
    return b"".join(parts)


def decode_write(answer: bytes) -> list[PutOutcome]:
    """The ``PutResponse`` of each put of a ``WriteResponse``, in the request's order."""
    outcomes: list[PutOutcome] = []
    for number, field in _fields(answer):
        if number != 1 or not isinstance(field, bytes):
            continue
        status, version_id = OK, None
        for inner, value in _fields(field):
            if inner == 1 and isinstance(value, int):
                status = value
            elif inner == 2 and isinstance(value, bytes):
                version_id = _version_id(value)
        if status == OK and version_id is None:
            raise NotUnderstood("a PutResponse of OK without its version")
        outcomes.append(PutOutcome(status, version_id))
    return outcomes
