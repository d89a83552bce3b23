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
from app.storage.compression import Codec, parse_codec
from app.storage.metadata import IndexEntry


def raw_body(stored: bytes | memoryview, entry: IndexEntry) -> bytes | memoryview:
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
    # A slice: the one slice decoder (its codec, bounded by its own raw_length).
    return codec.raw_body(stored, entry.crc32c, entry.codec, entry.raw_length)
