"""A WAL slice from its stored bytes: verified, then decompressed as its index entry says.

Every reader of WAL slices (the broker's reader, compaction, tools) goes through
:func:`open_slice`, so each reads old (raw) and new (compressed) slices alike. The
CRC32C covers the stored bytes and is checked before anything is decompressed; a slice
decompresses to exactly its entry's ``raw_length`` (bounded before allocation, see
:func:`app.storage.codec.raw_body`). Decompressing a large slice takes milliseconds, so
it runs in a worker thread; a small one is not worth the hop.
"""

from __future__ import annotations

import anyio

from app.storage import codec
from app.storage.metadata import IndexEntry

# Raw bytes decompressed in place: zstd decodes about 1 GB/s of records on one core
# of the 2-core machine measured (0.3 GB/s while other work competed), so at most 0.2 ms
# on the event loop; a thread hop costs about a tenth of that.
INLINE_RAW_BYTES = 64 * 1024


def slice_body(stored: bytes | memoryview, entry: IndexEntry) -> bytes | memoryview:
    """The verified raw body of a slice (``stored`` itself when it is not compressed);
    :class:`~app.errors.CorruptData` when it does not verify or decode."""
    return codec.raw_body(stored, entry.crc32c, entry.codec, entry.raw_length)


async def open_slice(stored: bytes | memoryview, entry: IndexEntry) -> bytes | memoryview:
    """:func:`slice_body`, in a worker thread when there is much to decompress."""
    raw_length = entry.raw_length  # as read: checked by slice_body
    if (entry.codec is None or not isinstance(raw_length, int)
            or raw_length <= INLINE_RAW_BYTES):
        return slice_body(stored, entry)
    return await anyio.to_thread.run_sync(slice_body, stored, entry)
