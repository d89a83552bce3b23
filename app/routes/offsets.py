"""POST /offsets: where partitions start and end, and the offset for a time."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request

from app.auth.rights import Right
from app.broker.state import BrokerState
from app.errors import LlogError, PayloadTooLarge, RoleDisabled
from app.routes.access import authorize
from app.routes.deps import broker_state
from app.routes.models import (
    OffsetsFailure,
    OffsetsRequest,
    OffsetsResponse,
    OffsetsSuccess,
)
from app.routes.openapi import errors
from app.storage import offsets as storage_offsets
from app.storage.keys import TopicPartition
from app.storage.offsets import PartitionOffsets
from app.storage.reader import LogReader

router = APIRouter(tags=["offsets"])
# Lookups of one request at once (each is a few Oxia reads, at most one ranged GET).
LOOKUP_CONCURRENCY = 16


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
                       state: Annotated[BrokerState, Depends(broker_state)]
                       ) -> OffsetsResponse:
    authorize(request, Right.CONSUME, (e.topic for e in body.topic_partitions))
    s = state.settings
    if len(body.topic_partitions) > s.max_partitions_per_request:
        raise PayloadTooLarge(f"{len(body.topic_partitions)} partitions in one request; the "
                              f"limit is {s.max_partitions_per_request}")
    queries = [(TopicPartition(e.topic, e.partition), e.timestamp_ms)
               for e in body.topic_partitions]
    found = await lookup_all(state.reader, queries)
    return OffsetsResponse(results=[_result(tp, f) for (tp, _), f in
                                    zip(queries, found, strict=True)])


async def lookup_all(reader: LogReader | None,
                     queries: list[tuple[TopicPartition, int | None]]
                     ) -> list[PartitionOffsets | LlogError]:
    """Each query's offsets, or its error; at most LOOKUP_CONCURRENCY at once."""
    out: list[PartitionOffsets | LlogError] = [
        RoleDisabled("this broker does not have the read role")] * len(queries)
    if reader is None:
        return out
    limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)

    async def one(i: int, tp: TopicPartition, at_ms: int | None) -> None:
        async with limiter:
            try:
                out[i] = await storage_offsets.list_offsets(reader, tp, at_ms)
            except LlogError as exc:
                out[i] = exc

    async with anyio.create_task_group() as tg:
        for i, (tp, at_ms) in enumerate(queries):
            tg.start_soon(one, i, tp, at_ms)
    return out


def _result(tp: TopicPartition, found: PartitionOffsets | LlogError
            ) -> OffsetsSuccess | OffsetsFailure:
    if isinstance(found, LlogError):
        return OffsetsFailure(topic=tp.topic, partition=tp.partition, ok=False,
                              error_type=found.error_type, error=str(found),
                              retriable=found.retriable)
    return OffsetsSuccess(topic=tp.topic, partition=tp.partition, ok=True,
                          log_start_offset=found.log_start,
                          high_watermark=found.high_watermark, offset=found.for_time)
