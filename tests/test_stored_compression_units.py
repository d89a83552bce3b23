"""Stored compression without servers: LLS1 header entries with a codec, the bounded
decoding of a stored slice, the records and settings that carry a topic's choice, and
that compressing and decompressing stay off the event loop."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from app.errors import CorruptData, InvalidRequest
from app.settings import ZSTD_LEVELS, Settings
from app.storage import codec, compression, slices, writer
from app.storage.compression import Codec, Compression
from app.storage.metadata import IndexEntry, Pending
from app.storage.spans import Span
from app.storage.topic_catalog import Topic, TopicConfig
from app.storage.topic_compression import parse_compression, topic_compression
from llog_client import _cli as cli_client

ZSTD = Compression(Codec.ZSTD)
TEXT = b"".join(b'{"user":"user-%d","path":"/api/v1/orders/%d","status":200}' % (i % 40, i)
                for i in range(2_000))


def _body(topic: str, data: bytes, how: Compression) -> codec.SliceBody:
    return codec.SliceBody(topic, 0, [data[:100], memoryview(data)[100:]], codec.ENCODING_V1,
                          1, how)


def test_a_blob_holds_compressed_and_raw_bodies_side_by_side() -> None:
    raw = codec.encode_batch([TEXT])
    blob, parts = codec.pack_shared_blob(
        [_body("a", raw, ZSTD), _body("b", raw, compression.NO_COMPRESSION)], 5)
    header = json.loads(blob[8:8 + int.from_bytes(blob[4:8], "big")])["partitions"]
    assert header[0]["codec"] == "zstd" and header[0]["raw_length"] == len(raw)
    assert header[0]["body_length"] < len(raw) // 5
    assert "codec" not in header[1] and "raw_length" not in header[1]
    zstd_part = parts[0]
    stored = blob[zstd_part.body_offset:zstd_part.body_offset + zstd_part.body_length]
    assert zstd_part.crc32c == codec.crc32c(stored)  # the CRC covers the stored bytes
    decoded = codec.decode_shared_blob(blob)
    assert [(p.codec, records) for p, records in decoded] == [
        (Codec.ZSTD, [TEXT]), (Codec.NONE, [TEXT])]
    again = codec.decode_shared_header(blob).parts
    assert (again[0].codec, again[0].raw_length, again[1].codec) == (
        Codec.ZSTD, len(raw), Codec.NONE)


def test_an_unknown_codec_in_a_header_is_corrupt() -> None:
    blob, _ = codec.pack_shared_blob([_body("a", codec.encode_batch([TEXT]), ZSTD)], 5)
    size = int.from_bytes(blob[4:8], "big")
    header = blob[8:8 + size].replace(b'"zstd"', b'"lz77"')
    with pytest.raises(CorruptData, match="unknown codec"):
        codec.decode_shared_header(blob[:8] + header + blob[8 + size:])


@pytest.mark.parametrize(("raw_length", "match"), [
    (None, "raw_length"), (True, "raw_length"), (2, "raw_length"),
    (codec.MAX_RAW_BODY_BYTES + 1, "raw_length"),
    (len(TEXT) - 1, "over the limit"), (len(TEXT) + 1, "entry says"),
])
def test_a_compressed_body_decodes_to_exactly_its_raw_length(raw_length: Any,
                                                             match: str) -> None:
    _, stored = compression.compress(TEXT, ZSTD)
    assert codec.raw_body(stored, codec.crc32c(stored), "zstd", len(TEXT)) == TEXT
    with pytest.raises(CorruptData, match=match):
        codec.raw_body(stored, codec.crc32c(stored), "zstd", raw_length)


def test_the_crc_is_checked_before_anything_is_decompressed() -> None:
    _, stored = compression.compress(TEXT, ZSTD)
    with pytest.raises(CorruptData, match="crc32c"):
        codec.raw_body(stored, codec.crc32c(stored) ^ 1, "zstd", len(TEXT))
    garbage = b"\x28\xb5\x2f\xfd" + bytes(64)  # a zstd magic, then nothing that decodes
    with pytest.raises(CorruptData, match="zstd"):
        codec.raw_body(garbage, codec.crc32c(garbage), "zstd", len(TEXT))
    raw = codec.encode_batch([b"x"])
    assert codec.raw_body(raw, codec.crc32c(raw), None, None) is raw  # no copy when raw


def test_pending_and_index_entries_carry_the_codec_and_read_old_records() -> None:
    pending = Pending("a", 1, 2, 2, "s3://b/k", byte_offset=8, byte_length=10,
                      codec="zstd", raw_length=99)
    entry = pending.index_entry()
    assert (entry.codec, entry.raw_length) == ("zstd", 99)
    assert json.loads(entry.to_json())["codec"] == "zstd"
    old = IndexEntry.from_json(b'{"type":"WAL","msg_count":2,"data_key":"s3://b/k",'
                               b'"byte_offset":8,"byte_length":10}')
    assert (old.codec, old.raw_length) == (None, None)
    assert "codec" not in json.loads(old.to_json())
    # A read plans by what records cost an answer: a compressed slice by its raw size.
    assert Span(2, entry).cost_from(1) == 99 and Span(2, old).cost_from(1) == 10


def test_a_topic_record_without_a_setting_is_uncompressed() -> None:
    old = Topic.from_json(b'{"topic":"t","partitions":1,"created_at_ms":1}', 3)
    assert old.config.stored_as() == compression.NO_COMPRESSION
    made = Topic("t", 1, TopicConfig(compression="zstd", compression_level=9).check(), 1)
    assert Topic.from_json(made.to_json(), 1).config.stored_as() == Compression(Codec.ZSTD, 9)
    with pytest.raises(CorruptData):
        Topic.from_json(b'{"topic":"t","partitions":1,"compression":"lz4"}', 3)


@pytest.mark.parametrize("text", ["lz4", "zstd:20", "zstd:-8", "none:1", "zstd:x", "ZSTD"])
def test_a_compression_setting_is_none_zstd_or_zstd_with_a_level(text: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_compression(text)
    with pytest.raises(ValueError, match="topic_default_compression"):
        Settings(topic_default_compression=text)


def test_the_settings_and_the_engine_agree_on_the_levels() -> None:
    assert (ZSTD_LEVELS.start, ZSTD_LEVELS.stop - 1) == (compression.ZSTD_MIN_LEVEL,
                                                         compression.ZSTD_MAX_LEVEL)
    assert parse_compression("zstd:-7") == ("zstd", -7)
    assert Settings(topic_default_compression="zstd:19").topic_default_compression == "zstd:19"
    assert Settings().topic_default_compression == "none"
    assert topic_compression("zstd", None) == ZSTD


def test_the_cli_reads_a_codec_and_its_level() -> None:
    assert cli_client._compression("zstd:5") == ("zstd", 5)
    assert cli_client._compression("none") == ("none", None)
    with pytest.raises(Exception, match="integer"):
        cli_client._compression("zstd:high")


def _threads_calling(monkeypatch: pytest.MonkeyPatch, module: Any, name: str
                     ) -> list[threading.Thread]:
    """The threads that call ``module.name`` from now on, one entry a call."""
    threads: list[threading.Thread] = []
    real = getattr(module, name)

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(module, name, spy)
    return threads


async def test_a_flush_compresses_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _threads_calling(monkeypatch, codec, "pack_shared_parts")
    raw = codec.encode_batch([TEXT])
    await writer._pack([_body("a", raw, compression.NO_COMPRESSION)], 1)
    await writer._pack([_body("a", raw, ZSTD)], 1)
    assert threads[0] is threading.current_thread()  # nothing to compress: in place
    assert threads[1] is not threading.current_thread()


async def test_a_large_slice_is_decompressed_in_a_worker_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    threads = _threads_calling(monkeypatch, slices, "slice_body")
    big = codec.encode_batch([TEXT * 2])
    assert len(big) > slices.INLINE_RAW_BYTES
    for raw in (codec.encode_batch([TEXT[:1000]]), big):
        _, stored = compression.compress(raw, ZSTD)
        entry = IndexEntry("WAL", 1, "s3://b/k", byte_offset=8, byte_length=len(stored),
                           crc32c=codec.crc32c(stored), codec="zstd", raw_length=len(raw))
        assert await slices.open_slice(stored, entry) == raw
    assert threads[0] is threading.current_thread()
    assert threads[1] is not threading.current_thread()


async def test_a_malformed_raw_length_in_an_entry_is_corrupt_data() -> None:
    _, stored = compression.compress(TEXT, ZSTD)
    entry = IndexEntry.from_json(json.dumps({
        "type": "WAL", "msg_count": 1, "data_key": "s3://b/k", "byte_offset": 8,
        "byte_length": len(stored), "crc32c": codec.crc32c(stored), "codec": "zstd",
        "raw_length": "many"}).encode())
    assert Span(1, entry).cost_from(1) == len(stored)
    with pytest.raises(CorruptData, match="raw_length"):
        await slices.open_slice(stored, entry)

