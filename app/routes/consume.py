"""POST /consume (long-poll)."""

from __future__ import annotations

import base64
import dataclasses
import re
import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse, Response

from app.broker.consume import Fetch
from app.broker.state import BrokerState
from app.errors import (
    InvalidRequest,
    LlogError,
    OffsetOutOfRange,
    PayloadTooLarge,
    RoleDisabled,
)
from app.routes.deps import broker_state
from app.routes.disconnect import unless_disconnected
from app.routes.examples import CONSUME_REQUESTS, CONSUMED_ANSWERS
from app.routes.models import (
    ConsumedHeader,
    ConsumedRecord,
    ConsumeFailure,
    ConsumeRequest,
    ConsumeResponse,
    ConsumeSuccess,
)
from app.routes.offsets import lookup_all
from app.routes.openapi import errors, named, response
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_value
from app.storage.offsets import PartitionOffsets
from app.storage.reader import ReadOutcome, ReadResult

router = APIRouter(tags=["consume"])
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"

# C0 controls other than tab, newline and carriage return mark bytes as binary.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _text(value: bytes, encoding: str) -> str | None:
    """The bytes as text, when encoding is auto and they are UTF-8 without controls."""
    if encoding != "auto":
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _BINARY.search(text) else text


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _record(offset: int, payload: Payload, append_time_ms: int | None, encoding: str
            ) -> ConsumedRecord:
    """``value`` for text when encoding is auto, ``base64`` for anything else; likewise
    the key and each header of a record that has them."""
    value = payload_value(payload)
    text = _text(value, encoding)
    out = ConsumedRecord(offset=offset, value=text,
                         base64=None if text is not None else _b64(value),
                         append_time_ms=append_time_ms)
    if isinstance(payload, LogRecord):
        if payload.key is not None:
            key = _text(payload.key, encoding)
            out.key, out.key_base64 = key, None if key is not None else _b64(payload.key)
        if payload.headers:
            out.headers = [_header(n, v, encoding) for n, v in payload.headers]
        out.timestamp_ms = payload.timestamp_ms
    return out


def _header(name: str, value: bytes, encoding: str) -> ConsumedHeader:
    text = _text(value, encoding)
    return ConsumedHeader(name=name, value=text,
                          base64=None if text is not None else _b64(value))


@router.post(
    "/consume",
    response_model=ConsumeResponse,
    summary="Read records, waiting up to max_wait_ms for min_bytes",
    responses={**response(200, "each partition's records, or why it could not be read",
                          ConsumeResponse, CONSUMED_ANSWERS),
               **errors(400, 413)},
)
async def consume(
    body: Annotated[ConsumeRequest, Body(openapi_examples=named(CONSUME_REQUESTS))],
    request: Request, state: Annotated[BrokerState, Depends(broker_state)],
) -> Response:
    started = time.monotonic()
    fetches = await _fetches(body, state)
    service = state.consume
    outcomes: list[ReadOutcome] = [
        RoleDisabled("this broker does not have the read role")] * len(fetches)
    if service is not None:
        refused = await _unknown(state, fetches)
        readable = [f for i, f in enumerate(fetches) if i not in refused]
        answered = await unless_disconnected(request, lambda: service.consume(
            readable, max_wait_s=body.max_wait_ms / 1000, min_bytes=body.min_bytes,
            max_bytes=body.max_bytes)) if readable else ([],)
        if answered is None:  # the client went away; nobody reads this answer
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        read = iter(answered[0])
        outcomes = [refused[i] if i in refused else next(read) for i in range(len(fetches))]
    results = [_result(state, fetch.tp, outcome, body.encoding)
               for fetch, outcome in zip(fetches, outcomes, strict=True)]
    state.consume_metrics.requests.inc()
    state.consume_metrics.latency.observe(time.monotonic() - started)
    return JSONResponse(ConsumeResponse(results=results).model_dump(exclude_none=True))


