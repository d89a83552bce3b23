"""The chunk table of a compacted blob: how a reader fetches part of it.

A compacted blob is one bytes-batch-v1 body of up to ``LLOG_COMPACTION_MAX_BYTES``. So
that a consumer catching up through it fetches only what it asks for (and no request
holds a whole object in memory), its COMPACTED index entry carries a sparse table of
record-aligned chunks::

    "object_bytes": 67108864,
    "chunks": [[0, 4, 3735928559], [4211, 1048612, 1234567890], ...]

Each row is ``[first_record, byte_offset, crc32c]``: the chunk starts with the record of
that index in the body (0-based) at that absolute byte offset, and ends where the next
row starts (the last one at ``object_bytes`` and ``msg_count``). ``crc32c`` covers the
chunk's bytes, which are the body's records exactly as in the body (each starts with
its u32 length in both encodings). The first chunk starts at byte 4, after the body's
record count. A bytes-batch-v2 body's rows have a fourth column: the append time of the
chunk's first record, so a lookup by time finds the chunk without reading the others.

An entry with ``"codec": "zstd"`` stores every chunk as one zstd frame of its own (after
the raw 4-byte record count), so a chunk is still fetched and decoded alone: the rows'
offsets and ``crc32c`` then describe the *stored* (compressed) bytes, which are verified
before they are decompressed, and ``object_bytes`` is the stored object's size. The
codec is decided for the whole object (the compactor stores it raw when compressing it
would not pay), so a zstd entry never holds a raw chunk: a frame of data that does not
compress holds it in raw blocks, a few bytes more.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import CorruptData
from app.storage import codec, columnar
from app.storage.batch import RecordBatch
from app.storage.compression import Codec, decompress
from app.storage.log_record import Payload

_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
DEFAULT_CHUNK_BYTES = 1024 * 1024
MAX_CHUNKS = 1024  # bounds the index entry: about 30 bytes of JSON per row
# The most bytes a compressed chunk may decompress to: the compactor compresses no chunk
# larger (a chunk is about LLOG_COMPACTION_CHUNK_BYTES plus one record), and a reader
# refuses a frame that declares or yields more before allocating it.
MAX_CHUNK_RAW_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    """Records ``[first_record, end_record)`` at bytes ``[byte_offset, byte_end)``."""

    first_record: int
    end_record: int
    byte_offset: int
    byte_end: int
    crc32c: int
    first_append_ms: int | None = None


def chunk_table(body: bytes | memoryview, target_bytes: int = DEFAULT_CHUNK_BYTES, *,
                encoding: str = codec.ENCODING_V1) -> list[list[int]]:
    """Rows for a decoded-valid ``body``, about ``target_bytes`` each."""
    view = memoryview(body)
    (count,) = _U32.unpack_from(view, 0)
    target = max(target_bytes, len(view) // MAX_CHUNKS + 1)
    timed = encoding == codec.ENCODING_V2
    rows: list[list[int]] = []
    start_pos, start_rec, pos = 4, 0, 4

    def row(end: int) -> list[int]:
        out = [start_rec, start_pos, codec.crc32c(view[start_pos:end])]
        if timed:
            out.append(_I64.unpack_from(view, start_pos + 5)[0])  # after length, attrs
        return out

    for i in range(count):
        if pos - start_pos >= target:
            rows.append(row(pos))
            start_pos, start_rec = pos, i
        (length,) = _U32.unpack_from(view, pos)
        pos += 4 + length
    rows.append(row(pos))
    return rows


def parse_chunks(rows: object, msg_count: int, object_bytes: int) -> list[Chunk]:
    """Validated chunks of an index entry; :class:`CorruptData` if the table is wrong."""
    if not isinstance(rows, list) or not rows or len(rows) > MAX_CHUNKS:
        raise CorruptData("chunk table is not a non-empty list of at most "
                          f"{MAX_CHUNKS} rows")
    parsed: list[tuple[int, int, int, int | None]] = []
    for row in rows:
        if (not isinstance(row, list) or len(row) not in (3, 4)
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in row)):
            raise CorruptData(f"chunk table row {row!r} is not [record, offset, crc32c"
                              "(, append time)]")
        parsed.append((row[0], row[1], row[2], row[3] if len(row) == 4 else None))
    out: list[Chunk] = []
    for i, (first, offset, crc, appended) in enumerate(parsed):
        end_rec, end_pos = (parsed[i + 1][0], parsed[i + 1][1]) if i + 1 < len(parsed) else (
            msg_count, object_bytes)
        if not (0 <= first < end_rec <= msg_count and 4 <= offset < end_pos <= object_bytes):
            raise CorruptData(f"chunk table row {i} does not fit the object")
        out.append(Chunk(first, end_rec, offset, end_pos, crc, appended))
    if out[0].first_record != 0 or out[0].byte_offset != 4:
        raise CorruptData("chunk table does not start at the first record")
    return out


def chunk_index(chunks: Sequence[Chunk], record: int) -> int:
    """Index of the chunk holding record number ``record`` (0-based in the body)."""
    return bisect.bisect_right([c.first_record for c in chunks], record) - 1


def chunk_bytes(stored: bytes | memoryview, chunk: Chunk, stored_codec: Codec
                ) -> bytes | memoryview:
    """A chunk's raw bytes from its stored ones: verified against its checksum first,
    then decompressed (at most :data:`MAX_CHUNK_RAW_BYTES`); raw ones as they are."""
    codec.verify_body(stored, chunk.crc32c)
    if stored_codec is Codec.NONE:
        return stored
    return decompress(stored_codec, stored, max_size=MAX_CHUNK_RAW_BYTES)


def chunk_records(stored: bytes | memoryview, chunk: Chunk, encoding: str,
                  stored_codec: Codec = Codec.NONE) -> Sequence[Payload]:
    """The records of one chunk's stored bytes, verified against its checksum; a
    bytes-batch-v3 chunk stays in its columns (decoded on first use)."""
    data = chunk_bytes(stored, chunk, stored_codec)
    count = chunk.end_record - chunk.first_record
    if encoding == codec.ENCODING_V3_CHUNKED:  # each chunk is a whole bytes-batch-v3 body
        return RecordBatch.of_columns(data, columnar.read_counted(data, count))
    if encoding != columnar.ENCODING_V3:
        view = memoryview(data)
        records, pos = codec.decode_records(view, 0, len(view), count, encoding)
        if pos != len(view):
            raise CorruptData(f"chunk has {len(view) - pos} trailing bytes")
        return records
    layout = columnar.read_columns(data, 0, len(data), count)
    return RecordBatch.of_columns(data, layout)


def raw_object(stored: bytes | memoryview, chunks: Sequence[Chunk], stored_codec: Codec
               ) -> bytes | memoryview:
    """The raw body of a whole compacted object from its stored bytes: its record count
    and every chunk, each verified and decompressed (the caller verified the object's
    own checksum). A raw object is returned as it is."""
    if stored_codec is Codec.NONE:
        return stored
    view = memoryview(stored)
    if len(view) != chunks[-1].byte_end:
        raise CorruptData(f"compacted object holds {len(view)} bytes, its chunk table "
                          f"says {chunks[-1].byte_end}")
    parts: list[bytes | memoryview] = [view[:4]]
    parts += [chunk_bytes(view[c.byte_offset:c.byte_end], c, stored_codec) for c in chunks]
    return b"".join(parts)
