"""POST /offsets: where partitions start and end, and the offset for a time (looked up
by app/broker/positions.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.auth.rights import Right
from app.broker.assembly import Broker
from app.broker.positions import Found
from app.errors import LlogError
from app.routes.access import authorize
from app.routes.deps import running_broker
from app.routes.models import (
    OffsetsFailure,
    OffsetsRequest,
    OffsetsResponse,
    OffsetsSuccess,
    OffsetsTopicPartition,
)
from app.routes.openapi import errors

router = APIRouter(tags=["offsets"])


@router.post(
    "/offsets",
    response_model=OffsetsResponse,
    response_model_exclude_none=True,
    summary="Log start and high watermark of partitions; the first offset at a time",
    responses={200: {"description": "each partition's offsets, or why they could not be "
                                    "found"},
               **errors(400, 413)},
)
async def list_offsets(body: OffsetsRequest, request: Request,
                       broker: Annotated[Broker, Depends(running_broker)]
                       ) -> OffsetsResponse:
    authorize(request, Right.CONSUME, (e.topic for e in body.topic_partitions))
    found = await broker.positions.lookup_within_limits(
        [(e.topic, e.partition, e.timestamp_ms) for e in body.topic_partitions])
    return OffsetsResponse(results=[_result(e, f) for e, f in
                                    zip(body.topic_partitions, found, strict=True)])


def _result(asked: OffsetsTopicPartition, found: Found
            ) -> OffsetsSuccess | OffsetsFailure:
    if isinstance(found, LlogError):
        return OffsetsFailure(topic=asked.topic, partition=asked.partition, ok=False,
                              error_type=found.error_type, error=str(found),
                              retriable=found.retriable)
    return OffsetsSuccess(topic=asked.topic, partition=asked.partition, ok=True,
                          log_start_offset=found.log_start,
                          high_watermark=found.high_watermark, offset=found.for_time)
