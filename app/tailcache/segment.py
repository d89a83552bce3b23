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

    magic "LTC1" | version u8 | reserved u8 | topic length u16 | partition u32
    | start offset u64 | record count u32 | topic bytes | count x length u32
    | record bytes | crc32c u32 of everything before it

High-watermark layout::

    magic "LTHW" | version u8 | reserved u8 | topic length u16 | partition u32
    | high watermark u64 | topic bytes | crc32c u32 of everything before it
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

from app.storage.codec import crc32c
from app.storage.keys import OFFSET_DIGITS, TopicPartition

SEGMENT_MAGIC = b"LTC1"
HW_MAGIC = b"LTHW"
VERSION = 1
_SEGMENT_HEAD = struct.Struct(">4sBBHIQI")
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
    """Bytes of a segment that are not record bytes, apart from 4 per record."""
    return _SEGMENT_HEAD.size + len(tp.topic.encode()) + _CRC


def encode_segment(tp: TopicPartition, start: int, records: Sequence[bytes]) -> bytes:
    topic = tp.topic.encode()
    parts = [
        _SEGMENT_HEAD.pack(SEGMENT_MAGIC, VERSION, 0, len(topic), tp.partition, start,
                           len(records)),
        topic,
        b"".join(_U32.pack(len(r)) for r in records),
        *records,
    ]
    body = b"".join(parts)
    return body + _U32.pack(crc32c(body))


def decode_segment(data: bytes, tp: TopicPartition, start: int, end: int) -> list[bytes] | None:
    """The records of a segment expected to hold ``tp`` at ``start..end``, or None.

    Every length is checked against the bytes actually present before it is used, and
    the CRC is checked before any record is trusted.
    """
    size = len(data)
    head = _SEGMENT_HEAD.size
    if size < head + _CRC:
        return None
    magic, version, _, topic_len, partition, first, count = _SEGMENT_HEAD.unpack_from(data, 0)
    if (magic != SEGMENT_MAGIC or version != VERSION or partition != tp.partition
            or first != start or count != end - start + 1):
        return None
    lengths_at = head + topic_len
    values_at = lengths_at + 4 * count
    if values_at + _CRC > size or data[head:lengths_at] != tp.topic.encode():
        return None
    (stored_crc,) = _U32.unpack_from(data, size - _CRC)
    if crc32c(memoryview(data)[: size - _CRC]) != stored_crc:
        return None
    lengths = struct.unpack_from(f">{count}I", data, lengths_at)
    if values_at + sum(lengths) + _CRC != size:
        return None
    records: list[bytes] = []
    pos = values_at
    for length in lengths:
        records.append(data[pos:pos + length])
        pos += length
    return records


def encode_high_watermark(tp: TopicPartition, high_watermark: int) -> bytes:
    topic = tp.topic.encode()
    body = _HW_HEAD.pack(HW_MAGIC, VERSION, 0, len(topic), tp.partition, high_watermark) + topic
    return body + _U32.pack(crc32c(body))


def decode_high_watermark(data: bytes, tp: TopicPartition) -> int | None:
    """The high watermark stored for ``tp``, or None if the file is not a valid one."""
    size = len(data)
    topic = tp.topic.encode()
    if size != _HW_HEAD.size + len(topic) + _CRC:
        return None
    magic, version, _, topic_len, partition, hw = _HW_HEAD.unpack_from(data, 0)
    if (magic != HW_MAGIC or version != VERSION or topic_len != len(topic)
            or partition != tp.partition or data[_HW_HEAD.size:size - _CRC] != topic):
        return None
    (stored_crc,) = _U32.unpack_from(data, size - _CRC)
    if crc32c(memoryview(data)[: size - _CRC]) != stored_crc:
        return None
    return int(hw)
