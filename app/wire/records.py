"""``application/vnd.llog.records``: a consume answer as one binary body, chosen with
``Accept: application/vnd.llog.records``.

    "LLR1"
    u32  result count                   (one per requested partition, in request order)
    result:
      u16  topic length, topic
      u32  partition
      u8   ok                           (1, or 0 for an error)
      ok:
        i64  high watermark
        i64  log start offset
        i64  next offset
        i64  offset of the first record (records are consecutive)
        u8   encoding                   (3: bytes-batch-v3 with an append-time column;
                                         2: bytes-batch-v2, when a record has headers)
        u32  body length, body
      error:
        u32  length, JSON object        (what the JSON answer holds for a failed
                                         partition: error_type, error, retriable, ...)

All integers are big-endian.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.errors import CorruptData
from app.storage import codec, columnar
from app.storage.log_record import LogRecord, Payload
from app.storage.runs import RunPayloads

CONTENT_TYPE = "application/vnd.llog.records"
MAGIC = b"LLR1"
_HEAD = struct.Struct(">4sI")
_TOPIC = struct.Struct(">H")
_PARTITION_OK = struct.Struct(">IB")
_OK = struct.Struct(">qqqqBI")
_U32 = struct.Struct(">I")
_SEND_ALONE = 64 * 1024  # parts at least this large are sent as they are


def wants_binary(accept: str) -> bool:
    return CONTENT_TYPE in accept


@dataclass(frozen=True)
class Records:
    """One partition's records for the answer."""

    topic: str
    partition: int
    high_watermark: int
    log_start_offset: int
    next_offset: int
    first_offset: int
    records: Sequence[Payload]
    append_times: Sequence[int]


@dataclass(frozen=True)
class Failed:
    topic: str
    partition: int
    error: dict[str, Any]


def _stamped(records: Sequence[Payload], times: Sequence[int]) -> list[Payload]:
    return [LogRecord(p, append_time_ms=at) if isinstance(p, bytes) else
            dataclasses.replace(p, append_time_ms=at)
            for p, at in zip(records, times, strict=True)]


def _body(records: Sequence[Payload], times: Sequence[int]
          ) -> tuple[int, Sequence[bytes | memoryview]]:
    if isinstance(records, RunPayloads):  # runs of stored bodies: cut, not decoded
        cuts = records.records.v3_cuts()
        if cuts is not None:
            return 3, columnar.join_cuts(cuts, times)
    plain = columnar.encode_timed(records, times)  # the common case: columns as they are
    if plain is not None:
        return 3, [plain]
    stamped = _stamped(records, times)
    if columnar.encodable(stamped):
        return 3, [columnar.encode(stamped)]
    return 2, [codec.encode_batch_v2(stamped)]


def build(results: Sequence[Records | Failed]) -> bytes:
    return b"".join(build_parts(results))


def build_parts(results: Sequence[Records | Failed]) -> list[bytes | memoryview]:
    """The answer as parts to send one after the other: record bytes stay views of the
    bodies they were cut from (an answer of many MiB is not copied into one buffer);
    the small parts between them are joined."""
    parts: list[bytes | memoryview] = [_HEAD.pack(MAGIC, len(results))]
    for r in results:
        topic = r.topic.encode()
        parts += [_TOPIC.pack(len(topic)), topic,
                  _PARTITION_OK.pack(r.partition, isinstance(r, Records))]
        if isinstance(r, Records):
            encoding, body = _body(r.records, r.append_times)
            parts += [_OK.pack(r.high_watermark, r.log_start_offset, r.next_offset,
                               r.first_offset, encoding, sum(map(len, body))), *body]
        else:
            error = orjson.dumps(r.error)
            parts += [_U32.pack(len(error)), error]
    return _coalesced(parts)


def _coalesced(parts: list[bytes | memoryview]) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    for part in parts:
        if len(part) < _SEND_ALONE:
            small.append(part)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(part)
    if small:
        out.append(b"".join(small))
    return out


def parse(body: bytes) -> list[Records | Failed]:
    """The results of an answer (clients, tests and benchmarks)."""
    view = memoryview(body)
    if len(view) < _HEAD.size or bytes(view[:4]) != MAGIC:
        raise CorruptData("not an LLR1 answer")
    (count,) = _U32.unpack_from(view, 4)
    pos = _HEAD.size
    out: list[Records | Failed] = []
    try:
        for _ in range(count):
            (n,) = _TOPIC.unpack_from(view, pos)
            topic = bytes(view[pos + 2:pos + 2 + n]).decode()
            pos += 2 + n
            partition, ok = _PARTITION_OK.unpack_from(view, pos)
            pos += _PARTITION_OK.size
            if ok:
                hw, start, nxt, first, encoding, size = _OK.unpack_from(view, pos)
                pos += _OK.size
                records = codec.decode_body(view[pos:pos + size], codec.ENCODINGS[encoding - 1])
                pos += size
                out.append(Records(topic, partition, hw, start, nxt, first, records,
                                   [0 if isinstance(p, bytes) else p.append_time_ms
                                    for p in records]))
            else:
                (size,) = _U32.unpack_from(view, pos)
                out.append(Failed(topic, partition,
                                  orjson.loads(bytes(view[pos + 4:pos + 4 + size]))))
                pos += 4 + size
    except (struct.error, UnicodeDecodeError, orjson.JSONDecodeError, IndexError) as exc:
        raise CorruptData(f"malformed LLR1 answer: {exc}") from None
    return out
