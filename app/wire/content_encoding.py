"""``Content-Encoding`` on the wire: produce bodies compressed with zstd or gzip, and
answers compressed for the caller's ``Accept-Encoding`` (docs/http-api.md, Compression).

Stored compression (app/storage/compression.py) decodes bytes the broker wrote itself;
this module decodes bytes a caller sent, so it treats them as hostile. A request body
is decoded in bounded steps and refused (413) as soon as its decoded size passes the
limit the raw body has, so a few KiB that would inflate to GiBs cost a few MiB of memory
and a few milliseconds:

- gzip: ``zlib.decompressobj(wbits=31)`` with ``max_length`` bounds each step's output.
- zstd: ``zstandard``'s decompression object has no output bound, so it is fed its
  input in slices small enough that one slice cannot inflate past the limit by more than
  :data:`_ZSTD_OVERSHOOT` (a zstd block of at most 128 KiB needs at least 4 bytes of
  input). A frame that declares a content size over the limit is refused before any
  of it is decoded, and one that asks for a window over :data:`ZSTD_MAX_WINDOW` (the
  8 MiB RFC 8878 asks a ``Content-Encoding: zstd`` decoder to support) is refused
  rather than allocated.

A stream that stops before its end (a truncated frame or member) is corrupt (400), as
is anything else that does not decode.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence

import zstandard

from app.errors import InvalidRequest, PayloadTooLarge, UnsupportedEncoding

IDENTITY = "identity"
GZIP = "gzip"
ZSTD = "zstd"
# What a request body may be encoded with, as the OpenAPI document lists them.
REQUEST_ENCODINGS = (IDENTITY, GZIP, ZSTD)
# What a 415 says the broker takes (its Accept-Encoding header).
ACCEPTED_ENCODINGS = "zstd, gzip"
# What an answer may be compressed with, best first.
ANSWER_ENCODINGS = (ZSTD, GZIP)
_ALIASES = {"x-gzip": GZIP}  # RFC 9110 8.4.1.3: the same as gzip

# Answers smaller than this go raw: compressing them saves less than a packet and
# costs a compression context's setup.
MIN_COMPRESSED_ANSWER = 1024
# Levels for answers: the fastest that still compress JSON and record batches well
# (zstd 1 and gzip 1 both reach most of their ratio on records; higher levels cost
# several times the CPU of the answer's own encoding).
ZSTD_ANSWER_LEVEL = 1
GZIP_ANSWER_LEVEL = 1

ZSTD_MAX_WINDOW = 8 * 1024 * 1024
# The most one input byte can become in zstd (an RLE block: 128 KiB from 4 bytes).
_ZSTD_MAX_RATIO = 32 * 1024
# The least input fed per step, and so the most a step may decode past the limit.
_ZSTD_MIN_SLICE = 64
_ZSTD_OVERSHOOT = _ZSTD_MIN_SLICE * _ZSTD_MAX_RATIO
_GZIP_STEP = 1024 * 1024


def request_encoding(header: str | None) -> str:
    """The encoding a ``Content-Encoding`` header names: identity when absent, one of
    :data:`REQUEST_ENCODINGS` otherwise; anything else (an unknown coding, or several
    codings stacked) is :class:`UnsupportedEncoding` (415)."""
    if header is None:
        return IDENTITY
    name = header.strip().lower()
    name = _ALIASES.get(name, name)
    if name in ("", IDENTITY):
        return IDENTITY
    if name in REQUEST_ENCODINGS:
        return name
    raise UnsupportedEncoding(
        f"Content-Encoding {header.strip()!r} is not supported; send one of "
        f"{', '.join(REQUEST_ENCODINGS)}")


def decode(encoding: str, body: bytes, max_size: int) -> bytes:
    """``body`` as it was before ``encoding``: :class:`PayloadTooLarge` once it decodes
    to more than ``max_size`` bytes (before much more is inflated), :class:`InvalidRequest`
    when it does not decode."""
    if encoding == IDENTITY:
        return body
    if not body:
        raise InvalidRequest(f"an empty body is not {encoding} data")
    if encoding == GZIP:
        return _gunzip(body, max_size)
    if encoding == ZSTD:
        return _unzstd(body, max_size)
    raise UnsupportedEncoding(f"Content-Encoding {encoding!r} is not supported")


def _too_large(max_size: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body decodes to more than the limit of {max_size} "
                           "bytes")


def _gunzip(body: bytes, max_size: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    data = body
    try:
        while data:  # one gzip member a turn: RFC 1952 allows several in a row
            member = zlib.decompressobj(wbits=31)
            while data and not member.eof:
                out = member.decompress(data, min(_GZIP_STEP, max_size + 1 - total))
                total += len(out)
                if total > max_size:
                    raise _too_large(max_size)
                parts.append(out)
                data = member.unconsumed_tail
            if not member.eof:
                raise InvalidRequest("gzip body ends before its end")
            data = member.unused_data
    except zlib.error as exc:
        raise InvalidRequest(f"gzip body does not decode: {exc}") from None
    return b"".join(parts)


def _unzstd(body: bytes, max_size: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    view = memoryview(body)
    at = 0
    try:
        while at < len(view):  # one frame a turn: a body may hold several in a row
            _check_frame(view[at:at + 18], max_size - total)
            frame = _decompressor().decompressobj()
            while at < len(view) and not frame.eof:
                step = max(_ZSTD_MIN_SLICE, (max_size + 1 - total) // _ZSTD_MAX_RATIO)
                piece = view[at:at + step]
                at += len(piece)
                out = frame.decompress(piece)
                total += len(out)
                if total > max_size:
                    raise _too_large(max_size)
                parts.append(out)
            if not frame.eof:
                raise InvalidRequest("zstd body ends before its end")
            at -= len(frame.unused_data)
    except zstandard.ZstdError as exc:
        raise InvalidRequest(f"zstd body does not decode: {exc}") from None
    return b"".join(parts)


def _check_frame(header: memoryview, room: int) -> None:
    """Refuse a frame by its header: a declared content size over what is left of the
    limit (413), a window larger than a decoder has to support (400)."""
    params = zstandard.get_frame_parameters(bytes(header))
    if params.content_size != zstandard.CONTENTSIZE_UNKNOWN and params.content_size > room:
        raise PayloadTooLarge(f"a zstd frame declares {params.content_size} bytes, more "
                              "than the request body limit allows")
    if params.window_size > ZSTD_MAX_WINDOW:
        raise InvalidRequest(f"a zstd frame asks for a window of {params.window_size} bytes; "
                             f"at most {ZSTD_MAX_WINDOW} are supported (RFC 8878)")


def answer_encoding(accept_encoding: str | None,
                    offered: Sequence[str] = ANSWER_ENCODINGS) -> str | None:
    """The encoding to compress an answer with for this ``Accept-Encoding``: of the
    ``offered`` ones (zstd preferred, then gzip), the one the caller accepts with the
    highest q-value; None (send it raw) when it accepts none. ``*`` stands for any
    coding the header does not name."""
    if not accept_encoding or not offered:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, _, params = item.partition(";")
        name = _ALIASES.get(name.strip().lower(), name.strip().lower())
        if not name:
            continue
        weights[name] = _q(params)
    best: str | None = None
    best_q = 0.0
    for encoding in offered:
        q = weights.get(encoding, weights.get("*", 0.0))
        if q > best_q:
            best, best_q = encoding, q
    return best


def _q(params: str) -> float:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def compress(encoding: str, parts: Sequence[bytes | memoryview]) -> bytes:
    """The answer ``parts`` compressed as one ``encoding`` stream (zstd or gzip)."""
    if encoding == ZSTD:
        zc = _compressor().compressobj(size=sum(len(p) for p in parts))
        return b"".join([*(zc.compress(p) for p in parts), zc.flush()])
    if encoding == GZIP:
        zo = zlib.compressobj(GZIP_ANSWER_LEVEL, zlib.DEFLATED, 31)
        return b"".join([*(zo.compress(p) for p in parts), zo.flush()])
    raise ValueError(f"not an answer encoding: {encoding!r}")


# A stream's window: events repeat their field names within a few KiB, and a stream
# holds its compression context as long as it runs (about 0.5 MiB at this window,
# against 1.4 MiB at level 1's own).
_STREAM_WINDOW_LOG = 16


class StreamCompressor:
    """One compressed stream of events (Server-Sent Events): each event is flushed whole
    as it is compressed, so a reader decodes it as soon as it arrives and nothing waits
    in the compressor for the next one. Used by one task at a time (a stream's events
    are sent in order), on whichever thread it runs."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        if encoding == ZSTD:
            params = zstandard.ZstdCompressionParameters.from_level(
                ZSTD_ANSWER_LEVEL, window_log=_STREAM_WINDOW_LOG)
            self._zstd = zstandard.ZstdCompressor(compression_params=params).compressobj()
        elif encoding == GZIP:
            self._gzip = zlib.compressobj(GZIP_ANSWER_LEVEL, zlib.DEFLATED, 31)
        else:
            raise ValueError(f"not an answer encoding: {encoding!r}")

    def event(self, data: bytes) -> bytes:
        """``data`` compressed and flushed: all a reader needs to decode it."""
        if self.encoding == ZSTD:
            return self._zstd.compress(data) + self._zstd.flush(
                zstandard.COMPRESSOBJ_FLUSH_BLOCK)
        return self._gzip.compress(data) + self._gzip.flush(zlib.Z_SYNC_FLUSH)

    def end(self) -> bytes:
        """The end of the stream (the frame's or member's trailer)."""
        if self.encoding == ZSTD:
            return self._zstd.flush()
        return self._gzip.flush()


# zstandard's contexts must not be used by two threads at once; answers are compressed
# on worker threads, so each thread keeps its own.
_LOCAL = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    found: zstandard.ZstdCompressor | None = getattr(_LOCAL, "compressor", None)
    if found is None:
        found = _LOCAL.compressor = zstandard.ZstdCompressor(level=ZSTD_ANSWER_LEVEL)
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_LOCAL, "decompressor", None)
    if found is None:
        found = _LOCAL.decompressor = zstandard.ZstdDecompressor(
            max_window_size=ZSTD_MAX_WINDOW)
    return found
