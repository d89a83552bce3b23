"""Compacted chunks compressed with zstd when the topic asks for it: each chunk one frame
of its own, the chunk table's offsets and checksums those of the stored frames, every
record read back exactly (reader, JSON and binary consume), damage found before anything
is decompressed, and objects written before (no codec) read as they always were.
Real Oxia and MinIO for the store; pure pieces without."""

from __future__ import annotations

import contextlib
import json
import random
import struct
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import zstandard

from app.compaction.assemble import CompactedBody
from app.compaction.recompress import compaction_compression, compress_chunks
from app.errors import CorruptData
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage import codec, columnar
from app.storage.chunks import MAX_CHUNK_RAW_BYTES, Chunk, chunk_records, parse_chunks
from app.storage.compression import Codec, Compression
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.storage.metadata import IndexEntry
from app.storage.spans import Span
from app.storage.stored import raw_body
from app.wire import records as llr1
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.compaction import (
    append_each,
    compaction_settings,
    index_entries,
    make_compactor,
    read_with_times,
    set_topic_compression,
)
from tests.helpers.stack import Engine, open_engine

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
WANTS_BINARY = {"accept": llr1.CONTENT_TYPE}


def _events(batch: int, n: int) -> list[Payload]:
    """JSON events (they compress), some keyed, some with producer timestamps."""
    out: list[Payload] = []
    for i in range(n):
        value = json.dumps({"batch": batch, "seq": i, "path": "/api/v1/orders",
                            "status": 200 if i % 5 else 404, "user": f"user-{i % 17}",
                            "agent": "Mozilla/5.0 (X11; Linux x86_64)"}).encode()
        if i % 3 == 1:
            out.append(LogRecord(value, key=f"k{i % 4}".encode()))
        elif i % 3 == 2:
            out.append(LogRecord(value, timestamp_ms=1_700_000_000_000 + i))
        else:
            out.append(value)
    return out


async def _compact(e: Engine, tp: TopicPartition, **config: Any) -> IndexEntry:
    compactor = make_compactor(e, **{"chunk_bytes": 4096, **config})
    while (await compactor.compact_once(tp)).did_work:
        pass
    (entry,) = [x for _, x in await index_entries(e, tp) if x.type == "COMPACTED"]
    return entry


async def _stored(e: Engine, entry: IndexEntry) -> bytes:
    return await e.s3.get(e.layout.parse_uri(entry.data_key)[1])


@pytest.mark.parametrize("headers", [False, True], ids=["v3-chunked", "v2"])
async def test_a_zstd_topic_compacts_into_one_frame_per_chunk_that_reads_back(
        stack: LocalStack, tp: TopicPartition, headers: bool) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        batches = [_events(b, 30 + b) for b in range(10)]
        if headers:  # columns cannot hold headers: the object is bytes-batch-v2
            batches[3].append(LogRecord(b'{"traced": true}', headers=(("trace", b"t1"),)))
        await append_each(e, tp, batches)
        before = await read_with_times(e, tp, 4096)
        await set_topic_compression(e, tp.topic, "zstd", 1)
        entry = await _compact(e, tp)
        assert entry.codec == "zstd"
        assert entry.encoding == (codec.ENCODING_V2 if headers else codec.ENCODING_V3_CHUNKED)
        stored = await _stored(e, entry)
        assert entry.crc32c == codec.crc32c(stored) and entry.object_bytes == len(stored)
        assert entry.chunks is not None and entry.object_bytes is not None
        chunks = parse_chunks(entry.chunks, entry.msg_count, entry.object_bytes)
        assert len(chunks) > 2
        raw_size = 4
        for chunk in chunks:
            frame = stored[chunk.byte_offset:chunk.byte_end]
            # The row's offsets and checksum are those of the stored frame.
            assert frame[:4] == ZSTD_MAGIC and codec.crc32c(frame) == chunk.crc32c
            raw_size += len(zstandard.ZstdDecompressor().decompress(frame))
        assert len(stored) < raw_size * 0.5  # JSON events compress
        whole = raw_body(stored, entry)
        assert len(whole) == raw_size == entry.raw_length
        assert len(codec.decode_body(whole, entry.encoding, entry.msg_count)) == len(before)
        assert await read_with_times(e, tp, 4096) == before
        # What the cost estimate bills: the chunk bytes before and after zstd.
        counted = e.s3.metrics
        assert counted.stored_raw_bytes.labels("chunk")._value.get() == raw_size
        assert counted.stored_bytes.labels("chunk")._value.get() == len(stored)


async def test_a_topic_without_compression_keeps_raw_chunks_with_no_codec(
        stack: LocalStack, tp: TopicPartition) -> None:
    """What every release before compression wrote, and still reads: no codec field."""
    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, tp, [_events(b, 20) for b in range(6)])
        before = await read_with_times(e, tp, 4096)
        entry = await _compact(e, tp)
        assert entry.codec is None and b'"codec"' not in entry.to_json()
        stored = await _stored(e, entry)
        assert len(codec.decode_body(stored, entry.encoding, entry.msg_count)) == len(before)
        assert await read_with_times(e, tp, 4096) == before


