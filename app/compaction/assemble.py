"""Step 4 of compaction: read the selected slices and build one bytes-batch-v1 body.

Each input is fetched on its own (a ranged GET for a shared-blob slice, a whole GET for a
legacy object), verified against its recorded CRC32C and decoded with its index entry's
``msg_count``, exactly as a reader would; anything that does not verify fails the
compaction as corrupt rather than being copied into a blob that would then look valid.
The merged body is the concatenation of the inputs' record areas behind a new count, so
records are never re-encoded.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from app.errors import CorruptData, LlogError
from app.storage import codec
from app.storage.chunks import DEFAULT_CHUNK_BYTES, chunk_table
from app.storage.keys import KeyLayout
from app.storage.s3 import S3Store
from app.storage.spans import Span

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


async def read_body(s3: S3Store, layout: KeyLayout, item: Span) -> bytes:
    """The verified body ``item`` points at (any encoding this release reads)."""
    entry = item.entry
    _, key = layout.parse_uri(entry.data_key)
    if entry.byte_offset is not None and entry.byte_length is not None:
        body = await s3.get_range(key, entry.byte_offset, entry.byte_length)
    else:
        body = await s3.get(key)
    try:
        codec.verify_body(body, entry.crc32c)
        codec.decode_body(body, entry.encoding, entry.msg_count)
    except CorruptData as exc:
        raise CorruptData(f"index entry {item.end} ({entry.data_key}): {exc}") from None
    return body


async def build_compacted_body(
    s3: S3Store, layout: KeyLayout, run: Sequence[Span], *, concurrency: int,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
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
