"""Step 4 of compaction: read the selected slices and build one compacted body.

Each input is fetched on its own (a ranged GET for a shared-blob slice, a whole GET for a
legacy object), verified against its recorded CRC32C and checked with its index entry's
``msg_count``, exactly as a reader would; anything that does not verify fails the
compaction as corrupt rather than being copied into a blob that would then look valid.

The body is bytes-batch-v3-chunked (``LLOG_COMPACTION_ENCODING``, the default): one
bytes-batch-v3 body per chunk, cut column by column from the inputs, so that a read
takes runs of a chunk's records without decoding them. A run with a record that has
headers, which columns cannot hold, is written as bytes-batch-v2: the inputs' record
areas behind a new count, each record with its append time.

Inputs stored compressed are verified as stored and decompressed within their
``raw_length`` (app/storage/stored.py); the body built here is raw, and is compressed
chunk by chunk afterwards when the topic asks for it (app/compaction/recompress.py).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import anyio
import anyio.abc

from app.errors import CorruptData, LlogError
from app.storage import codec, columnar
from app.storage.chunks import DEFAULT_CHUNK_BYTES, MAX_CHUNKS, chunk_table
from app.storage.compression import Codec
from app.storage.keys import KeyLayout
from app.storage.slices import open_slice
from app.storage.spans import Span
from app.stores.s3.store import S3Store

_U32 = struct.Struct(">I")
MAX_BATCH_RECORDS = 2**32 - 1


@dataclass(frozen=True)
class CompactedBody:
    body: bytes
    msg_count: int
    crc32c: int
    chunks: list[list[int]]  # the chunk table (app/storage/chunks.py)
    first_append_ms: int
    last_append_ms: int
    encoding: str = codec.ENCODING_V2
    codec: Codec = Codec.NONE  # how every chunk of ``body`` is stored
    raw_length: int | None = None  # compressed: the bytes of the body before


async def read_body(s3: S3Store, layout: KeyLayout, item: Span) -> bytes:
    """The verified raw body ``item`` points at (any encoding and codec this release
    reads)."""
    entry = item.entry
    _, key = layout.parse_uri(entry.data_key)
    if entry.byte_offset is not None and entry.byte_length is not None:
        stored = await s3.get_range(key, entry.byte_offset, entry.byte_length)
    else:
        stored = await s3.get(key)
    try:
        body = bytes(await open_slice(stored, entry))  # verified; decompressed if it was
        if entry.encoding in (codec.ENCODING_V3, codec.ENCODING_V3_CHUNKED):
            _columns_of(body, entry.encoding, entry.msg_count)  # checks without decoding
        else:
            codec.decode_body(body, entry.encoding, entry.msg_count)
    except CorruptData as exc:
        raise CorruptData(f"index entry {item.end} ({entry.data_key}): {exc}") from None
    return body


async def build_compacted_body(
    s3: S3Store, layout: KeyLayout, run: Sequence[Span], *, concurrency: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES, encoding: str = codec.ENCODING_V3_CHUNKED,
) -> CompactedBody:
    """Fetch every entry of ``run`` (at most ``concurrency`` at once) and merge them."""
    bodies: list[bytes] = [b""] * len(run)
    failures: list[LlogError] = []
    limiter = anyio.CapacityLimiter(max(1, concurrency))

    async def fetch(i: int, tg: anyio.abc.TaskGroup) -> None:
        async with limiter:
            try:
                bodies[i] = await read_body(s3, layout, run[i])
            except LlogError as exc:
                # Raised below as itself (not wrapped in an exception group); the other
                # fetches are pointless now.
                failures.append(exc)
                tg.cancel_scope.cancel()

    async with anyio.create_task_group() as tg:
        for i in range(len(run)):
            tg.start_soon(fetch, i, tg)
    if failures:
        raise failures[0]
    total = sum(item.entry.msg_count for item in run)
    if total > MAX_BATCH_RECORDS:
        raise CorruptData(f"a compacted range of {total} records does not fit a body")
    if encoding == codec.ENCODING_V3_CHUNKED:
        chunked = merge_chunked(run, bodies, chunk_bytes)
        if chunked is not None:
            return chunked
    return merge_bodies(run, bodies, chunk_bytes)


def merge_bodies(run: Sequence[Span], bodies: list[bytes], chunk_bytes: int
                 ) -> CompactedBody:
    """One bytes-batch-v2 body of every record of ``run``, each with its append time
    (its entry's, for records that carry none), so lookups by time stay exact after
    compaction. Every body was decoded above, so its structure can be trusted."""
    total = sum(item.entry.msg_count for item in run)
    parts: list[bytes | memoryview] = [_U32.pack(total)]
    for item, body in zip(run, bodies, strict=True):
        parts += codec.v2_parts(body, item.entry.encoding, item.entry.created_at_ms)
    merged = b"".join(parts)
    chunks = chunk_table(merged, chunk_bytes, encoding=codec.ENCODING_V2)
    times = [item.entry.created_at_ms for item in run]
    return CompactedBody(merged, total, codec.crc32c(merged), chunks, min(times), max(times))


def merge_chunked(run: Sequence[Span], bodies: list[bytes], chunk_bytes: int
                  ) -> CompactedBody | None:
    """One bytes-batch-v3-chunked body of every record of ``run``: bytes-batch-v3 bodies
    of about ``chunk_bytes``, cut column by column from the inputs (a v1 or v2 input is
    put in columns first), every record with its append time. None when a record has
    headers, which columns cannot hold (the caller writes bytes-batch-v2 then)."""
    inputs: list[tuple[columnar.Columns, list[int]]] = []
    for item, body in zip(run, bodies, strict=True):
        entry = item.entry
        layouts = _columns_of(body, entry.encoding, entry.msg_count)
        if layouts is None:
            return None
        for layout in layouts:
            own = layout.append_times
            inputs.append((layout, [entry.created_at_ms] * layout.count if own is None
                           else [t or entry.created_at_ms for t in own]))
    total = sum(c.count for c, _ in inputs)
    target = max(chunk_bytes, sum(len(c.view) for c, _ in inputs) // MAX_CHUNKS + 1)
    parts: list[bytes | memoryview] = [_U32.pack(total)]
    rows: list[list[int]] = []
    at, first = 4, 0
    for cuts, times in _chunk_cuts(inputs, target):
        body = b"".join(columnar.join_cuts(cuts, times))
        rows.append([first, at, codec.crc32c(body), times[0]])
        parts.append(body)
        at += len(body)
        first += len(times)
    merged = b"".join(parts)
    if len(rows) > MAX_CHUNKS:
        return None
    return CompactedBody(merged, total, codec.crc32c(merged), rows,
                         min(min(times) for _, times in inputs),
                         max(max(times) for _, times in inputs), codec.ENCODING_V3_CHUNKED)


Cut = tuple[columnar.Columns, int, int]


def _columns_of(body: bytes, encoding: str, count: int) -> list[columnar.Columns] | None:
    """A body's records as checked columns (bodies in bytes-batch-v3 are only read; others
    are decoded and put in columns), or None when a record has headers."""
    if encoding == codec.ENCODING_V3:
        return [columnar.read_counted(body, count)]
    if encoding == codec.ENCODING_V3_CHUNKED:
        return codec.chunked_bodies(body, count)
    records = codec.decode_body(body, encoding, count)
    if not columnar.encodable(records):
        return None
    return [columnar.read_columns(columnar.encode(records))]


def _chunk_cuts(inputs: list[tuple[columnar.Columns, list[int]]], target: int
                ) -> list[tuple[list[Cut], list[int]]]:
    """The records of ``inputs`` in chunks of about ``target`` bytes (at least one record
    each): each chunk as cuts of the inputs and its append times."""
    columns = 0
    for layout, _ in inputs:
        columns |= layout.columns
    # A record's bytes in a chunk: its value and key, and its entries in the columns.
    extra = 12 + 4 * bool(columns & columnar.KEYS) + 8 * bool(columns & columnar.TIMESTAMPS)
    chunks: list[tuple[list[Cut], list[int]]] = []
    cuts: list[Cut] = []
    times: list[int] = []
    room = target
    for layout, own in inputs:
        ends = [end + extra * n for n, end in enumerate(accumulate(layout.record_sizes()), 1)]
        start, used = 0, 0
        while start < layout.count:
            # The records that fit the room left (one at least, in an empty chunk).
            stop = bisect.bisect_right(ends, used + room, lo=start)
            if stop == start and not cuts:
                stop = start + 1
            if stop > start:
                cuts.append((layout, start, stop))
                times += own[start:stop]
                room -= ends[stop - 1] - used
                used = ends[stop - 1]
                start = stop
            if start < layout.count or room <= 0:
                chunks.append((cuts, times))
                cuts, times, room = [], [], target
    if cuts:
        chunks.append((cuts, times))
    return chunks