async def test_records_that_do_not_compress_are_stored_raw_on_a_zstd_topic(
        stack: LocalStack, tp: TopicPartition) -> None:
    noise = random.Random(29)
    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, tp, [[noise.randbytes(300) for _ in range(20)] for _ in range(4)])
        before = await read_with_times(e, tp, 4096)
        await set_topic_compression(e, tp.topic, "zstd")
        entry = await _compact(e, tp)
        assert entry.codec is None
        assert await read_with_times(e, tp, 4096) == before


async def test_a_damaged_compressed_chunk_is_corrupt_before_it_is_decompressed(
        stack: LocalStack, tp: TopicPartition) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, tp, [_events(b, 30) for b in range(6)])
        await set_topic_compression(e, tp.topic, "zstd")
        entry = await _compact(e, tp)
        assert entry.codec == "zstd" and entry.chunks is not None
        key = e.layout.parse_uri(entry.data_key)[1]
        stored = bytearray(await e.s3.get(key))
        second = entry.chunks[1][1]
        # A byte of the frame's content, past its header: still a zstd frame that may
        # well decode (to other records), which only the stored checksum can tell.
        stored[second + 20] ^= 0x01
        await e.s3.put(key, bytes(stored))
        with pytest.raises(CorruptData, match="crc32c mismatch"):
            await read_with_times(e, tp, 4096)
        with pytest.raises(CorruptData, match="crc32c mismatch"):
            raw_body(bytes(stored), dataclass_copy(entry, crc32c=None))


def dataclass_copy(entry: IndexEntry, **changes: Any) -> IndexEntry:
    return IndexEntry.from_dict({**entry.to_dict(), **changes})


