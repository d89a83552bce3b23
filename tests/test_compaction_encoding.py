"""What compaction writes: bytes-batch-v3-chunked blobs (one bytes-batch-v3 body per row
of the chunk table) that read back exactly, append times included; bytes-batch-v2 when
a record has headers or when LLOG_COMPACTION_ENCODING says so. Real Oxia and MinIO."""

from __future__ import annotations

import struct

import pytest

from app.errors import CorruptData
from app.localstack.stack import LocalStack
from app.storage import codec, columnar
from app.storage.chunks import parse_chunks
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from tests.helpers.compaction import (
    append_each,
    compaction_settings,
    index_entries,
    make_compactor,
    read_with_times,
)
from tests.helpers.stack import Engine, open_engine


def _records(batch: int, n: int) -> list[Payload]:
    """Plain values, keys (empty too), producer timestamps, empty values: no headers."""
    out: list[Payload] = []
    for i in range(n):
        value = f"b{batch}-{i}-".encode() * (1 + i % 7)
        if i % 3 == 0:
            out.append(value)
        elif i % 3 == 1:
            out.append(LogRecord(value, key=f"k{i}".encode() if i % 2 else b""))
        else:
            out.append(LogRecord(b"" if i % 5 == 0 else value, timestamp_ms=1_700_000_000 + i))
    return out


async def _compact(e: Engine, tp: TopicPartition, **config: object) -> None:
    compactor = make_compactor(e, chunk_bytes=4096, **config)
    while (await compactor.compact_once(tp)).did_work:
        pass


async def test_plain_keyed_and_timed_records_compact_into_v3_chunks(
        stack: LocalStack, tp: TopicPartition) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, tp, [_records(b, 40 + b) for b in range(12)])
        before = await read_with_times(e, tp)
        await _compact(e, tp)
        (_, entry), = [(end, x) for end, x in await index_entries(e, tp)
                       if x.type == "COMPACTED"]
        assert entry.encoding == codec.ENCODING_V3_CHUNKED
        assert entry.chunks is not None and len(entry.chunks) > 4
        _, key = e.layout.parse_uri(entry.data_key)
        blob = await e.s3.get(key)
        assert entry.crc32c == codec.crc32c(blob) and entry.object_bytes == len(blob)
        # Every row is a whole bytes-batch-v3 body, carrying every record's append time.
        assert entry.object_bytes is not None
        for chunk in parse_chunks(entry.chunks, entry.msg_count, entry.object_bytes):
            body = blob[chunk.byte_offset:chunk.byte_end]
            assert codec.crc32c(body) == chunk.crc32c
            layout = columnar.read_columns(body)
            assert layout.count == chunk.end_record - chunk.first_record
            assert layout.append_times is not None and min(layout.append_times) > 0
            assert chunk.first_append_ms == layout.append_times[0]
        assert len(codec.decode_body(blob, entry.encoding, entry.msg_count)) == 12 * 40 + 66
        after = await read_with_times(e, tp)
    assert after == before


async def test_headers_or_the_setting_keep_compaction_in_v2(
        stack: LocalStack, tp: TopicPartition) -> None:
    headed = TopicPartition(tp.topic, tp.partition + 1)
    async with open_engine(compaction_settings(stack)) as e:
        await append_each(e, headed, [_records(0, 10), [LogRecord(b"h", headers=(("n", b"v"),))],
                                  _records(1, 10)])
        await append_each(e, tp, [_records(0, 10), _records(1, 10)])
        before = {t: await read_with_times(e, t) for t in (tp, headed)}
        await _compact(e, headed)
        await _compact(e, tp, encoding=codec.ENCODING_V2)
        for t in (tp, headed):
            (entry,) = [x for _, x in await index_entries(e, t) if x.type == "COMPACTED"]
            assert entry.encoding == codec.ENCODING_V2, t
            assert await read_with_times(e, t) == before[t]


def _chunked(*bodies: bytes) -> bytes:
    count = sum(columnar.read_columns(b).count for b in bodies)
    return struct.pack(">I", count) + b"".join(bodies)


def test_a_chunked_body_decodes_as_its_bodies_in_order() -> None:
    first = columnar.encode([b"a", LogRecord(b"b", key=b"k")])
    second = columnar.encode([b"c"])
    records = codec.decode_body(_chunked(first, second), codec.ENCODING_V3_CHUNKED, 3)
    assert records == [b"a", LogRecord(b"b", key=b"k"), b"c"]


@pytest.mark.parametrize("damage", [
    lambda body: body[:-1],                                      # truncated
    lambda body: body + b"\x00",                                 # trailing byte
    lambda body: struct.pack(">I", 4) + body[4:],                # count says more
    lambda body: body[:4] + b"\x00\x00\x00\x09" + body[8:],      # a body's count overruns
    lambda body: body[:8] + b"\x80" + body[9:],                  # unknown columns
])
def test_a_damaged_chunked_body_is_corrupt(damage: object) -> None:
    body = _chunked(columnar.encode([b"a", b"bb"]), columnar.encode([b"c"]))
    assert callable(damage)
    with pytest.raises(CorruptData):
        codec.decode_body(damage(body), codec.ENCODING_V3_CHUNKED, 3)
