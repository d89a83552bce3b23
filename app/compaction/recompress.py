"""Compacted chunks compressed: what a topic asks for, and the object as it is stored.

Compaction rewrites every record anyway, so it is where a log pays for a higher zstd
level once and saves on every later GET and stored GiB-month: a topic whose compression
is zstd gets its compacted chunks at ``LLOG_COMPACTION_ZSTD_LEVEL`` (default: the topic's
level + 3, at most 19), a topic with none gets raw chunks.

Each chunk becomes one zstd frame of its own, so a reader still fetches and decodes one
chunk alone (app/storage/chunks.py). The codec is decided for the whole object: it is
stored compressed only when that saves :data:`~app.storage.compression.MIN_SAVING` of it
in all, otherwise raw with no codec (uncompressible records cost one attempt and are
then read with no decompression at all, and a raw chunk needs no codec of its own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct

from app.compaction.assemble import CompactedBody
from app.errors import LlogError
from app.storage import codec
from app.storage.chunks import MAX_CHUNK_RAW_BYTES
from app.storage.compression import (
    MIN_SAVING,
    NO_COMPRESSION,
    ZSTD_MAX_LEVEL,
    Codec,
    Compression,
    compress_frame,
)
from app.storage.keys import KeyLayout
from app.storage.topic_catalog import PARTITION_KEY
from app.storage.topic_compression import topic_compression as stored_as
from app.stores.oxia.store import OxiaStore

log = logging.getLogger(__name__)
_U32 = struct.Struct(">I")
LEVEL_STEP = 3  # compaction's default level over the topic's


async def topic_compression(oxia: OxiaStore, layout: KeyLayout, topic: str) -> Compression:
    """The compression the topic's catalog record asks for: its ``compression`` and
    ``compression_level`` fields (docs/protocol.md). A topic without them, or without a
    record (written before the catalog existed), has none; a value this release does not
    know is compacted raw, which every reader reads."""
    found = await oxia.get(layout.topic_record(topic), PARTITION_KEY)
    if found is None:
        return NO_COMPRESSION
    try:
        data = json.loads(found.value)
        if not isinstance(data, dict):
            return NO_COMPRESSION
        # The one rule of the fields, as the catalog and the writer read them.
        return stored_as(data.get("compression"), data.get("compression_level"))
    except (ValueError, TypeError, LlogError) as exc:
        log.warning("topic %s: compression setting not understood (%s); compacting raw",
                    topic, exc)
        return NO_COMPRESSION


def compaction_compression(topic: Compression, level: int | None) -> Compression:
    """What compaction recompresses a topic's chunks with: none for a topic with none,
    else zstd at ``level`` (``LLOG_COMPACTION_ZSTD_LEVEL``) or the topic's level plus
    :data:`LEVEL_STEP`, at most the highest level."""
    if topic.codec is Codec.NONE:
        return NO_COMPRESSION
    chosen = min(topic.level + LEVEL_STEP, ZSTD_MAX_LEVEL) if level is None else level
    return Compression(Codec.ZSTD, chosen)


def compress_chunks(merged: CompactedBody, compression: Compression) -> CompactedBody:
    """``merged`` as it is to be stored: with zstd, its record count then one frame per
    chunk, and the chunk table's offsets and checksums those of the frames; unchanged
    when the setting is none, a chunk is beyond what readers decompress, or compressing
    would not save :data:`MIN_SAVING` of the object."""
    if compression.codec is Codec.NONE:
        return merged
    body = memoryview(merged.body)
    ends = [row[1] for row in merged.chunks[1:]] + [len(body)]
    if any(end - row[1] > MAX_CHUNK_RAW_BYTES for row, end in zip(merged.chunks, ends,
                                                                  strict=True)):
        return merged
    parts: list[bytes | memoryview] = [body[:4]]
    rows: list[list[int]] = []
    at = 4
    for row, end in zip(merged.chunks, ends, strict=True):
        frame = compress_frame(body[row[1]:end], compression.level)
        rows.append([row[0], at, codec.crc32c(frame), *row[3:]])
        parts.append(frame)
        at += len(frame)
    if at > len(body) * (1 - MIN_SAVING):
        return merged
    stored = b"".join(parts)
    return dataclasses.replace(merged, body=stored, crc32c=codec.crc32c(stored), chunks=rows,
                               codec=compression.codec, raw_length=len(body))