@contextlib.asynccontextmanager
async def _broker(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A broker in process, fresh (no tail cache or object cache of earlier reads)."""
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


async def _consume(http: httpx.AsyncClient, topic: str) -> tuple[list[Any], list[Any]]:
    """The partition read whole as JSON and as binary (LLR1) answers."""
    body = consume_body(topic, 1, max_bytes=16 * 1024 * 1024)
    r = await http.post("/consume", json=body)
    assert r.status_code == 200, r.text
    as_json = r.json()["results"][0]["records"]
    r = await http.post("/consume", json=body, headers=WANTS_BINARY)
    assert r.status_code == 200 and r.headers["content-type"] == llr1.CONTENT_TYPE
    (answer,) = llr1.parse(r.content)
    assert isinstance(answer, llr1.Records)
    return as_json, list(zip(answer.records, answer.append_times, strict=True))


async def test_json_and_binary_consume_read_compressed_compacted_chunks(
        stack: LocalStack, topic: str) -> None:
    settings = compaction_settings(stack)
    tp = TopicPartition(topic, 0)
    async with _broker(settings) as http:
        for b in range(8):
            events = [json.dumps({"n": b * 40 + i, "path": "/api/v1/items", "ok": True})
                      for i in range(40)]
            r = await http.post("/produce", json=produce_body(topic, *events))
            assert r.status_code == 200, r.text
    async with _broker(settings) as http:
        before = await _consume(http, topic)
    async with open_engine(settings) as e:
        await set_topic_compression(e, topic, "zstd")
        entry = await _compact(e, tp)
        assert entry.codec == "zstd"
    async with _broker(settings) as http:
        after = await _consume(http, topic)
    assert len(after[0]) == 320 and after == before


# -- pure pieces ---------------------------------------------------------------------


def _chunked_body(chunks: list[list[Payload]]) -> CompactedBody:
    bodies = [columnar.encode(records) for records in chunks]
    rows, at, first = [], 4, 0
    for records, body in zip(chunks, bodies, strict=True):
        rows.append([first, at, codec.crc32c(body), 1])
        at += len(body)
        first += len(records)
    merged = struct.pack(">I", first) + b"".join(bodies)
    return CompactedBody(merged, first, codec.crc32c(merged), rows, 1, 1,
                         codec.ENCODING_V3_CHUNKED)


def test_compress_chunks_keeps_record_count_and_times_and_decides_for_the_object() -> None:
    merged = _chunked_body([[b'{"a": "repeated text repeated text"}'] * 50] * 3)
    zstd = compress_chunks(merged, Compression(Codec.ZSTD, 6))
    assert zstd.codec is Codec.ZSTD and zstd.body[:4] == merged.body[:4]
    assert [r[0] for r in zstd.chunks] == [0, 50, 100] and all(r[3] == 1 for r in zstd.chunks)
    assert len(zstd.body) < len(merged.body) / 4
    assert zstd.raw_length == len(merged.body)
    entry = IndexEntry("COMPACTED", 150, "s3://b/k", codec.ENCODING_V3_CHUNKED,
                       crc32c=zstd.crc32c, object_bytes=len(zstd.body), chunks=zstd.chunks,
                       codec="zstd", raw_length=zstd.raw_length)
    assert raw_body(zstd.body, entry) == merged.body
    with pytest.raises(CorruptData, match="raw_length"):
        raw_body(zstd.body, dataclass_copy(entry, raw_length=len(merged.body) + 1))
    assert compress_chunks(merged, Compression()) is merged
    noise = _chunked_body([[random.Random(29).randbytes(4000)]])
    assert compress_chunks(noise, Compression(Codec.ZSTD, 3)) is noise


def test_a_read_plans_compressed_chunks_by_the_bytes_they_decompress_to() -> None:
    """A 1 MiB budget through chunks that compress tenfold takes about 1 MiB of
    records, not 10 MiB (the entry's raw_length shared among the stored chunks)."""
    rows = [[i * 10, 4 + i * 1000, 0, 1] for i in range(8)]
    raw = IndexEntry("COMPACTED", 80, "s3://b/k", codec.ENCODING_V3_CHUNKED,
                     object_bytes=8004, chunks=rows)
    packed = dataclass_copy(raw, codec="zstd", raw_length=80_040)
    assert Span(80, raw).chunks_cost(2, 3) == 2000
    assert Span(80, packed).chunks_cost(2, 3) == 20_000
    assert Span(80, raw).cost_from(41) == 4000
    assert Span(80, packed).cost_from(41) == 40_000
    # An entry without raw_length (or without codec) costs what is stored.
    assert Span(80, dataclass_copy(packed, raw_length=None)).cost_from(41) == 4000
    assert Span(80, dataclass_copy(packed, raw_length="80040")).cost_from(41) == 4000


def test_compaction_recompresses_above_the_topic_level_unless_told() -> None:
    assert compaction_compression(Compression(), None) == Compression()
    assert compaction_compression(Compression(), 9) == Compression()
    assert compaction_compression(Compression(Codec.ZSTD, 3), None) == Compression(
        Codec.ZSTD, 6)
    assert compaction_compression(Compression(Codec.ZSTD, 18), None).level == 19
    assert compaction_compression(Compression(Codec.ZSTD, 3), 1).level == 1


def test_a_chunk_frame_over_the_bound_is_refused_before_it_is_inflated() -> None:
    big = zstandard.ZstdCompressor().compress(b"\0" * (MAX_CHUNK_RAW_BYTES + 1))
    chunk = Chunk(0, 1, 4, 4 + len(big), codec.crc32c(big))
    with pytest.raises(CorruptData, match="over the limit"):
        chunk_records(big, chunk, codec.ENCODING_V3_CHUNKED, Codec.ZSTD)


def test_a_compressed_slice_needs_its_raw_length_and_decodes_to_it() -> None:
    body = codec.encode_batch([b"x" * 100] * 10)
    frame = zstandard.ZstdCompressor().compress(body)
    entry = IndexEntry("WAL", 10, "s3://b/k", crc32c=codec.crc32c(frame), byte_offset=8,
                       byte_length=len(frame), codec="zstd", raw_length=len(body))
    assert raw_body(frame, entry) == body
    for wrong in (None, len(body) - 1, len(body) + 1, str(len(body)), 0):
        with pytest.raises(CorruptData):
            raw_body(frame, dataclass_copy(entry, raw_length=wrong))
    with pytest.raises(CorruptData, match="unknown codec"):
        raw_body(frame, dataclass_copy(entry, codec="lz5"))


def test_the_compaction_level_setting_is_unset_when_empty_and_bounded() -> None:
    assert Settings(compaction_zstd_level="").compaction_zstd_level is None
    assert Settings(compaction_zstd_level="9").compaction_zstd_level == 9
    with pytest.raises(ValueError, match="compaction_zstd_level"):
        Settings(compaction_zstd_level="20")


async def test_large_compressed_chunks_decompress_in_a_worker_thread(
        stack: LocalStack, tp: TopicPartition, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of more than 64 KiB are decompressed off the event loop; small ones in
    place (a thread hop would cost more than they do)."""
    import app.storage.reader as reader_module

    offloaded: list[str] = []
    run_sync = reader_module.anyio.to_thread.run_sync

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        offloaded.append(fn.__name__)
        return await run_sync(fn, *args, **kwargs)

    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, tp, [_events(b, 400) for b in range(4)])
        before = await read_with_times(e, tp, 1 << 20)
        await set_topic_compression(e, tp.topic, "zstd")
        entry = await _compact(e, tp, chunk_bytes=96 * 1024)
        assert entry.codec == "zstd"
        monkeypatch.setattr(reader_module.anyio.to_thread, "run_sync", counting)
        assert await read_with_times(e, tp, 1 << 20) == before
        assert "decode" in offloaded