async def _unknown(state: BrokerState, fetches: list[Fetch]) -> dict[int, LlogError]:
    """The fetches of partitions that do not exist (when topics are not auto-created),
    by index, with their error."""
    out: dict[int, LlogError] = {}
    if state.topics is None:
        return out
    for i, fetch in enumerate(fetches):
        try:
            await state.topics.check_readable(fetch.tp)
        except LlogError as exc:
            out[i] = exc
    return out


async def _fetches(body: ConsumeRequest, state: BrokerState) -> list[Fetch]:
    """The request as fetches, within the configured limits (400/413 otherwise), with
    "earliest" and "latest" resolved to offsets."""
    fetches = _checked(body, state.settings)
    named = [i for i, e in enumerate(body.topic_partitions) if isinstance(e.fetch_offset, str)]
    if not named:
        return fetches
    found = await lookup_all(state.reader, [(fetches[i].tp, None) for i in named])
    for i, where in zip(named, found, strict=True):
        if isinstance(where, PartitionOffsets):
            offset = (where.log_start if body.topic_partitions[i].fetch_offset == "earliest"
                      else where.high_watermark + 1)
            fetches[i] = dataclasses.replace(fetches[i], offset=offset)
    return fetches


def _checked(body: ConsumeRequest, s: Settings) -> list[Fetch]:
    """The request as fetches, within the configured limits (400/413 otherwise)."""
    if body.max_wait_ms > s.max_wait_ms_ceiling:
        raise InvalidRequest(f"max_wait_ms {body.max_wait_ms} exceeds the ceiling of "
                             f"{s.max_wait_ms_ceiling}")
    if len(body.topic_partitions) > s.max_partitions_per_request:
        raise PayloadTooLarge(f"{len(body.topic_partitions)} partitions in one request; the "
                              f"limit is {s.max_partitions_per_request}")
    if body.max_bytes > s.max_fetch_bytes:
        raise InvalidRequest(f"max_bytes {body.max_bytes} exceeds the limit of "
                             f"{s.max_fetch_bytes}")
    fetches: list[Fetch] = []
    seen: set[TopicPartition] = set()
    for entry in body.topic_partitions:
        tp = TopicPartition(entry.topic, entry.partition)
        if tp in seen:
            raise InvalidRequest(f"{tp} appears more than once; name each partition once")
        seen.add(tp)
        if entry.partition_max_bytes is not None and entry.partition_max_bytes > s.max_fetch_bytes:
            raise InvalidRequest(f"partition_max_bytes {entry.partition_max_bytes} for {tp} "
                                 f"exceeds the limit of {s.max_fetch_bytes}")
        # A named position is resolved by the caller; 0 (the log start) until then.
        offset = entry.fetch_offset if isinstance(entry.fetch_offset, int) else 0
        fetches.append(Fetch(tp, offset, entry.partition_max_bytes))
    return fetches


def _times(result: ReadResult) -> list[int | None]:
    if len(result.append_times) == len(result.records):
        return list(result.append_times)
    return [None] * len(result.records)


def _result(state: BrokerState, tp: TopicPartition, outcome: ReadOutcome, encoding: str
            ) -> ConsumeSuccess | ConsumeFailure:
    metrics = state.consume_metrics
    if isinstance(outcome, ReadResult):
        metrics.records.inc(len(outcome.records))
        metrics.bytes.inc(outcome.size)
        return ConsumeSuccess(
            topic=tp.topic, partition=tp.partition, ok=True,
            high_watermark=outcome.high_watermark, log_start_offset=outcome.log_start,
            next_offset=outcome.next_offset,
            records=[_record(o, v, t, encoding) for (o, v), t in zip(
                outcome.records, _times(outcome), strict=True)])
    assert isinstance(outcome, LlogError)
    metrics.failed_entries.labels(outcome.error_type).inc()
    bounds = outcome if isinstance(outcome, OffsetOutOfRange) else None
    return ConsumeFailure(
        topic=tp.topic, partition=tp.partition, ok=False, error_type=outcome.error_type,
        error=str(outcome), retriable=outcome.retriable,
        log_start_offset=bounds.log_start if bounds else None,
        high_watermark=bounds.high_watermark if bounds else None)
