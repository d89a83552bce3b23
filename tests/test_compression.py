"""Stored-body codecs: round trips, raw when compression does not pay, hostile input."""

from __future__ import annotations

import os

import pytest
import zstandard

from app.errors import CorruptData
from app.storage.compression import (
    NO_COMPRESSION,
    Codec,
    Compression,
    compress,
    decompress,
    parse_codec,
)

ZSTD = Compression(Codec.ZSTD, 3)
JSON_LINES = b"".join(b'{"event":"view","user":"u%05d","path":"/api/v1/orders"}\n' % i
                      for i in range(2000))


def test_zstd_round_trips_and_saves_bytes() -> None:
    codec, stored = compress(JSON_LINES, ZSTD)
    assert codec is Codec.ZSTD
    assert len(stored) < len(JSON_LINES) // 4
    assert decompress(codec, stored, max_size=len(JSON_LINES)) == JSON_LINES


def test_uncompressible_data_is_stored_raw() -> None:
    data = os.urandom(64 * 1024)
    assert compress(data, ZSTD) == (Codec.NONE, data)
    assert decompress(Codec.NONE, data, max_size=len(data)) == data


def test_no_compression_keeps_the_bytes() -> None:
    assert compress(JSON_LINES, NO_COMPRESSION) == (Codec.NONE, JSON_LINES)
    assert compress(b"", ZSTD) == (Codec.NONE, b"")


def test_a_declared_size_over_the_limit_is_refused_before_decoding() -> None:
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (8 << 20))
    with pytest.raises(CorruptData, match="declares"):
        decompress(Codec.ZSTD, bomb, max_size=1 << 20)


def test_an_undeclared_size_over_the_limit_is_refused_while_decoding() -> None:
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (8 << 20))
    with pytest.raises(CorruptData, match="more than"):
        decompress(Codec.ZSTD, bomb, max_size=1 << 20)


@pytest.mark.parametrize("data", [b"", b"garbage!", b"\x28\xb5\x2f\xfd" + b"\xff" * 20])
def test_garbage_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptData):
        decompress(Codec.ZSTD, data, max_size=1 << 20)


def test_codec_names() -> None:
    assert parse_codec(None) is Codec.NONE
    assert parse_codec("zstd") is Codec.ZSTD
    with pytest.raises(CorruptData):
        parse_codec("brotli")
    with pytest.raises(ValueError):
        Compression(Codec.ZSTD, 40)
