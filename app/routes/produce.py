"""POST /produce."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse

from app.broker.state import BrokerState
from app.broker.topics import TopicDirectory
from app.errors import LlogError, PayloadTooLarge, RoleDisabled, Unavailable
from app.routes.deps import broker_state
from app.routes.examples import PRODUCE_PARTLY, PRODUCE_REFUSED, PRODUCE_REQUESTS, PRODUCE_WRITTEN
from app.routes.models import (
    ErrorResponse,
    ProduceFailure,
    ProduceRequest,
    ProduceResponse,
    ProduceSuccess,
)
from app.routes.openapi import error, errors, named, response
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload, payload_size

router = APIRouter(tags=["produce"])


@router.post(
    "/produce",
    response_model=ProduceResponse,
    summary="Append records to topic-partitions",
    responses={
        **response(200, "every entry was written", ProduceResponse, PRODUCE_WRITTEN),
        **errors(400),
        **error(404, description="unknown topic or partition (topics are not created on "
                                 "use); nothing was written"),
        **response(409, "some entries failed, and not every one before writing: each "
                        "result says how; retry only those with ok false",
                   ProduceResponse, PRODUCE_PARTLY),
        **errors(413), **error(500, "CorruptData"),
        **response(503, "nothing was written: every entry was refused before writing "
                        "(results), or the request as a whole (error body)",
                   ProduceResponse | ErrorResponse, PRODUCE_REFUSED),
    },
)
async def produce(
    body: Annotated[ProduceRequest, Body(openapi_examples=named(PRODUCE_REQUESTS))],
    state: Annotated[BrokerState, Depends(broker_state)],
) -> JSONResponse:
    started = time.monotonic()
    if state.batcher is None or state.topics is None:
        outcomes: list[AppendOutcome] = [
            RoleDisabled("this broker does not have the write role")] * len(
            body.topic_partitions)
        groups = [AppendGroup(TopicPartition(e.topic, e.partition or 0), [])
                  for e in body.topic_partitions]
    else:
        groups = await _groups(body, state.settings, state.topics)
        try:
            outcomes = await state.batcher.submit(groups)
        except LlogError as exc:  # refused as a whole: nothing was written
            outcomes = [exc] * len(groups)
    results = [_result(state, group, outcome)
               for group, outcome in zip(groups, outcomes, strict=True)]
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


async def _groups(body: ProduceRequest, s: Settings, topics: TopicDirectory
                  ) -> list[AppendGroup]:
    """The request as append groups in their partitions, within the configured limits
    (413 otherwise), or refused as a whole (unknown topic or partition: 404)."""
    if len(body.topic_partitions) > s.max_partitions_per_request:
        raise PayloadTooLarge(f"{len(body.topic_partitions)} entries in one request; the "
                              f"limit is {s.max_partitions_per_request}")
    total = sum(len(entry.records) for entry in body.topic_partitions)
    if total > s.max_records_per_request:
        raise PayloadTooLarge(
            f"{total} records in one request; the limit is {s.max_records_per_request}")
    entries = [(entry, entry.payloads()) for entry in body.topic_partitions]
    for entry, payloads in entries:  # every limit first: refuse before creating a topic
        for payload in payloads:
            _check_record(entry.topic, payload, s, s.max_record_bytes)
    groups: list[AppendGroup] = []
    for entry, payloads in entries:
        where = await topics.place(entry.topic, entry.partition, payloads)
        if where.max_record_bytes is not None:
            for payload in payloads:
                _check_record(entry.topic, payload, s, where.max_record_bytes)
        groups.append(AppendGroup(where.tp, payloads, entry.idempotency_key))
    return groups


def _check_record(tp: str, payload: Payload, s: Settings, max_record_bytes: int) -> None:
    size = payload_size(payload)
    if size > max_record_bytes:
        raise PayloadTooLarge(f"a record of {size} bytes for {tp} exceeds the limit of "
                              f"{max_record_bytes} bytes")
    if isinstance(payload, bytes):
        return
    if payload.key is not None and len(payload.key) > s.max_key_bytes:
        raise PayloadTooLarge(f"a key of {len(payload.key)} bytes for {tp} exceeds the "
                              f"limit of {s.max_key_bytes} bytes")
    if len(payload.headers) > s.max_headers:
        raise PayloadTooLarge(f"{len(payload.headers)} headers on a record for {tp}; the "
                              f"limit is {s.max_headers}")
    header_bytes = sum(len(n.encode()) + len(v) for n, v in payload.headers)
    if header_bytes > s.max_header_bytes:
        raise PayloadTooLarge(f"headers of {header_bytes} bytes on a record for {tp} "
                              f"exceed the limit of {s.max_header_bytes} bytes")


def _result(state: BrokerState, group: AppendGroup, outcome: AppendOutcome
            ) -> ProduceSuccess | ProduceFailure:
    tp = group.tp
    metrics = state.produce_metrics
    if isinstance(outcome, AppendResult):
        if not outcome.duplicate:
            metrics.records.inc(outcome.count)
            metrics.bytes.inc(group.size)
        return ProduceSuccess(
            topic=tp.topic, partition=tp.partition, ok=True,
            start_offset=outcome.start_offset, end_offset=outcome.end_offset,
            count=outcome.count, index_key=outcome.index_key, wal_uri=outcome.wal_uri,
            duplicate=True if outcome.duplicate else None)
    metrics.failed_entries.labels(outcome.error_type).inc()
    return ProduceFailure(
        topic=tp.topic, partition=tp.partition, ok=False, error_type=outcome.error_type,
        error=str(outcome), retriable=outcome.retriable,
        maybe_written=outcome.maybe_written)
