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
from app.broker.assembly import Broker
from app.broker.loop_watchdog import ARRIVED
from app.broker.produce_call import COMMIT_DEADLINE_HEADER, ProduceCall, commit_deadline_ms
from app.errors import PayloadTooLarge
from app.routes.access import account, authorize, charge_produce, control_of, holds
from app.routes.examples import PRODUCE_PARTLY, PRODUCE_REFUSED, PRODUCE_REQUESTS, PRODUCE_WRITTEN
from app.routes.models import ErrorResponse, ProduceResults
from app.routes.openapi import error, errors, named, response
from app.routes.openapi_encoding import CONTENT_ENCODING, unsupported_encoding
from app.routes.produce_body import is_binary, parse_json, read_decoded
from app.settings import Settings
from app.wire import produce as wire

router = APIRouter(tags=["produce"])

# On 200 and 409 answers, with affinity on: the members' digest, as GET /cluster gives
# it, so a client that routes by the members' list knows when to fetch it again.
DIGEST_HEADER = "llog-cluster-digest"
DIGEST: dict[str, Any] = {DIGEST_HEADER: {
    "description": "with affinity on, the digest of the broker members (GET /cluster): "
                   "a client that routes by their list fetches it again when this differs",
    "schema": {"type": "string"}, "example": "a776846b461c"}}

COMMIT_DEADLINE: dict[str, Any] = {
    "name": "Llog-Commit-Deadline-Ms", "in": "header", "required": False,
    "description": "how long, from the request's arrival, its records may take to be "
                   "committed, in ms, when shorter than LLOG_PRODUCE_COMMIT_DEADLINE_MS "
                   "(a longer value counts as that): past it an entry is answered "
                   "ProduceExpired, not written, and never written later. Send the "
                   "client's timeout less a margin: a resend after the timeout then "
                   "cannot meet a late first copy (docs/http-api.md, Commit deadline). "
                   "Not a whole number of ms, at least 1: 400, nothing written",
    "schema": {"type": "integer", "minimum": 1}, "example": 9000}

REQUEST_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"$ref": "#/components/schemas/ProduceRequest"},
                         "examples": named(PRODUCE_REQUESTS)},
    wire.CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"},
                        "x-llog-format": "LLP1 (docs/http-api.md, Binary bodies)"},
}}, "parameters": [CONTENT_ENCODING, COMMIT_DEADLINE]}


@router.post(
    "/produce",
    response_model=ProduceResults,
    summary="Append records to topic-partitions",
    openapi_extra=REQUEST_BODY,
    responses={
        **response(200, "every entry was written", ProduceResults, PRODUCE_WRITTEN,
                   headers=DIGEST),
        **errors(400),
        **error(404, description="unknown topic or partition (topics are not created on "
                                 "use); nothing was written"),
        **response(409, "some entries failed, and not every one before writing: each "
                        "result says how; retry only those with ok false",
                   ProduceResults, PRODUCE_PARTLY, headers=DIGEST),
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
    # The answer of app/broker/produce_call.py for the body, parsed, of a caller allowed
    # to write to its topics. (A comment, not a docstring: FastAPI would publish a
    # docstring as the operation's description.)
    # The deadline counts from the request's arrival at the app (app/routes/hot_lane.py).
    started = request.scope.get(ARRIVED, time.monotonic())
    broker: Broker = request.app.state.broker  # assembled by the lifespan
    s = broker.settings
    deadline_ms = commit_deadline_ms(request.headers.get(COMMIT_DEADLINE_HEADER), s)
    body = await read_decoded(request, s.max_request_bytes)
    if is_binary(request.headers.get("content-type", "")):
        # Counted before anything is decoded: the limit bounds the decoding too.
        entries = wire.parse(body, s.max_partitions_per_request)
    else:
        entries = parse_json(body)
        PayloadTooLarge.unless_within(len(entries), s.max_partitions_per_request, "entries")
    authorize(request, Right.PRODUCE, (e.topic for e in entries))
    call = ProduceCall(broker.producing, entries,
                       charge=functools.partial(charge_produce, request),
                       located=_locations_shown(request, s), started=started,
                       deadline_ms=deadline_ms)
    answer = await call.answer()
    if control_of(request) is not None:
        account(request, produced=answer.produced)
    headers = {}
    if answer.errors == 0:
        status = 200
    elif answer.unavailable:
        status = 503
        headers["Retry-After"] = "1"
    else:
        status = 409
    digest = broker.members.digest()  # None outside a cluster
    if digest is not None and status != 503:
        # A routing client's cue that the members changed (declared on 200 and 409).
        headers[DIGEST_HEADER] = digest
    call.done(status)
    return Response(answer.body, status_code=status, headers=headers,
                    media_type="application/json")


def _locations_shown(request: Request, s: Settings) -> Callable[[str], bool]:
    """Whether the caller is told where an entry of a topic lives (``wal_uri``,
    ``index_key``): LLOG_PRODUCE_LOCATIONS, and for ``admin`` the caller's admin right on
    the topic (every caller holds it with auth off)."""
    if s.produce_locations == "all":
        return lambda _: True
    if s.produce_locations == "none":
        return lambda _: False
    return functools.cache(lambda topic: holds(request, Right.ADMIN, topic))
