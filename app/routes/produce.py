"""POST /produce: JSON or the binary envelope in, a JSON answer out.

The body is read and parsed here rather than by FastAPI (app/routes/produce_body.py:
the common JSON shape without a model, binary envelopes checked by their columns); the
OpenAPI document still describes it with :class:`ProduceRequest`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.auth.rights import Right
from app.broker import answers
from app.broker.state import BrokerState
from app.broker.topics import TopicDirectory
from app.errors import LlogError, PayloadTooLarge, RoleDisabled, Unavailable
from app.routes.access import account, authorize, charge_produce, control_of, holds
from app.routes.examples import PRODUCE_PARTLY, PRODUCE_REFUSED, PRODUCE_REQUESTS, PRODUCE_WRITTEN
from app.routes.models import ErrorResponse, ProduceResults
from app.routes.openapi import error, errors, named, response
from app.routes.openapi_encoding import CONTENT_ENCODING, unsupported_encoding
from app.routes.produce_body import is_binary, parse_json, read_decoded
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import payload_size
from app.wire import produce as wire
from app.wire.produce import Entry

router = APIRouter(tags=["produce"])

REQUEST_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"},
                         "examples": named(PRODUCE_REQUESTS)},
    wire.CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"},
                        "x-llog-format": "LLP1 (docs/http-api.md, Binary bodies)"},
}}, "parameters": [CONTENT_ENCODING]}


@router.post(
    "/produce",
    response_model=ProduceResults,
    summary="Append records to topic-partitions",
    openapi_extra=REQUEST_BODY,
    responses={
        **response(200, "every entry was written", ProduceResults, PRODUCE_WRITTEN),
        **errors(400),
        **error(404, description="unknown topic or partition (topics are not created on "
                                 "use); nothing was written"),
        **response(409, "some entries failed, and not every one before writing: each "
                        "result says how; retry only those with ok false",
                   ProduceResults, PRODUCE_PARTLY),
        **error(413, description="over a size or count limit (a compressed body: its "
                                 "decoded size); nothing was written"),
        **unsupported_encoding(),
        **error(500, "CorruptData"),
        **response(503, "nothing was written: every entry was refused before writing "
                        "(results), or the request as a whole (error body)",
                   ProduceResults | ErrorResponse, PRODUCE_REFUSED),
    },
)
async def produce(request: Request) -> Response:
    started = time.monotonic()
    state: BrokerState = request.app.state.broker
    body = await read_decoded(request, state.settings.max_request_bytes)
    if is_binary(request.headers.get("content-type", "")):
        entries = wire.parse(body, state.settings.max_partitions_per_request)
    else:
        entries = parse_json(body)
    authorize(request, Right.PRODUCE, (e.topic for e in entries))
    outcomes: list[AppendOutcome]
    try:
        topics = state.write_topics()
    except RoleDisabled as exc:  # every entry answers the refusal
        outcomes = [exc] * len(entries)
        groups = [AppendGroup(TopicPartition(e.topic, e.partition or 0), e.records)
                  for e in entries]
    else:
        _check_limits(entries, state.settings)  # every limit first: before a topic is made
        charge_produce(request, sum(e.records.size for e in entries))
        groups = await _place(entries, state.settings, topics)
        try:
            outcomes = await state.append(groups)
        except LlogError as exc:  # refused as a whole: nothing was written
            outcomes = [exc] * len(groups)
    located = _locations_shown(request, state.settings)
    results = [answers.produce_result(group, outcome, located)
               for group, outcome in zip(groups, outcomes, strict=True)]
    _count(state, groups, outcomes)
    if control_of(request) is not None:
        account(request, produced=sum(g.size for g, o in zip(groups, outcomes, strict=True)
                                      if isinstance(o, AppendResult) and not o.duplicate))
    errors = sum(not r["ok"] for r in results)
    headers = {}
    if errors == 0:
        status = 200
    elif all(isinstance(o, Unavailable) for o in outcomes):
        status = 503
        headers["Retry-After"] = "1"
    else:
        status = 409
    content = answers.produce_answer(results)
    state.produce_metrics.requests.labels(str(status)).inc()
    state.produce_metrics.latency.observe(time.monotonic() - started)
    return Response(content, status_code=status, headers=headers,
                    media_type="application/json")


def _check_limits(entries: list[Entry], s: Settings) -> None:
    """The request within the configured limits (413 otherwise)."""
    if len(entries) > s.max_partitions_per_request:
        raise PayloadTooLarge(f"{len(entries)} entries in one request; the "
                              f"limit is {s.max_partitions_per_request}")
    total = sum(e.records.n_records for e in entries)
    if total > s.max_records_per_request:
        raise PayloadTooLarge(
            f"{total} records in one request; the limit is {s.max_records_per_request}")
    for entry in entries:
        _check_records(entry.topic, entry.records, s, s.max_record_bytes)


async def _place(entries: list[Entry], s: Settings, topics: TopicDirectory
                 ) -> list[AppendGroup]:
    """The entries as append groups in their partitions, or refused as a whole (unknown
    topic or partition: 404; a topic's own record limit: 413)."""
    groups: list[AppendGroup] = []
    for entry in entries:
        where = await topics.place(entry.topic, entry.partition, entry.records)
        if where.max_record_bytes is not None:
            _check_records(entry.topic, entry.records, s, where.max_record_bytes)
        groups.append(AppendGroup(where.tp, entry.records, entry.idempotency_key,
                                  where.compression))
    return groups


def _check_records(tp: str, records: RecordBatch, s: Settings, max_record_bytes: int
                   ) -> None:
    """Each record within the size limits: by columns for a bytes-batch-v3 body (no
    step per record), record by record otherwise."""
    columns = records.columns
    if columns is not None:
        largest = max(columns.record_sizes())
        if largest > max_record_bytes:
            raise PayloadTooLarge(f"a record of {largest} bytes for {tp} exceeds the limit "
                                  f"of {max_record_bytes} bytes")
        if columns.key_lengths is not None and max(columns.key_lengths) > s.max_key_bytes:
            raise PayloadTooLarge(f"a key of {max(columns.key_lengths)} bytes for {tp} "
                                  f"exceeds the limit of {s.max_key_bytes} bytes")
        return
    for payload in records:
        size = payload_size(payload)
        if size > max_record_bytes:
            raise PayloadTooLarge(f"a record of {size} bytes for {tp} exceeds the limit of "
                                  f"{max_record_bytes} bytes")
        if isinstance(payload, bytes):
            continue
        if payload.key is not None and len(payload.key) > s.max_key_bytes:
            raise PayloadTooLarge(f"a key of {len(payload.key)} bytes for {tp} exceeds the "
                                  f"limit of {s.max_key_bytes} bytes")
        if len(payload.headers) > s.max_headers:
            raise PayloadTooLarge(f"{len(payload.headers)} headers on a record for {tp}; "
                                  f"the limit is {s.max_headers}")
        header_bytes = sum(len(n.encode()) + len(v) for n, v in payload.headers)
        if header_bytes > s.max_header_bytes:
            raise PayloadTooLarge(f"headers of {header_bytes} bytes on a record for {tp} "
                                  f"exceed the limit of {s.max_header_bytes} bytes")


def _locations_shown(request: Request, s: Settings) -> Callable[[str], bool]:
    """Whether the caller is told where an entry of a topic lives (``wal_uri``,
    ``index_key``): LLOG_PRODUCE_LOCATIONS, and for ``admin`` the caller's admin right on
    the topic (every caller holds it with auth off)."""
    if s.produce_locations == "all":
        return lambda _: True
    if s.produce_locations == "none":
        return lambda _: False
    return functools.cache(lambda topic: holds(request, Right.ADMIN, topic))


def _count(state: BrokerState, groups: list[AppendGroup], outcomes: list[AppendOutcome]
           ) -> None:
    metrics = state.produce_metrics
    for group, outcome in zip(groups, outcomes, strict=True):
        if not isinstance(outcome, AppendResult):
            metrics.failed_entries.labels(outcome.error_type).inc()
        elif not outcome.duplicate:
            metrics.records.inc(outcome.count)
            metrics.bytes.inc(group.size)
