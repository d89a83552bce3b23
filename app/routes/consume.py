"""POST /consume (long-poll)."""

from __future__ import annotations

import base64
import re
import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from app.broker.consume import Fetch, Outcome
from app.broker.state import BrokerState
from app.errors import LlogError, RoleDisabled
from app.routes.deps import broker_state
from app.routes.errors import error_body
from app.routes.models import (
    ConsumedRecord,
    ConsumePartitionResult,
    ConsumeRequest,
    ConsumeResponse,
    ErrorResponse,
)
from app.storage.keys import TopicPartition
from app.storage.reader import ReadResult

router = APIRouter(tags=["consume"])


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


async def _until_disconnect(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` when the client goes away (the body is already read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


@router.post(
    "/consume",
    response_model=ConsumeResponse,
    summary="Read records, waiting up to max_wait_ms for min_bytes",
    responses={400: {"model": ErrorResponse, "description": "invalid request"}},
)
async def consume(
    body: ConsumeRequest, request: Request,
    state: Annotated[BrokerState, Depends(broker_state)],
) -> Response:
    started = time.monotonic()
    ceiling = state.settings.max_wait_ms_ceiling
    if body.max_wait_ms > ceiling:
        return JSONResponse(error_body(
            "InvalidRequest", f"max_wait_ms {body.max_wait_ms} exceeds the ceiling of {ceiling}",
            [{"loc": "max_wait_ms", "msg": f"must be at most {ceiling}"}],
        ), status_code=400)
    fetches = [Fetch(TopicPartition(e.topic, e.partition), e.fetch_offset, e.partition_max_bytes)
               for e in body.topic_partitions]
    service = state.consume
    outcomes: list[Outcome] | None = None
    if service is None:
        outcomes = [RoleDisabled("this broker does not have the read role")] * len(fetches)
    else:
        async with anyio.create_task_group() as tg:
            async def run() -> None:
                nonlocal outcomes
                outcomes = await service.consume(
                    fetches, max_wait_s=body.max_wait_ms / 1000, min_bytes=body.min_bytes,
                    max_bytes=body.max_bytes,
                )
                tg.cancel_scope.cancel()

            tg.start_soon(run)
            tg.start_soon(_until_disconnect, request, tg.cancel_scope)
    if outcomes is None:  # the client went away; nobody reads this answer
        return Response(status_code=499)

    metrics = state.consume_metrics
    results: list[ConsumePartitionResult] = []
    for fetch, outcome in zip(fetches, outcomes, strict=True):
        tp = fetch.tp
        if isinstance(outcome, ReadResult):
            results.append(ConsumePartitionResult(
                topic=tp.topic, partition=tp.partition, ok=True,
                high_watermark=outcome.high_watermark, next_offset=outcome.next_offset,
                records=[_record(o, v, body.encoding) for o, v in outcome.records],
            ))
            metrics.records.inc(len(outcome.records))
            metrics.bytes.inc(outcome.size)
        else:
            assert isinstance(outcome, LlogError)
            results.append(ConsumePartitionResult(
                topic=tp.topic, partition=tp.partition, ok=False,
                error_type=outcome.error_type, error=str(outcome),
            ))
            metrics.failed_entries.labels(outcome.error_type).inc()
    metrics.requests.inc()
    metrics.latency.observe(time.monotonic() - started)
    return JSONResponse(ConsumeResponse(results=results).model_dump(exclude_none=True))
