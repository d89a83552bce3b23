"""``bytes-batch-v1`` bodies and the shared ``LLS1`` WAL blob.

Decoders treat their input as hostile: every length is checked against the bytes that
are actually there before anything is allocated, and every failure is a
:class:`~app.storage.errors.CorruptData`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c

from app.errors import CorruptData

MAGIC = b"LLS1"
LLS1_VERSION = 1
_U32 = struct.Struct(">I")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_BLOB_PARTITIONS = 100_000


def crc32c(data: bytes | memoryview) -> int:
    return int(google_crc32c.value(bytes(data)))


# -- bytes-batch-v1 -------------------------------------------------------------------


def encoded_batch_size(records: Sequence[bytes]) -> int:
    return 4 + 4 * len(records) + sum(len(r) for r in records)


def encode_batch(records: Sequence[bytes]) -> bytes:
    parts: list[bytes] = [_U32.pack(len(records))]
    for record in records:
        parts.append(_U32.pack(len(record)))
        parts.append(record)
    return b"".join(parts)


def decode_batch(body: bytes | memoryview, expected_count: int | None = None) -> list[bytes]:
    """Decode one body; its lengths must add up to exactly its size."""
    view = memoryview(body)
    size = len(view)
    if size < 4:
        raise CorruptData(f"bytes-batch-v1 body of {size} bytes is shorter than its header")
    (count,) = _U32.unpack_from(view, 0)
    # Each record needs at least its 4-byte length: bound the count before allocating.
    if count > (size - 4) // 4:
        raise CorruptData(f"bytes-batch-v1 claims {count} records in {size} bytes")
    if expected_count is not None and count != expected_count:
        raise CorruptData(f"bytes-batch-v1 holds {count} records, the index says {expected_count}")
    records: list[bytes] = []
    pos = 4
    for i in range(count):
        if pos + 4 > size:
            raise CorruptData(f"bytes-batch-v1 truncated at record {i} length")
        (length,) = _U32.unpack_from(view, pos)
        pos += 4
        if length > size - pos:
            raise CorruptData(f"bytes-batch-v1 record {i} of {length} bytes overruns the body")
        records.append(bytes(view[pos:pos + length]))
        pos += length
    if pos != size:
        raise CorruptData(f"bytes-batch-v1 has {size - pos} trailing bytes")
    return records


# -- LLS1 shared blob -----------------------------------------------------------------


@dataclass(frozen=True)
class BlobPart:
    """One partition's body inside a shared blob (offsets absolute from the blob start)."""

    topic: str
    partition: int
    msg_count: int
    body_offset: int
    body_length: int
    crc32c: int
    encoding: str = "bytes-batch-v1"


def encode_shared_blob(
    groups: Sequence[tuple[str, int, Sequence[bytes]]], created_at_ms: int
) -> tuple[bytes, list[BlobPart]]:
    """Pack one body per (topic, partition, records) group into an LLS1 blob."""
    bodies = [encode_batch(records) for _, _, records in groups]
    # body_offset depends on the header length, which depends on the offsets' digits:
    # iterate until the header length is stable (at most a couple of rounds).
    header_len = 0
    while True:
        parts: list[BlobPart] = []
        pos = 8 + header_len
        for (topic, partition, records), body in zip(groups, bodies, strict=True):
            parts.append(BlobPart(topic, partition, len(records), pos, len(body), crc32c(body)))
            pos += len(body)
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
    blob = b"".join([MAGIC, _U32.pack(len(header)), header, *bodies])
    return blob, parts


def _part_to_dict(p: BlobPart) -> dict[str, Any]:
    return {
        "topic": p.topic,
        "partition": p.partition,
        "msg_count": p.msg_count,
        "encoding": p.encoding,
        "body_offset": p.body_offset,
        "body_length": p.body_length,
        "crc32c": p.crc32c,
    }


@dataclass(frozen=True)
class SharedBlobHeader:
    version: int
    created_at_ms: int
    parts: list[BlobPart]
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
    parts: list[BlobPart] = []
    for raw in header["partitions"]:
        try:
            part = BlobPart(
                topic=_typed(raw, "topic", str),
                partition=_typed(raw, "partition", int),
                msg_count=_typed(raw, "msg_count", int),
                body_offset=_typed(raw, "body_offset", int),
                body_length=_typed(raw, "body_length", int),
                crc32c=_typed(raw, "crc32c", int) if "crc32c" in raw else -1,
                encoding=raw.get("encoding", "bytes-batch-v1"),
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


def decode_shared_blob(blob: bytes | memoryview) -> list[tuple[BlobPart, list[bytes]]]:
    """Decode a whole LLS1 blob, verifying every body (audit and tools)."""
    view = memoryview(blob)
    header = decode_shared_header(view)
    out = []
    for part in header.parts:
        body = view[part.body_offset:part.body_offset + part.body_length]
        verify_body(body, part.crc32c)
        out.append((part, decode_batch(body, part.msg_count)))
    return out
