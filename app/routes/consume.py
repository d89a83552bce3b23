"""POST /consume (long-poll)."""

from __future__ import annotations

import base64
import dataclasses
import re
import time
from collections.abc import Sequence
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response

from app.auth.rights import Right
from app.broker.answering import BINARY_FACTOR, JSON_FACTOR, AnswerHold
from app.broker.consume import Fetch
from app.broker.state import BrokerState
from app.errors import (
    InvalidRequest,
    LlogError,
    OffsetOutOfRange,
    PayloadTooLarge,
    RoleDisabled,
)
from app.routes.access import account, authorize, control_of
from app.routes.answer_compression import compress_answer
from app.routes.deps import broker_state, groups_of
from app.routes.disconnect import unless_disconnected
from app.routes.examples import CONSUME_REQUESTS, CONSUMED_ANSWERS
from app.routes.json_body import read_body
from app.routes.models import ConsumeRequest, ConsumeResults
from app.routes.offsets import lookup_all
from app.routes.openapi import (
    COMMIT_REFUSALS,
    Responses,
    error,
    errors,
    named,
    response,
    store_errors,
)
from app.routes.openapi_encoding import ACCEPT_ENCODING, compressible
from app.routes.parts_response import PartsResponse
from app.settings import Settings
from app.storage import runs
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_value
from app.storage.offsets import PartitionOffsets
from app.storage.reader import ReadOutcome, ReadResult
from app.wire import records as wire

router = APIRouter(tags=["consume"])
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"

# C0 controls other than tab, newline and carriage return mark bytes as binary.
_BINARY = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CONTROLS = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


def _text(value: bytes, encoding: str) -> str | None:
    """The bytes as text, when encoding is auto and they are UTF-8 without controls."""
    if encoding != "auto":
        return None
    if value.isascii():  # the common case, checked in C: a fifth of the regex's time
        if len(value.translate(None, _CONTROLS)) != len(value):
            return None
        return value.decode("ascii")
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _BINARY.search(text) else text


def _b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def _record(offset: int, payload: Payload, append_time_ms: int | None, encoding: str
            ) -> dict[str, Any]:
    """``value`` for text when encoding is auto, ``base64`` for anything else; likewise
    the key and each header of a record that has them (as :class:`ConsumedRecord`
    dumps without its unset fields)."""
    value = payload_value(payload)
    text = _text(value, encoding)
    out: dict[str, Any] = {"offset": offset}
    if text is not None:
        out["value"] = text
    else:
        out["base64"] = _b64(value)
    if isinstance(payload, LogRecord):
        if payload.key is not None:
            key = _text(payload.key, encoding)
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
    text = _text(value, encoding)
    return {"name": name, "value": text} if text is not None else {
        "name": name, "base64": _b64(value)}


def with_binary(answer: Responses) -> Responses:
    """The answer also in the binary format, for a request whose Accept names it."""
    ((status, entry),) = answer.items()
    entry.setdefault("content", {})[wire.CONTENT_TYPE] = {
        "schema": {"type": "string", "format": "binary"},
        "x-llog-format": "LLR1 (docs/http-api.md, Binary bodies); sent when the request's "
                         "Accept names it"}
    return answer


@router.post(
    "/consume",
    response_model=ConsumeResults,
    summary="Read records, waiting up to max_wait_ms for min_bytes",
    openapi_extra={"parameters": [ACCEPT_ENCODING]},
    responses={**compressible(with_binary(response(
                   200, "each partition's records, or why it could not be read",
                   ConsumeResults, CONSUMED_ANSWERS))),
               **errors(400),
               **error(409, *COMMIT_REFUSALS, description=(
                   "with commit: the group refuses this member's commit (it left, its "
                   "generation is stale, or a partition is not its own); nothing was read "
                   "or committed")),
               **errors(413), **store_errors(),
               **error(503, "RoleDisabled", "StorageUnavailable", "Unavailable",
                       description=(
                           "the broker lacks the read role, cannot reach its store, or its "
                           "answers in flight hold LLOG_MAX_ANSWER_BYTES_IN_FLIGHT for "
                           "longer than LLOG_ANSWER_BYTES_WAIT_MS (Unavailable); nothing "
                           "was read: retry after Retry-After"))},
)
async def consume(
    body: Annotated[ConsumeRequest, Body(openapi_examples=named(CONSUME_REQUESTS))],
    request: Request, state: Annotated[BrokerState, Depends(broker_state)],
) -> Response:
    return await serve(body, request, state)


