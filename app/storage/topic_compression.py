"""A topic's compression setting: what its catalog record, its API fields, the CLI's
``zstd[:LEVEL]`` and ``LLOG_TOPIC_DEFAULT_COMPRESSION`` say, as one checked value.

A topic names a codec (``none`` or ``zstd``) and, for zstd, a level (absent: the
codec's default). Old catalog records have neither field and mean ``none``. The
setting applies to appends from the moment a broker sees it; every stored body says
its own codec, so a log may hold bodies of both.
"""

from __future__ import annotations

from app.errors import InvalidRequest
from app.storage.compression import (
    NO_COMPRESSION,
    ZSTD_MAX_LEVEL,
    ZSTD_MIN_LEVEL,
    Codec,
    Compression,
)

NAMES = tuple(c.value for c in Codec)


def topic_compression(name: object, level: object) -> Compression:
    """The setting of ``compression``/``compression_level`` fields (``name`` None: none).
    :class:`InvalidRequest` for an unknown codec, a level out of range, or a level
    without zstd."""
    if name is None or name == Codec.NONE.value:
        if level is not None:
            raise InvalidRequest("compression_level applies to zstd only")
        return NO_COMPRESSION
    if name != Codec.ZSTD.value:
        raise InvalidRequest(f"compression must be one of {', '.join(NAMES)}, not {name!r}")
    if level is None:
        return Compression(Codec.ZSTD)
    if (not isinstance(level, int) or isinstance(level, bool)
            or not ZSTD_MIN_LEVEL <= level <= ZSTD_MAX_LEVEL):
        raise InvalidRequest(f"compression_level must be an integer from {ZSTD_MIN_LEVEL} "
                             f"to {ZSTD_MAX_LEVEL}, not {level!r}")
    return Compression(Codec.ZSTD, level)


def parse_compression(text: str) -> tuple[str, int | None]:
    """``none``, ``zstd`` or ``zstd:LEVEL`` (a setting, a CLI option) as the fields
    ``(compression, compression_level)``; :class:`InvalidRequest` when it is neither."""
    name, sep, level_text = text.strip().partition(":")
    level: int | None = None
    if sep:
        try:
            level = int(level_text)
        except ValueError:
            raise InvalidRequest(f"{text!r}: the level after ':' must be an integer"
                                 ) from None
    topic_compression(name, level)  # checked
    return name, level
