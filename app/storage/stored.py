"""A whole body from its stored bytes: where readers of whole bodies meet compression.

An index entry (or the pending append, or a compaction's record) says how its bytes are
stored: ``crc32c`` covers them as stored, and ``codec`` says how they are compressed
(absent: not at all). Every reader that takes a body whole (the compactor's inputs, the
reader's objects without a chunk table, the Spark jobs) gets it through
:func:`raw_body`, so none of them can decode compressed bytes as records or skip the
checksum. Chunked reads of compacted objects go through app/storage/chunks.py.
"""

from __future__ import annotations

from app.errors import CorruptData
from app.storage import codec
from app.storage.chunks import parse_chunks, raw_object
from app.storage.compression import Codec, decompress, parse_codec
from app.storage.records import IndexEntry

# No stored body decompresses to more: the largest batch a writer may flush
# (LLOG_BATCH_MAX_BYTES is at most 1 GiB); a slice is bounded by its own raw_length too.
MAX_RAW_BODY_BYTES = 1024 * 1024 * 1024


def raw_body(stored: bytes | memoryview, entry: IndexEntry, *,
             max_size: int = MAX_RAW_BODY_BYTES) -> bytes | memoryview:
    """The raw body ``entry`` describes, from its stored bytes: the checksum verified
    first, then decompressed within ``raw_length`` (a slice) or the chunk bound (each
    chunk of a compacted object); :class:`CorruptData` when anything does not hold."""
    codec.verify_body(stored, entry.crc32c)
    kind = parse_codec(entry.codec)
    if kind is Codec.NONE:
        return stored
    if entry.chunks is not None and entry.object_bytes is not None:
        whole = raw_object(stored, parse_chunks(entry.chunks, entry.msg_count,
                                                entry.object_bytes), kind)
        if entry.raw_length is not None and len(whole) != entry.raw_length:
            raise CorruptData(f"a {kind.value} object decodes to {len(whole)} bytes, its "
                              f"raw_length says {entry.raw_length}")
        return whole
    raw_length = entry.raw_length
    if (not isinstance(raw_length, int) or isinstance(raw_length, bool)
            or not 0 < raw_length <= max_size):
        raise CorruptData(f"a {kind.value} body needs a raw_length of 1 to {max_size} "
                          f"bytes, not {raw_length!r}")
    data = decompress(kind, stored, max_size=raw_length)
    if len(data) != raw_length:
        raise CorruptData(f"a {kind.value} body decodes to {len(data)} bytes, its "
                          f"raw_length says {raw_length}")
    return data