async def consume_in_lane(request: Request) -> Response:
    """The same route, served by the hot lane (app/routes/hot_lane.py): the body read
    into its model as FastAPI would."""
    body = read_body(ConsumeRequest, await request.body(),
                     request.headers.get("content-type"))
    return await serve(body, request, request.app.state.broker)


async def serve(body: ConsumeRequest, request: Request, state: BrokerState) -> Response:
    """The answer, holding its share of the answer budget (app/broker/answering.py) from
    its first read until it has been sent; on any failure before that, given back."""
    binary = wire.wants_binary(request.headers.get("accept", ""))
    hold = (state.consume.answer(BINARY_FACTOR if binary else JSON_FACTOR)
            if state.consume is not None else None)
    try:
        return await _serve(body, request, state, hold, binary)
    except BaseException:
        if hold is not None:
            hold.release()
        raise


async def _serve(body: ConsumeRequest, request: Request, state: BrokerState,
                 hold: AnswerHold | None, binary: bool) -> Response:
    started = time.monotonic()
    authorize(request, Right.CONSUME, (e.topic for e in body.topic_partitions))
    if body.commit or any(e.fetch_offset == "committed" for e in body.topic_partitions):
        authorize(request, Right.GROUP, [_group(body)])
    fetches, refused = await _fetches(body, state)
    service = state.consume
    outcomes: list[ReadOutcome] = [
        RoleDisabled("this broker does not have the read role")] * len(fetches)
    if service is not None and hold is not None:
        if body.commit:  # a member that may not commit is refused before any wait
            await groups_of(state).offsets.authorise(
                _group(body), body.member_id, body.generation, [f.tp for f in fetches])
        refused.update(await _unknown(state, fetches, refused))
        readable = [f for i, f in enumerate(fetches) if i not in refused]
        answered = await unless_disconnected(request, lambda: service.consume_holding(
            hold, readable, max_wait_s=body.max_wait_ms / 1000, min_bytes=body.min_bytes,
            max_bytes=body.max_bytes)) if readable else ([],)
        if answered is None:  # the client went away; nobody reads this answer
            hold.release()
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        read = iter(answered[0])
        outcomes = [refused[i] if i in refused else next(read) for i in range(len(fetches))]
    committed = await _commit_delivered(state, body, fetches, outcomes) if body.commit else {}
    outcomes = [_unless_refused(o, committed.get(i)) for i, o in enumerate(outcomes)]
    _count(state, outcomes)
    parts: Sequence[bytes | memoryview]
    if binary:
        parts = wire.build_parts([
            _binary(f.tp, o) for f, o in zip(fetches, outcomes, strict=True)])
    else:
        parts = [orjson.dumps({"results": [
            _result(fetch.tp, outcome, body.encoding, committed.get(i))
            for i, (fetch, outcome) in enumerate(zip(fetches, outcomes, strict=True))]})]
    if hold is not None:  # from here the answer holds what it sends, until it is sent
        # (the raw size: compressed, the answer is smaller, and both exist meanwhile)
        hold.hold(sum(len(p) for p in parts))
    parts, encoding = await compress_answer(parts, request.headers.get("accept-encoding"),
                                            state.settings.answer_encodings)
    response = PartsResponse(parts, media_type=wire.CONTENT_TYPE if binary
                             else "application/json",
                             on_sent=hold.release if hold is not None else None,
                             content_encoding=encoding)
    if control_of(request) is not None:
        account(request, consumed=sum(o.size for o in outcomes if isinstance(o, ReadResult)))
    state.consume_metrics.requests.inc()
    state.consume_metrics.latency.observe(time.monotonic() - started)
    return response


async def _unknown(state: BrokerState, fetches: list[Fetch], refused: dict[int, LlogError]
                   ) -> dict[int, LlogError]:
    """The fetches of partitions that do not exist (when topics are not auto-created),
    by index, with their error (those ``refused`` already are not looked at)."""
    out: dict[int, LlogError] = {}
    if state.topics is None:
        return out
    for i, fetch in enumerate(fetches):
        if i in refused:
            continue
        try:
            await state.topics.check_readable(fetch.tp)
        except LlogError as exc:
            out[i] = exc
    return out


def _group(body: ConsumeRequest) -> str:
    assert body.group is not None  # the model requires it with committed and commit
    return body.group


