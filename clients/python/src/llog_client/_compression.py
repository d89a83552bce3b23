"""Compressed produce bodies and answers: what the client sends with
``Content-Encoding`` and accepts with ``Accept-Encoding`` (docs/http-api.md,
Compression).

A produce body is compressed with zstd by default: records are mostly text that
repeats its field names, so a request shrinks several times for about a millisecond per
MiB. A body under :data:`MIN_COMPRESSED_BODY` goes raw (it fits a packet either way),
and so does one that compression would not shrink by a tenth (random bytes): the
broker then has nothing to decode. Answers are decoded by httpx, which reads zstd with
the same ``zstandard`` package.

zstd needs ``zstandard``, the ``zstd`` extra (``pip install 'llog-client[zstd]'``).
Without it the client still works: bodies go gzip compressed by default, answers are
asked for in gzip only (httpx could not decode zstd either), and asking for zstd is a
ValueError that names the extra. :data:`DEFAULT_COMPRESSION` says which applies.
"""

from __future__ import annotations

import threading
import zlib
from typing import Literal

try:
    import zstandard
except ImportError:  # the zstd extra is not installed: gzip is the default instead
    HAS_ZSTD = False
else:
    HAS_ZSTD = True

Compression = Literal["zstd", "gzip", "none"]
COMPRESSIONS: tuple[Compression, ...] = ("zstd", "gzip", "none")
DEFAULT_COMPRESSION: Compression = "zstd" if HAS_ZSTD else "gzip"
ACCEPT_ENCODING = "zstd, gzip" if HAS_ZSTD else "gzip"
ZSTD_EXTRA = "pip install 'llog-client[zstd]'"
MIN_COMPRESSED_BODY = 1024
# Compressed output must be at most this fraction of the body to be sent compressed.
_WORTH_IT = 0.9
ZSTD_LEVEL = 3
GZIP_LEVEL = 6

_LOCAL = threading.local()  # zstd contexts are not for two threads at once


def checked(compression: str) -> Compression:
    """``compression`` if it is one the client can send; ValueError otherwise."""
    if compression == "zstd" and not HAS_ZSTD:
        raise ValueError(f"compression 'zstd' needs the zstandard package ({ZSTD_EXTRA}); "
                         "gzip and none work without it")
    for known in COMPRESSIONS:
        if compression == known:
            return known
    raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, "
                     f"not {compression!r}")


def encode_body(content: bytes, compression: Compression) -> tuple[bytes, str | None]:
    """The body to send and its ``Content-Encoding`` (None: sent as it is)."""
    if compression == "none" or len(content) < MIN_COMPRESSED_BODY:
        return content, None
    if compression == "zstd":
        packed = _zstd().compress(content)
    else:
        packed = zlib.compress(content, GZIP_LEVEL, wbits=31)
    if len(packed) > len(content) * _WORTH_IT:
        return content, None
    return packed, compression


def _zstd() -> zstandard.ZstdCompressor:
    found: zstandard.ZstdCompressor | None = getattr(_LOCAL, "zstd", None)
    if found is None:
        found = _LOCAL.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return found
