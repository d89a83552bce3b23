"""POST /consume (long-poll)."""

from __future__ import annotations

import base64
import re
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from app.broker.consume import Fetch
from app.broker.state import BrokerState
from app.errors import InvalidRequest, LlogError, PayloadTooLarge, RoleDisabled
from app.routes.deps import broker_state
from app.routes.disconnect import unless_disconnected
from app.routes.models import (
    ConsumedRecord,
    ConsumePartitionResult,
    ConsumeRequest,
    ConsumeResponse,
    ErrorResponse,
)
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.reader import ReadOutcome, ReadResult

router = APIRouter(tags=["consume"])
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"

# C0 controls other than tab, newline and carriage return mark bytes as binary.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _record(offset: int, value: bytes, encoding: str) -> ConsumedRecord:
    """``value`` for UTF-8 text when encoding is auto, ``base64`` for anything else."""
    if encoding == "auto":
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            if not _BINARY.search(text):
                return ConsumedRecord(offset=offset, value=text)
    return ConsumedRecord(offset=offset, base64=base64.b64encode(value).decode())


@router.post(
    "/consume",
    response_model=ConsumeResponse,
    summary="Read records, waiting up to max_wait_ms for min_bytes",
    responses={400: {"model": ErrorResponse, "description": "invalid request"},
               413: {"model": ErrorResponse, "description": "too many partitions"}},
)
async def consume(
    body: ConsumeRequest, request: Request,
    state: Annotated[BrokerState, Depends(broker_state)],
) -> Response:
    started = time.monotonic()
    fetches = _fetches(body, state.settings)
    service = state.consume
    if service is None:
        outcomes: list[ReadOutcome] = [
            RoleDisabled("this broker does not have the read role")] * len(fetches)
    else:
        answered = await unless_disconnected(request, lambda: service.consume(
            fetches, max_wait_s=body.max_wait_ms / 1000, min_bytes=body.min_bytes,
            max_bytes=body.max_bytes))
        if answered is None:  # the client went away; nobody reads this answer
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        (outcomes,) = answered
    results = [_result(state, fetch.tp, outcome, body.encoding)
               for fetch, outcome in zip(fetches, outcomes, strict=True)]
    state.consume_metrics.requests.inc()
    state.consume_metrics.latency.observe(time.monotonic() - started)
    return JSONResponse(ConsumeResponse(results=results).model_dump(exclude_none=True))


def _fetches(body: ConsumeRequest, s: Settings) -> list[Fetch]:
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
        fetches.append(Fetch(tp, entry.fetch_offset, entry.partition_max_bytes))
    return fetches


def _result(state: BrokerState, tp: TopicPartition, outcome: ReadOutcome, encoding: str
            ) -> ConsumePartitionResult:
    metrics = state.consume_metrics
    if isinstance(outcome, ReadResult):
        metrics.records.inc(len(outcome.records))
        metrics.bytes.inc(outcome.size)
        return ConsumePartitionResult(
            topic=tp.topic, partition=tp.partition, ok=True,
            high_watermark=outcome.high_watermark, next_offset=outcome.next_offset,
            records=[_record(o, v, encoding) for o, v in outcome.records])
    assert isinstance(outcome, LlogError)
    metrics.failed_entries.labels(outcome.error_type).inc()
    return ConsumePartitionResult(
        topic=tp.topic, partition=tp.partition, ok=False, error_type=outcome.error_type,
        error=str(outcome), retriable=outcome.retriable)
