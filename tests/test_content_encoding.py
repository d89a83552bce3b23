"""The wire's codings (app/wire/content_encoding.py): request bodies decoded within a
limit however they were made, streams that do not decode refused, and Accept-Encoding
read with its q-values; and the client's side (clients/python/src/llog_client/_compression.py)."""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib
from collections.abc import Callable

import pytest
import zstandard

from app.errors import InvalidRequest, PayloadTooLarge, UnsupportedEncoding
from app.wire import content_encoding as ce
from llog_client._compression import encode_body

MiB = 1024 * 1024
RECORDS = b"".join(b'{"user":"u%d","path":"/api/items","status":200}\n' % i
                   for i in range(2000))


def _zstd_stream(data: bytes, pieces: int = 1) -> bytes:
    """A zstd frame that does not declare its content size (as a streaming encoder
    writes it)."""
    writer = zstandard.ZstdCompressor(level=3).compressobj()
    return b"".join([*(writer.compress(data) for _ in range(pieces)), writer.flush()])


def _zeros_gzip(total: int) -> bytes:
    """``total`` zero bytes as gzip members of 1 MiB each (deflate shrinks zeros about
    a thousand times at most: these are about 1 KiB a MiB)."""
    member = gzip.compress(bytes(MiB), 9)
    return member * (total // MiB)


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_a_body_decodes_to_what_was_encoded(encoding: str) -> None:
    packed = (gzip.compress(RECORDS) if encoding == "gzip"
              else zstandard.ZstdCompressor().compress(RECORDS))
    assert ce.decode(encoding, packed, len(RECORDS)) == RECORDS
    assert ce.decode(encoding, _zstd_stream(RECORDS) if encoding == "zstd" else packed,
                     len(RECORDS)) == RECORDS
    # Several frames or members in a row are one body.
    assert ce.decode(encoding, packed + packed, 2 * len(RECORDS)) == RECORDS * 2
    with pytest.raises(PayloadTooLarge):
        ce.decode(encoding, packed, len(RECORDS) - 1)


def _peak(refused: Callable[[], object]) -> int:
    """The most memory Python held while ``refused`` ran (and raised PayloadTooLarge)."""
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            refused()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_zstd_bomb_is_refused_before_it_is_inflated() -> None:
    # 1 GiB of zeros in a few KiB, in one frame that does not declare its size.
    bomb = _zstd_stream(bytes(MiB), pieces=1024)
    assert len(bomb) < 64 * 1024
    with pytest.raises(PayloadTooLarge, match="more than the limit of 1048576"):
        ce.decode("zstd", bomb, MiB)
    assert _peak(lambda: ce.decode("zstd", bomb, MiB)) < 8 * MiB
    # One that declares its size is refused by its header.
    declared = zstandard.ZstdCompressor().compress(bytes(64 * MiB))
    with pytest.raises(PayloadTooLarge, match="declares 67108864 bytes"):
        ce.decode("zstd", declared, MiB)


def test_a_gzip_bomb_is_refused_before_it_is_inflated() -> None:
    bomb = _zeros_gzip(1024 * MiB)
    assert len(bomb) < 2 * MiB
    assert _peak(lambda: ce.decode("gzip", bomb, MiB)) < 8 * MiB
    # One member of 64 MiB: refused within the member, not after it.
    with pytest.raises(PayloadTooLarge):
        ce.decode("gzip", gzip.compress(bytes(64 * MiB), 9), MiB)


@pytest.mark.parametrize("encoding,body", [
    ("zstd", b"not zstd at all"),
    ("zstd", zstandard.ZstdCompressor().compress(RECORDS)[:-7]),  # truncated frame
    ("zstd", zstandard.ZstdCompressor().compress(RECORDS) + b"trailing"),
    ("zstd", b""),
    ("gzip", b"not gzip at all"),
    ("gzip", gzip.compress(RECORDS)[:-20]),  # truncated member
    ("gzip", gzip.compress(RECORDS)[:-4] + b"\0\0\0\0"),  # wrong length in the trailer
], ids=["zstd-garbage", "zstd-truncated", "zstd-trailing", "zstd-empty", "gzip-garbage",
        "gzip-truncated", "gzip-wrong-length"])  # a gzip member carries its time: no ids of it
def test_a_stream_that_does_not_decode_is_invalid(encoding: str, body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        ce.decode(encoding, body, 16 * MiB)


def test_a_zstd_window_larger_than_decoders_must_support_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=27)
    writer = zstandard.ZstdCompressor(compression_params=params).compressobj()
    body = writer.compress(RECORDS) + writer.flush()
    with pytest.raises(InvalidRequest, match="window"):
        ce.decode("zstd", body, 16 * MiB)


def test_request_encodings_are_named_case_insensitively_and_others_refused() -> None:
    assert ce.request_encoding(None) == "identity"
    assert ce.request_encoding("identity") == "identity"
    assert ce.request_encoding(" ZSTD ") == "zstd"
    assert ce.request_encoding("x-gzip") == "gzip"
    for refused in ("br", "deflate", "gzip, zstd", "compress"):
        with pytest.raises(UnsupportedEncoding):
            ce.request_encoding(refused)


@pytest.mark.parametrize("header,chosen", [
    (None, None), ("", None), ("identity", None), ("br, deflate", None),
    ("gzip", "gzip"), ("zstd", "zstd"), ("gzip, zstd", "zstd"),
    ("zstd;q=0.5, gzip", "gzip"), ("zstd;q=0, gzip;q=0.1", "gzip"),
    ("zstd;q=0, gzip;q=0", None), ("*", "zstd"), ("*;q=0.2, zstd;q=0, gzip;q=0.1", "gzip"),
    ("GZIP;Q=1", "gzip"), ("zstd;q=nonsense, gzip", "gzip"), ("x-gzip", "gzip"),
])
def test_answer_encoding_honours_q_values(header: str | None, chosen: str | None) -> None:
    assert ce.answer_encoding(header) == chosen


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
def test_answers_and_streams_decode_with_standard_decoders(encoding: str) -> None:
    parts: list[bytes | memoryview] = [RECORDS[:1000], memoryview(RECORDS)[1000:]]
    packed = ce.compress(encoding, parts)
    plain = (gzip.decompress(packed) if encoding == "gzip"
             else zstandard.ZstdDecompressor().decompress(packed))
    assert plain == RECORDS
    # A stream's events each decode as soon as they arrive, before the stream ends.
    stream = ce.StreamCompressor(encoding)
    reader: zstandard.ZstdDecompressionObj | zlib._Decompress = (
        zstandard.ZstdDecompressor().decompressobj() if encoding == "zstd"
        else zlib.decompressobj(wbits=31))
    for event in (b"retry: 1000\n\n", RECORDS, b": heartbeat\n\n"):
        assert reader.decompress(stream.event(event)) == event
    assert reader.decompress(stream.end()) == b""
    assert reader.eof


def test_the_client_compresses_bodies_worth_it() -> None:
    packed, encoding = encode_body(RECORDS, "zstd")
    assert encoding == "zstd" and zstandard.ZstdDecompressor().decompress(packed) == RECORDS
    packed, encoding = encode_body(RECORDS, "gzip")
    assert encoding == "gzip" and gzip.decompress(packed) == RECORDS
    assert encode_body(RECORDS, "none") == (RECORDS, None)
    assert encode_body(RECORDS[:500], "zstd") == (RECORDS[:500], None)  # under 1 KiB
    noise = os.urandom(4096)
    assert encode_body(noise, "zstd") == (noise, None)  # would not shrink
