"""Codecs for stored bodies and chunks: what a slice or chunk is compressed with.

One library does zstd everywhere (``zstandard``): the broker, the Spark jobs and the
Python client, whose httpx decodes ``Content-Encoding: zstd`` answers with that same
package. Measured against ``backports.zstd`` and ``cramjam`` on JSON events (the same
libzstd underneath) it compresses and decompresses within the noise of this machine.

Compression only pays where bytes repeat. :func:`compress` stores data raw when the
codec would not save at least :data:`MIN_SAVING` of it, so uncompressible records cost
one attempt and are then read with no codec at all.

Decoders treat their input as hostile: the raw size is bounded *before* it is allocated
(a zstd frame may declare any content size, and ``zstandard`` would allocate it), and
every failure is a :class:`~app.errors.CorruptData`.
"""

from __future__ import annotations

import enum
import io
import threading
from dataclasses import dataclass

import zstandard

from app.errors import CorruptData


class Codec(str, enum.Enum):
    """How stored bytes are compressed; recorded next to the bytes (``codec`` fields)."""

    NONE = "none"
    ZSTD = "zstd"


# Levels zstd accepts that are worth their CPU for a log (negative levels are "fast").
ZSTD_MIN_LEVEL = -7
ZSTD_MAX_LEVEL = 19
ZSTD_DEFAULT_LEVEL = 3
# Compressed output must be at most this fraction of the input to be stored compressed.
MIN_SAVING = 0.10
_READ_STEP = 1 << 20


@dataclass(frozen=True)
class Compression:
    """A codec and its level: a topic's setting, or what compaction recompresses with."""

    codec: Codec = Codec.NONE
    level: int = ZSTD_DEFAULT_LEVEL

    def __post_init__(self) -> None:
        if self.codec is Codec.ZSTD and not ZSTD_MIN_LEVEL <= self.level <= ZSTD_MAX_LEVEL:
            raise ValueError(f"zstd level must be {ZSTD_MIN_LEVEL} to {ZSTD_MAX_LEVEL}, "
                             f"not {self.level}")


NO_COMPRESSION = Compression()


def parse_codec(name: object) -> Codec:
    """The codec a stored record names (absent means none); unknown ones are corrupt."""
    if name is None:
        return Codec.NONE
    try:
        return Codec(name)
    except ValueError:
        raise CorruptData(f"unknown codec {name!r}") from None


def compress(data: bytes | memoryview, compression: Compression) -> tuple[Codec, bytes]:
    """``data`` as it is to be stored and the codec that says how: raw (``NONE``) when
    the setting is none or compressing would not save :data:`MIN_SAVING`."""
    raw = bytes(data)
    if compression.codec is Codec.NONE or not raw:
        return Codec.NONE, raw
    packed = _compressor(compression.level).compress(raw)
    if len(packed) > len(raw) * (1 - MIN_SAVING):
        return Codec.NONE, raw
    return Codec.ZSTD, packed


def compress_frame(data: bytes | memoryview, level: int) -> bytes:
    """One zstd frame of ``data`` whether it pays or not, for a container whose codec is
    decided once for all its parts (a compacted object's chunks): zstd keeps what does
    not compress in raw blocks, a few bytes per 128 KiB more than the data."""
    return _compressor(level).compress(bytes(data))


def decompress(codec: Codec, data: bytes | memoryview, *, max_size: int) -> bytes:
    """The raw bytes of ``data``; :class:`CorruptData` when they do not decode or would
    exceed ``max_size`` (checked before anything that large is allocated)."""
    if codec is Codec.NONE:
        return bytes(data)
    if codec is not Codec.ZSTD:  # pragma: no cover - Codec has no other member
        raise CorruptData(f"unknown codec {codec!r}")
    declared = _content_size(data)
    if declared is not None and declared > max_size:
        raise CorruptData(f"a zstd frame declares {declared} bytes, over the limit of "
                          f"{max_size}")
    try:
        with _decompressor().stream_reader(io.BytesIO(bytes(data)),
                                         read_across_frames=True) as reader:
            parts: list[bytes] = []
            total = 0
            while chunk := reader.read(min(_READ_STEP, max_size + 1 - total)):
                parts.append(chunk)
                total += len(chunk)
                if total > max_size:
                    raise CorruptData(f"zstd data decodes to more than {max_size} bytes")
    except zstandard.ZstdError as exc:
        raise CorruptData(f"zstd data does not decode: {exc}") from None
    return b"".join(parts)


def _content_size(data: bytes | memoryview) -> int | None:
    try:
        size = zstandard.frame_content_size(bytes(data[:18]))
    except zstandard.ZstdError as exc:
        raise CorruptData(f"not a zstd frame: {exc}") from None
    return None if size < 0 else int(size)


# zstandard's compressor and decompressor objects hold native contexts that must not be
# used by two threads at once; flushes and reads run on worker threads, so each thread
# keeps its own (a few per thread: one per level in use).
_LOCAL = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    by_level: dict[int, zstandard.ZstdCompressor] | None = getattr(_LOCAL, "compressors", None)
    if by_level is None:
        by_level = _LOCAL.compressors = {}
    found = by_level.get(level)
    if found is None:
        found = by_level[level] = zstandard.ZstdCompressor(level=level)
    return found


def _decompressor() -> zstandard.ZstdDecompressor:
    found: zstandard.ZstdDecompressor | None = getattr(_LOCAL, "decompressor", None)
    if found is None:
        found = _LOCAL.decompressor = zstandard.ZstdDecompressor()
    return found
