"""WAL slices stored compressed, as a writer stores them for a zstd topic
(docs/protocol.md): an LLS1 blob whose header part names ``codec`` and ``raw_length``,
its body offset, length and CRC32C those of the stored bytes, and an index entry that
says the same. Tests use it to build stores that mix raw and compressed objects."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid

from app.storage import codec
from app.storage.compression import Codec, Compression, compress
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry
from tests.helpers.stack import Engine

_U32 = struct.Struct(">I")


def compressed_blob(tp: TopicPartition, entry: IndexEntry, stored: bytes, raw_length: int
                    ) -> tuple[bytes, int]:
    """An LLS1 blob holding ``stored`` as ``tp``'s one body, and the body's offset."""
    part = {"topic": tp.topic, "partition": tp.partition, "msg_count": entry.msg_count,
            "encoding": entry.encoding, "body_offset": 0, "body_length": len(stored),
            "crc32c": codec.crc32c(stored), "codec": "zstd", "raw_length": raw_length}
    header_len = 0
    while True:  # the offset's digits change the header's length: settle both
        part["body_offset"] = 8 + header_len
        header = json.dumps({"version": 1, "created_at_ms": entry.created_at_ms,
                             "partitions": [part]}, separators=(",", ":")).encode()
        if len(header) == header_len:
            return codec.MAGIC + _U32.pack(len(header)) + header + stored, 8 + header_len
        header_len = len(header)


async def compress_slice(e: Engine, tp: TopicPartition, end: int) -> IndexEntry:
    """Store the WAL entry at ``end`` again as a zstd slice of a blob of its own and
    point the entry at it (the entry's records must compress)."""
    key = e.layout.index(tp, end)
    found = await e.oxia.get(key, tp.partition_key)
    assert found is not None
    entry = IndexEntry.from_json(found.value)
    assert entry.byte_offset is not None and entry.byte_length is not None
    body = await e.s3.get_range(e.layout.parse_uri(entry.data_key)[1], entry.byte_offset,
                                entry.byte_length)
    kind, stored = compress(body, Compression(Codec.ZSTD, 3))
    assert kind is Codec.ZSTD, "the entry's records do not compress"
    blob, offset = compressed_blob(tp, entry, stored, len(body))
    blob_key = e.layout.shared_wal_object(uuid.uuid4().hex)
    await e.s3.put(blob_key, blob)
    updated = dataclasses.replace(
        entry, data_key=e.layout.uri(blob_key), byte_offset=offset, byte_length=len(stored),
        crc32c=codec.crc32c(stored), codec="zstd", raw_length=len(body),
        extra=dict(entry.extra))
    await e.oxia.put(key, updated.to_json(), tp.partition_key,
                     expected_version=found.version_id)
    return updated
