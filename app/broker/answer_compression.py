"""An answer compressed for the caller's ``Accept-Encoding`` (zstd, else gzip), when it
is large enough to gain from it (app/wire/content_encoding.py).

Compressing costs about a millisecond per MiB of records with zstd at level 1 (gzip
twice that), and a hop to a worker thread about a tenth of a millisecond: an answer
under :data:`OFF_LOOP_BYTES` is compressed where it is (a few tenths of a millisecond at
most), a larger one on a worker thread (anyio's, bounded), so that the event loop serves
other requests meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence

import anyio

from app.wire import content_encoding

OFF_LOOP_BYTES = 64 * 1024
VARY = "Accept-Encoding"


async def compress_answer(parts: Sequence[bytes | memoryview], accept_encoding: str | None,
                          offered: Sequence[str]
                          ) -> tuple[Sequence[bytes | memoryview], str | None]:
    """The parts to send and their ``Content-Encoding`` (None: raw), compressed with one
    of the ``offered`` codings (LLOG_ANSWER_ENCODINGS) the caller accepts."""
    encoding = content_encoding.answer_encoding(accept_encoding, offered)
    size = sum(len(p) for p in parts)
    if encoding is None or size < content_encoding.MIN_COMPRESSED_ANSWER:
        return parts, None
    if size < OFF_LOOP_BYTES:
        return [content_encoding.compress(encoding, parts)], encoding
    packed = await anyio.to_thread.run_sync(content_encoding.compress, encoding, parts)
    return [packed], encoding


async def compress_events(events: AsyncGenerator[bytes, None], encoding: str
                          ) -> AsyncGenerator[bytes, None]:
    """``events`` as one compressed stream, each event flushed as it comes (nothing is
    held back for the next); large events are compressed on a worker thread."""
    compressor = content_encoding.StreamCompressor(encoding)
    async with contextlib.aclosing(events):  # closed with this stream, not when collected
        async for event in events:
            if len(event) < OFF_LOOP_BYTES:
                yield compressor.event(event)
            else:
                yield await anyio.to_thread.run_sync(compressor.event, event)
    yield compressor.end()
