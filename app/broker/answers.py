"""The answers built by hand: each produce entry's and consume partition's result as the
answer models (app/routes/models.py) dump them, a consumed record as JSON for both
``POST /consume`` and the event stream, and a consumed partition in the binary format.

Built as dicts, not models, because validating and dumping a model per record costs
several times the rest of a small answer; tests/test_answer_shapes.py keeps each shape
byte for byte what its model dumps, so the OpenAPI document describes what is sent.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from typing import Any

import orjson

from app.errors import LlogError, OffsetOutOfRange
from app.storage import runs
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_value
from app.storage.reader import ReadOutcome, ReadResult
from app.wire import records as wire

# C0 controls other than tab, newline and carriage return mark bytes as binary.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROLS = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def text(value: bytes, encoding: str) -> str | None:
    """The bytes as text, when encoding is auto and they are UTF-8 without controls."""
    if encoding != "auto":
        return None
    if value.isascii():  # the common case, checked in C: a fifth of the regex's time
        if len(value.translate(None, _CONTROLS)) != len(value):
            return None
        return value.decode("ascii")
    try:
        decoded = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _BINARY.search(decoded) else decoded


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def record(offset: int, payload: Payload, append_time_ms: int | None, encoding: str
           ) -> dict[str, Any]:
    """``value`` for text when encoding is auto, ``base64`` for anything else; likewise
    the key and each header of a record that has them (as :class:`ConsumedRecord`
    dumps without its unset fields)."""
    value = payload_value(payload)
    shown = text(value, encoding)
    out: dict[str, Any] = {"offset": offset}
    if shown is not None:
        out["value"] = shown
    else:
        out["base64"] = _b64(value)
    if isinstance(payload, LogRecord):
        if payload.key is not None:
            key = text(payload.key, encoding)
            if key is not None:
                out["key"] = key
            else:
                out["key_base64"] = _b64(payload.key)
        if payload.headers:
            out["headers"] = [_header(n, v, encoding) for n, v in payload.headers]
        if payload.timestamp_ms is not None:
            out["timestamp_ms"] = payload.timestamp_ms
    if append_time_ms is not None:
        out["append_time_ms"] = append_time_ms
    return out


def _header(name: str, value: bytes, encoding: str) -> dict[str, str]:
    shown = text(value, encoding)
    return {"name": name, "value": shown} if shown is not None else {
        "name": name, "base64": _b64(value)}


def records(result: ReadResult, encoding: str) -> list[dict[str, Any]]:
    """The records of a read, each as :func:`record` shows it (with its append time,
    when the read knows one per record)."""
    times: list[int | None] = (list(result.append_times)
                               if len(result.append_times) == len(result.records)
                               else [None] * len(result.records))
    return [record(o, v, t, encoding)
            for (o, v), t in zip(result.records, times, strict=True)]


def consume_failure(tp: TopicPartition, outcome: LlogError) -> dict[str, Any]:
    """A failed partition, as :class:`ConsumePartitionResult` dumps it."""
    out: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "ok": False,
                           "outcome": "failure",
                           "error_type": outcome.error_type, "error": str(outcome),
                           "retriable": outcome.retriable}
    if isinstance(outcome, OffsetOutOfRange):
        out["log_start_offset"] = outcome.log_start
        out["high_watermark"] = outcome.high_watermark
    return out


def consume_result(tp: TopicPartition, outcome: ReadOutcome, encoding: str,
                   committed: int | LlogError | None = None) -> dict[str, Any]:
    """A partition of a consume answer, as :class:`ConsumePartitionResult` dumps it."""
    if not isinstance(outcome, ReadResult):
        return consume_failure(tp, outcome)
    out = {"topic": tp.topic, "partition": tp.partition, "ok": True, "outcome": "success",
           "high_watermark": outcome.high_watermark,
           "log_start_offset": outcome.log_start, "next_offset": outcome.next_offset,
           "records": records(outcome, encoding)}
    if isinstance(committed, int):
        out["committed_offset"] = committed
    return out


def consume_binary(tp: TopicPartition, outcome: ReadOutcome) -> wire.Records | wire.Failed:
    """A partition of a consume answer in the binary format (its failure: as JSON)."""
    if not isinstance(outcome, ReadResult):
        return wire.Failed(tp.topic, tp.partition, consume_failure(tp, outcome))
    first = runs.first_offset(outcome.records)
    n = len(outcome.records)
    times = outcome.append_times if len(outcome.append_times) == n else [0] * n
    return wire.Records(tp.topic, tp.partition, outcome.high_watermark, outcome.log_start,
                        outcome.next_offset, outcome.next_offset if first is None else first,
                        runs.payloads(outcome.records), times)


def produce_result(group: AppendGroup, outcome: AppendOutcome,
                   located: Callable[[str], bool]) -> dict[str, Any]:
    """One entry of a produce answer, as :class:`ProducePartitionResult` dumps it; where
    the entry lives (``index_key``, ``wal_uri``) only when ``located`` says so for its
    topic."""
    tp = group.tp
    if isinstance(outcome, AppendResult):
        result: dict[str, Any] = {
            "topic": tp.topic, "partition": tp.partition, "ok": True, "outcome": "success",
            "start_offset": outcome.start_offset, "end_offset": outcome.end_offset,
            "count": outcome.count}
        if located(tp.topic):
            result["index_key"] = outcome.index_key
            result["wal_uri"] = outcome.wal_uri
        if outcome.duplicate:
            result["duplicate"] = True
        return result
    return {"topic": tp.topic, "partition": tp.partition, "ok": False, "outcome": "failure",
            "error_type": outcome.error_type, "error": str(outcome),
            "retriable": outcome.retriable, "maybe_written": outcome.maybe_written}


def produce_answer(results: list[dict[str, Any]]) -> bytes:
    """A produce answer's body, as :class:`ProduceResults` dumps it."""
    errors = sum(not r["ok"] for r in results)
    return orjson.dumps({"results": results, "success_count": len(results) - errors,
                         "error_count": errors})


def consume_answer(results: list[dict[str, Any]]) -> bytes:
    """A JSON consume answer's body, as :class:`ConsumeResults` dumps it."""
    return orjson.dumps({"results": results})
