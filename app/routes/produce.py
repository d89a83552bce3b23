"""POST /produce."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from app.broker.state import BrokerState
from app.errors import LlogError, RoleDisabled, Unavailable
from app.routes.deps import broker_state
from app.routes.errors import RequestTooLarge
from app.routes.models import (
    ErrorResponse,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
)
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition

router = APIRouter(tags=["produce"])
@router.post(
    "/produce",
    response_model=ProduceResponse,
    summary="Append records to topic-partitions",
    responses={
        400: {"model": ErrorResponse, "description": "malformed JSON or invalid request"},
        409: {"model": ProduceResponse, "description": "some or all entries failed"},
        413: {"model": ErrorResponse, "description": "over a size or count limit"},
        503: {"model": ProduceResponse,
              "description": "every entry refused by back-pressure; see Retry-After"},
    },
)
async def produce(
    body: ProduceRequest, state: Annotated[BrokerState, Depends(broker_state)]
) -> JSONResponse:
    started = time.monotonic()
    s = state.settings
    total = sum(len(entry.records) for entry in body.topic_partitions)
    if total > s.max_records_per_request:
        raise RequestTooLarge(
            f"{total} records in one request; the limit is {s.max_records_per_request}"
        )
    groups: list[AppendGroup] = []
    for entry in body.topic_partitions:
        values = entry.record_bytes()
        for value in values:
            if len(value) > s.max_record_bytes:
                raise RequestTooLarge(
                    f"a record of {len(value)} bytes for {entry.topic}:{entry.partition} "
                    f"exceeds the limit of {s.max_record_bytes} bytes"
                )
        groups.append(AppendGroup(TopicPartition(entry.topic, entry.partition), values))

    outcomes: list[AppendResult | LlogError]
    if state.batcher is None:
        outcomes = [RoleDisabled("this broker does not have the write role")] * len(groups)
    else:
        try:
            outcomes = await state.batcher.submit(groups)
        except LlogError as exc:  # back-pressure or shutdown: nothing was written
            outcomes = [exc] * len(groups)

    results: list[ProducePartitionResult] = []
    for group, outcome in zip(groups, outcomes, strict=True):
        tp = group.tp
        if isinstance(outcome, AppendResult):
            results.append(ProducePartitionResult(
                topic=tp.topic, partition=tp.partition, ok=True,
                start_offset=outcome.start_offset, end_offset=outcome.end_offset,
                count=outcome.count, index_key=outcome.index_key, wal_uri=outcome.wal_uri,
            ))
            state.produce_metrics.records.inc(outcome.count)
            state.produce_metrics.bytes.inc(sum(len(r) for r in group.records))
        else:
            results.append(ProducePartitionResult(
                topic=tp.topic, partition=tp.partition, ok=False,
                error_type=outcome.error_type, error=str(outcome),
            ))
            state.produce_metrics.failed_entries.labels(outcome.error_type).inc()
    errors = sum(not r.ok for r in results)
    headers = {}
    if errors == 0:
        status = 200
    elif all(isinstance(o, Unavailable) for o in outcomes):
        status = 503
        headers["Retry-After"] = "1"
    else:
        status = 409
    response = ProduceResponse(results=results, success_count=len(results) - errors,
                               error_count=errors)
    state.produce_metrics.requests.labels(str(status)).inc()
    state.produce_metrics.latency.observe(time.monotonic() - started)
    return JSONResponse(response.model_dump(exclude_none=True), status_code=status,
                        headers=headers)