async def _fetches(body: ConsumeRequest, state: BrokerState
                   ) -> tuple[list[Fetch], dict[int, LlogError]]:
    """The request as fetches, within the configured limits (400/413 otherwise), with
    "earliest", "latest" and "committed" resolved to offsets; the fetches that could
    not be resolved, by index, with their error."""
    fetches = _checked(body, state.settings)
    refused: dict[int, LlogError] = {}
    entries = body.topic_partitions
    named = [i for i, e in enumerate(entries) if e.fetch_offset in ("earliest", "latest")]
    if named:
        found = await lookup_all(state.reader, [(fetches[i].tp, None) for i in named])
        for i, where in zip(named, found, strict=True):
            if isinstance(where, PartitionOffsets):
                offset = (where.log_start if entries[i].fetch_offset == "earliest"
                          else where.high_watermark + 1)
                fetches[i] = dataclasses.replace(fetches[i], offset=offset)
    committed = [i for i, e in enumerate(entries) if e.fetch_offset == "committed"]
    if committed:
        positions = await groups_of(state).offsets.positions(
            _group(body), [fetches[i].tp for i in committed], body.auto_offset_reset)
        for i, position in zip(committed, positions, strict=True):
            if isinstance(position, LlogError):
                refused[i] = position
            else:
                fetches[i] = dataclasses.replace(fetches[i], offset=position)
    return fetches, refused


async def _commit_delivered(state: BrokerState, body: ConsumeRequest, fetches: list[Fetch],
                            outcomes: list[ReadOutcome]) -> dict[int, int | LlogError]:
    """Commit the last record delivered of each partition that delivered any, before
    the answer leaves (at-most-once); by index, the offset committed or why not."""
    delivered = [(i, fetch.tp, outcome.next_offset - 1) for i, (fetch, outcome)
                 in enumerate(zip(fetches, outcomes, strict=True))
                 if isinstance(outcome, ReadResult) and outcome.records]
    if not delivered:
        return {}
    done: list[int | LlogError]
    try:
        done = await groups_of(state).offsets.commit(
            _group(body), body.member_id, body.generation,
            [(tp, offset) for _, tp, offset in delivered], check_bounds=False)
    except LlogError as exc:  # the group changed while the request waited
        done = [exc] * len(delivered)
    return {i: outcome for (i, _, _), outcome in zip(delivered, done, strict=True)}


def _unless_refused(outcome: ReadOutcome, commit: int | LlogError | None) -> ReadOutcome:
    """A partition whose commit failed answers the error, not records it did not commit."""
    return commit if isinstance(commit, LlogError) else outcome


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
            raise InvalidRequest(f"a partition appears more than once ({tp}); name each "
                                 "partition once")
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


def _count(state: BrokerState, outcomes: list[ReadOutcome]) -> None:
    metrics = state.consume_metrics
    for outcome in outcomes:
        if isinstance(outcome, ReadResult):
            metrics.records.inc(len(outcome.records))
            metrics.bytes.inc(outcome.size)
        else:
            metrics.failed_entries.labels(outcome.error_type).inc()


def _error(tp: TopicPartition, outcome: LlogError) -> dict[str, Any]:
    """A failed partition, as :class:`ConsumePartitionResult` dumps it."""
    out: dict[str, Any] = {"topic": tp.topic, "partition": tp.partition, "ok": False,
                           "outcome": "failure",
                           "error_type": outcome.error_type, "error": str(outcome),
                           "retriable": outcome.retriable}
    if isinstance(outcome, OffsetOutOfRange):
        out["log_start_offset"] = outcome.log_start
        out["high_watermark"] = outcome.high_watermark
    return out


def _result(tp: TopicPartition, outcome: ReadOutcome, encoding: str,
            committed: int | LlogError | None = None) -> dict[str, Any]:
    if not isinstance(outcome, ReadResult):
        return _error(tp, outcome)
    out = {"topic": tp.topic, "partition": tp.partition, "ok": True, "outcome": "success",
           "high_watermark": outcome.high_watermark,
           "log_start_offset": outcome.log_start, "next_offset": outcome.next_offset,
           "records": [_record(o, v, t, encoding) for (o, v), t in zip(
               outcome.records, _times(outcome), strict=True)]}
    if isinstance(committed, int):
        out["committed_offset"] = committed
    return out


def _binary(tp: TopicPartition, outcome: ReadOutcome) -> wire.Records | wire.Failed:
    if not isinstance(outcome, ReadResult):
        return wire.Failed(tp.topic, tp.partition, _error(tp, outcome))
    first = runs.first_offset(outcome.records)
    n = len(outcome.records)
    times = outcome.append_times if len(outcome.append_times) == n else [0] * n
    return wire.Records(tp.topic, tp.partition, outcome.high_watermark, outcome.log_start,
                        outcome.next_offset, outcome.next_offset if first is None else first,
                        runs.payloads(outcome.records), times)
