"""POST /consume (long-poll): the FastAPI route (which the OpenAPI document describes)
and the hot lane's (which serves it) adapt the request to one call of
app/broker/consume_call.py, and its answer to a response."""

from __future__ import annotations

import functools
import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import Response

from app.auth.rights import Right
from app.broker.assembly import Broker
from app.broker.consume_call import ConsumeCall, group_of, needs_group
from app.routes.access import account, authorize, control_of
from app.routes.deps import running_broker
from app.routes.disconnect import unless_disconnected
from app.routes.examples import CONSUME_REQUESTS, CONSUMED_ANSWERS
from app.routes.json_body import read_body
from app.routes.models import ConsumeRequest, ConsumeResults
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
from app.wire import records as wire

router = APIRouter(tags=["consume"])
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"


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
    request: Request, broker: Annotated[Broker, Depends(running_broker)],
) -> Response:
    return await serve(body, request, broker)


async def consume_in_lane(request: Request) -> Response:
    """The same route, served by the hot lane (app/routes/hot_lane.py): the body read
    into its model as FastAPI would."""
    body = read_body(ConsumeRequest, await request.body(),
                     request.headers.get("content-type"))
    return await serve(body, request, request.app.state.broker)


async def serve(body: ConsumeRequest, request: Request, broker: Broker) -> Response:
    """The answer of app/broker/consume_call.py, for a caller allowed to read (and with
    a group, to use its offsets)."""
    started = time.monotonic()  # the latency metric counts authorization, as before
    authorize(request, Right.CONSUME, (e.topic for e in body.topic_partitions))
    if needs_group(body):
        authorize(request, Right.GROUP, [group_of(body)])
    headers = request.headers
    answer = await ConsumeCall(
        broker.consuming, body, binary=wire.wants_binary(headers.get("accept", "")),
        accept_encoding=headers.get("accept-encoding"),
        until=functools.partial(unless_disconnected, request), started=started).answer()
    if answer is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    try:
        if control_of(request) is not None:
            account(request, consumed=answer.consumed)
        return PartsResponse(answer.parts, media_type=answer.media_type,
                             on_sent=answer.release, content_encoding=answer.content_encoding)
    except BaseException:  # not handed over: its share of the budget is given back here
        if answer.release is not None:
            answer.release()
        raise
