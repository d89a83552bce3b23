"""Shared pieces of the compaction tests (no tests of its own).

Everything runs against the session's real Oxia and MinIO through ``open_engine``.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any

from app.compaction.compactor import CompactionConfig, Compactor, StepHook
from app.compaction.metrics import CompactionMetrics
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage import codec
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.metadata import Compaction, CompactionCursor, IndexEntry
from app.storage.stored import raw_body
from app.storage.topic_catalog import PARTITION_KEY
from app.storage.writer import LogWriter
from tests.helpers.stack import Engine, make_settings


def compaction_settings(stack: LocalStack, **overrides: Any) -> Settings:
    """Test settings: entries qualify at once (no minimum age), and a root prefix of
    their own, so what these tests leave behind (orphan blobs, a corrupted entry) never
    shows up in another test's scan of a root."""
    values: dict[str, Any] = {"compaction_min_entry_age_ms": 0,
                              "root_prefix": f"llog-c{uuid.uuid4().hex[:10]}"}
    values.update(overrides)
    return make_settings(stack, **values)


def make_compactor(e: Engine, *, metrics: CompactionMetrics | None = None,
                   crash_hook: StepHook | None = None, **config: Any) -> Compactor:
    settings = dataclasses.replace(CompactionConfig.from_settings(e.settings), **config)
    return Compactor(e.oxia, e.s3, e.layout, settings, metrics=metrics, crash_hook=crash_hook)


async def append_batches(writer: LogWriter, tp: TopicPartition, batches: int, per_batch: int,
                         tag: str = "r") -> dict[int, bytes]:
    """``batches`` separate appends; returns offset -> record of everything acknowledged."""
    acked: dict[int, bytes] = {}
    for b in range(batches):
        records = [f"{tag}-{b}-{i}".encode() for i in range(per_batch)]
        (result,) = await writer.append_shared([AppendGroup(tp, records)])
        assert isinstance(result, AppendResult), result
        acked.update(zip(range(result.start_offset, result.end_offset + 1), records,
                         strict=True))
    return acked


async def append_each(e: Engine, tp: TopicPartition, batches: list[list[Payload]]) -> None:
    """One append per batch, each acknowledged."""
    for records in batches:
        (result,) = await e.writer.append_shared([AppendGroup(tp, records)])
        assert isinstance(result, AppendResult), result


async def read_with_times(e: Engine, tp: TopicPartition, max_bytes: int = 2048
                          ) -> list[tuple[int, Payload, int]]:
    """(offset, record, append time) of the whole log, read in pages of ``max_bytes``."""
    out: list[tuple[int, Payload, int]] = []
    offset = 1
    while True:
        result = await e.reader.read(tp, offset, max_bytes=max_bytes)
        out += [(o, p, t) for (o, p), t in zip(result.records, result.append_times,
                                                 strict=True)]
        if result.next_offset > result.high_watermark:
            return out
        offset = result.next_offset


async def read_all(e: Engine, tp: TopicPartition, offset: int = 1) -> dict[int, bytes]:
    """Every record from ``offset`` to the high watermark, in as many reads as it takes."""
    out: dict[int, bytes] = {}
    while True:
        result = await e.reader.read(tp, offset)
        out.update(result.records)
        if result.next_offset > result.high_watermark:
            return out
        assert result.records, f"read from {offset} returned nothing below the watermark"
        offset = result.next_offset


async def index_entries(e: Engine, tp: TopicPartition) -> list[tuple[int, IndexEntry]]:
    records = await e.oxia.range_scan(e.layout.index_prefix(tp), e.layout.index_scan_end(tp),
                                      tp.partition_key)
    out = []
    for record in records:
        end = e.layout.index_end_offset(tp, record.key)
        assert end is not None
        out.append((end, IndexEntry.from_json(record.value)))
    return out


async def cursor_of(e: Engine, tp: TopicPartition) -> int:
    record = await e.oxia.get(e.layout.compaction_cursor(tp), tp.partition_key)
    return 1 if record is None else CompactionCursor.from_json(record.value).offset


async def compaction_record(e: Engine, tp: TopicPartition) -> Compaction | None:
    record = await e.oxia.get(e.layout.compaction(tp), tp.partition_key)
    return None if record is None else Compaction.from_json(record.value)


async def set_topic_compression(e: Engine, topic: str, compression: str | None,
                                level: int | None = None) -> None:
    """Put the topic's ``compression``/``compression_level`` in its catalog record
    (created if absent) as the topic routes store them (docs/protocol.md)."""
    key = e.layout.topic_record(topic)
    found = await e.oxia.get(key, PARTITION_KEY)
    record = (json.loads(found.value) if found is not None else
              {"topic": topic, "partitions": 1, "created_at_ms": 0})
    record.update(compression=compression, compression_level=level)
    await e.oxia.put(key, json.dumps(record).encode(), PARTITION_KEY)


@dataclass(frozen=True)
class Expected:
    """The end state of a partition compacted into the given COMPACTED ranges."""

    ranges: list[tuple[int, int]]
    wal_after: int = 0  # WAL entries expected beyond the last range
    codec: str | None = None  # of every COMPACTED entry (None: stored raw)


async def assert_compacted(e: Engine, tp: TopicPartition, expected: Expected) -> None:
    """Index = one COMPACTED entry per range (blob verified), then WAL entries; cursor
    past the last range; no compaction in flight."""
    entries = await index_entries(e, tp)
    compacted = entries[:len(expected.ranges)]
    assert [(end, entry.type) for end, entry in compacted] == [
        (end, "COMPACTED") for _, end in expected.ranges]
    for (start, end), (_, entry) in zip(expected.ranges, compacted, strict=True):
        assert entry.msg_count == end - start + 1
        assert entry.byte_offset is None and entry.byte_length is None
        _, key = e.layout.parse_uri(entry.data_key)
        assert key.startswith(e.layout.partition_prefix(tp) + "data/compacted/")
        stored = await e.s3.get(key)
        assert entry.crc32c == codec.crc32c(stored) and entry.codec == expected.codec
        body = raw_body(stored, entry)
        assert len(codec.decode_body(body, entry.encoding, entry.msg_count)) == entry.msg_count
    rest = entries[len(expected.ranges):]
    assert len(rest) == expected.wal_after and all(x.type == "WAL" for _, x in rest)
    assert await cursor_of(e, tp) == expected.ranges[-1][1] + 1
    assert await compaction_record(e, tp) is None
