"""On-disk formats of the file tail cache: immutable segments and the high-watermark file.

Both are written whole to a temporary name and renamed into place, so a reader sees
either the complete old file, the complete new one, or nothing. The formats still carry
everything needed to verify a file on their own -- magic, version, the topic-partition,
the offsets and a CRC32C over every preceding byte -- because files can also be torn by
crashes of the machine (the rename is not fsynced), truncated or damaged by hand, or
be a stranger's file in the wrong place (a case-insensitive filesystem folding two topic
names onto one directory). A decoder treats its input as hostile and answers ``None``
for anything it cannot prove right; the cache then misses.

Segment layout (big-endian)::

    magic "LTC1" | version u8 (2) | encoding u8 | topic length u16 | partition u32
    | start offset u64 | record count u32 | append time ms u64 | topic bytes
    | records | crc32c u32 of everything before it

``records`` are a bytes-batch body in the named encoding (0: bytes-batch-v1, 1:
bytes-batch-v2, 2: bytes-batch-v3; see docs/protocol.md), without its count: the same
bytes and the same decoder as the log (a batch that arrives encoded is stored as it
is). Version 1 segments (no encoding, no append time) are not read: they are misses.

High-watermark layout::

    magic "LTHW" | version u8 | reserved u8 | topic length u16 | partition u32
    | high watermark u64 | topic bytes | crc32c u32 of everything before it
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

from app.errors import CorruptData
from app.storage.batch import RecordBatch
from app.storage.codec import (
    ENCODING_V1,
    ENCODING_V2,
    ENCODING_V3,
    crc32c,
    decode_records,
    encode_body,
)
from app.storage.keys import OFFSET_DIGITS, TopicPartition
from app.storage.log_record import Payload

SEGMENT_MAGIC = b"LTC1"
HW_MAGIC = b"LTHW"
VERSION = 2
HW_VERSION = 1
_SEGMENT_HEAD = struct.Struct(">4sBBHIQIQ")
_ENCODINGS = (ENCODING_V1, ENCODING_V2, ENCODING_V3)
_HW_HEAD = struct.Struct(">4sBBHIQ")
_U32 = struct.Struct(">I")
_CRC = 4
SEGMENT_SUFFIX = ".seg"
_SEGMENT_NAME = re.compile(rf"([0-9]{{{OFFSET_DIGITS}}})-([0-9]{{{OFFSET_DIGITS}}})\.seg")


def segment_name(start: int, end: int) -> str:
    """File name of the segment holding offsets ``start..end`` (inclusive)."""
    return f"{start:0{OFFSET_DIGITS}d}-{end:0{OFFSET_DIGITS}d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    """``(start, end)`` of a segment file name, or None for any other file."""
    m = _SEGMENT_NAME.fullmatch(name)
    if m is None:
        return None
    start, end = int(m.group(1)), int(m.group(2))
    return (start, end) if 1 <= start <= end else None


def segment_overhead(tp: TopicPartition) -> int:
    """Bytes of a segment that are not record bytes, apart from 4 per record (13 in
    bytes-batch-v2, plus keys and headers)."""
    return _SEGMENT_HEAD.size + len(tp.topic.encode()) + _CRC


def encode_segment(tp: TopicPartition, start: int, records: Sequence[Payload],
                   append_time_ms: int) -> bytes:
    return b"".join(segment_parts(tp, start, records, append_time_ms))


def segment_parts(tp: TopicPartition, start: int, records: Sequence[Payload],
                  append_time_ms: int) -> list[bytes | memoryview]:
    """The bytes of a segment as parts to write in order (the records' body is not
    copied: a file is written with one ``writev``)."""
    topic = tp.topic.encode()
    if isinstance(records, RecordBatch):
        body, encoding = records.body, records.encoding
    else:
        body, encoding = encode_body(records)
    head = _SEGMENT_HEAD.pack(SEGMENT_MAGIC, VERSION, _ENCODINGS.index(encoding), len(topic),
                              tp.partition, start, len(records), append_time_ms)
    lead = head + topic
    rest = memoryview(body)[4:]
    return [lead, rest, _U32.pack(crc32c(rest, crc32c(lead)))]


def decode_segment(data: bytes, tp: TopicPartition, start: int, end: int
                   ) -> tuple[list[Payload], int] | None:
    """The records and append time of a segment expected to hold ``tp`` at
    ``start..end``, or None.

    The CRC is checked before any length is trusted, and every length is checked against
    the bytes actually present by the log's own decoder.
    """
    size = len(data)
    head = _SEGMENT_HEAD.size
    if size < head + _CRC:
        return None
    magic, version, encoding, topic_len, partition, first, count, appended = (
        _SEGMENT_HEAD.unpack_from(data, 0))
    if (magic != SEGMENT_MAGIC or version != VERSION or encoding >= len(_ENCODINGS)
            or partition != tp.partition or first != start or count != end - start + 1):
        return None
    records_at = head + topic_len
    if records_at + _CRC > size or data[head:records_at] != tp.topic.encode():
        return None
    (stored_crc,) = _U32.unpack_from(data, size - _CRC)
    if crc32c(memoryview(data)[: size - _CRC]) != stored_crc:
        return None
    try:
        records, pos = decode_records(memoryview(data), records_at, size - _CRC, count,
                                      _ENCODINGS[encoding])
    except CorruptData:
        return None
    return (records, int(appended)) if pos == size - _CRC else None


def encode_high_watermark(tp: TopicPartition, high_watermark: int) -> bytes:
    topic = tp.topic.encode()
    body = _HW_HEAD.pack(HW_MAGIC, HW_VERSION, 0, len(topic), tp.partition,
                         high_watermark) + topic
    return body + _U32.pack(crc32c(body))


def decode_high_watermark(data: bytes, tp: TopicPartition) -> int | None:
    """The high watermark stored for ``tp``, or None if the file is not a valid one."""
    size = len(data)
    topic = tp.topic.encode()
    if size != _HW_HEAD.size + len(topic) + _CRC:
        return None
    magic, version, _, topic_len, partition, hw = _HW_HEAD.unpack_from(data, 0)
    if (magic != HW_MAGIC or version != HW_VERSION or topic_len != len(topic)
            or partition != tp.partition or data[_HW_HEAD.size:size - _CRC] != topic):
        return None
    (stored_crc,) = _U32.unpack_from(data, size - _CRC)
    if crc32c(memoryview(data)[: size - _CRC]) != stored_crc:
        return None
    return int(hw)
