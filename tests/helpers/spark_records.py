"""Records with keys, headers and timestamps for the Spark job tests: building them,
appending them, reading a partition back with every field, and what export writes for
each (a row of its Parquet output)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_value
from tests.helpers.compaction import make_compactor
from tests.helpers.stack import Engine

Row = dict[str, Any]


def rich(value: bytes, key: bytes | None = None, headers: Sequence[tuple[str, bytes]] = (),
         timestamp_ms: int | None = None) -> LogRecord:
    return LogRecord(value, key, tuple(headers), timestamp_ms)


def sample_records(tag: str, n: int) -> list[Payload]:
    """``n`` records, plain and rich in turn: every field present and absent, empty keys
    and header values, repeated header names, bytes that are not UTF-8."""
    out: list[Payload] = []
    for i in range(n):
        value = f"{tag}-{i}".encode()
        kind = i % 4
        if kind == 0:
            out.append(value)
        elif kind == 1:
            out.append(rich(value, key=f"k{i}".encode(), timestamp_ms=1_700_000_000_000 + i))
        elif kind == 2:
            out.append(rich(value + b"\xff", headers=[("h", b"x"), ("h", b""),
                                                      ("bin", bytes([i % 256, 0]))]))
        else:
            out.append(rich(value, key=b"", headers=[("only", b"1")], timestamp_ms=0))
    return out


async def read_back(e: Engine, tp: TopicPartition, offset: int
                    ) -> list[tuple[int, Payload, int]]:
    """``(offset, record, append time)`` from ``offset`` to the high watermark."""
    out: list[tuple[int, Payload, int]] = []
    while True:
        result = await e.reader.read(tp, offset)
        out += [(o, p, t) for (o, p), t in zip(result.records, result.append_times,
                                                strict=True)]
        if result.next_offset > result.high_watermark:
            return out
        assert result.records, f"{tp}: nothing read from {offset}"
        offset = result.next_offset


async def compact_entries(e: Engine, tp: TopicPartition, entries: int) -> None:
    """Run the real compactor once over the first ``entries`` entries at the cursor,
    in chunks of a few records (so chunked reads are exercised)."""
    compactor = make_compactor(e, min_entry_age_ms=0, max_entries=entries, chunk_bytes=64)
    outcome = await compactor.compact_once(tp)
    assert outcome.action == "compacted", outcome


def export_row(topic: str, partition: int, offset: int, record: Payload,
               append_time_ms: int) -> Row:
    """What export writes for a record (headers: an empty list when there are none)."""
    value = payload_value(record)
    try:
        text: str | None = value.decode()
    except UnicodeDecodeError:
        text = None
    full = record if isinstance(record, LogRecord) else None
    return {
        "topic": topic, "partition": partition, "offset": offset, "value": value,
        "value_utf8": text, "key": full.key if full else None,
        "headers": [{"name": n, "value": v} for n, v in full.headers] if full else [],
        "timestamp_ms": full.timestamp_ms if full else None,
        "append_time_ms": append_time_ms,
    }


def same_fields(record: Payload) -> tuple[bytes, bytes | None, tuple[Any, ...], int | None]:
    """A record's value, key, headers and timestamp (not its append time)."""
    if isinstance(record, bytes):
        return record, None, (), None
    return record.value, record.key, record.headers, record.timestamp_ms
