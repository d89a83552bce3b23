"""GET /topics/{topic}/stream: records as Server-Sent Events, for browsers and `curl -N`.

One ``records`` event per batch a read returns for one partition, its ``id`` the next
offset of every partition of the stream (``0:17,1:4``), so an EventSource that
reconnects with ``Last-Event-ID`` resumes exactly where it stopped. While nothing
arrives, a comment line every ``heartbeat_ms`` keeps proxies and the browser from
closing the connection. The next read starts only after the previous event was handed
to the connection, so a slow reader is paced by the socket, not buffered: one read of at
most ``max_bytes`` is all a stream holds. A draining broker ends its streams with an
``end`` event (the client reconnects elsewhere); an error a client must act on (an
offset below the log start, say) is an ``error`` event, and the stream ends. With access
control on, the stream's principal is re-checked while it runs (app/routes/stream_guard.py).
For a client that accepts zstd or gzip the stream is compressed, each event flushed whole
as it is sent (app/broker/answer_compression.py), so compression delays no event.
The stream itself (its checks, positions, slot and events) is app/broker/event_stream.py;
this route adds access control and the response around it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.auth.rights import Right
from app.broker.answer_compression import VARY, compress_events
from app.broker.assembly import Broker
from app.broker.event_stream import EventStream
from app.routes.access import account, authorize, control_of, principal_of
from app.routes.models import PathTopic
from app.routes.openapi import error, errors
from app.routes.openapi_encoding import ACCEPT_ENCODING, compressible
from app.routes.stream_guard import StreamGuard
from app.storage.keys import validate_topic
from app.wire.content_encoding import answer_encoding

router = APIRouter(tags=["consume"])
EVENTS_EXAMPLE = """retry: 1000

id: 0:3
event: records
data: {"partition":0,"next_offset":3,"high_watermark":2,"records":[{"offset":1,\
"value":"alpha","append_time_ms":1760000000000},{"offset":2,"base64":"AAE=",\
"append_time_ms":1760000000000}]}

: heartbeat

event: end
data: {"reason":"the broker is draining; reconnect (with Last-Event-ID) to another broker"}

"""

@router.get(
    "/topics/{topic}/stream",
    summary="Follow partitions as Server-Sent Events (text/event-stream)",
    response_class=StreamingResponse,
    openapi_extra={"parameters": [ACCEPT_ENCODING]},
    responses={**compressible({200: {
                   "description": "records, heartbeat comments, end and error events (with "
                                  "Accept-Encoding zstd or gzip: compressed, each event "
                                  "flushed whole)",
                   "content": {"text/event-stream": {"schema": {"type": "string"},
                                                     "example": EVENTS_EXAMPLE}}}}),
               **errors(400),
               **error(404, "UnknownTopic", "UnknownPartition", description=(
                   "an unknown topic or partition (topics are not created on use)")),
               **error(500, "CorruptData"),
               **error(503, "Unavailable", "ShuttingDown", "RoleDisabled",
                       "StorageUnavailable", description=(
                           "every stream slot is taken, the broker drains, lacks the read "
                           "role or cannot reach its store: retry after Retry-After, or "
                           "on another broker"))},
)
async def stream(
    request: Request,
    topic: PathTopic,
    partitions: Annotated[str, Query(description="comma-separated partitions")] = "0",
    start: Annotated[str, Query(alias="from", description=(
        "earliest, latest or an offset; 0 is the log start, as earliest is; or every "
        "partition's next offset as an event's id gives them (0:17,1:4), to resume "
        "where Last-Event-ID cannot be sent"))] = "latest",
    encoding: Annotated[str, Query(pattern="^(auto|base64)$")] = "auto",
    max_bytes: Annotated[int, Query(ge=1)] = 1024 * 1024,
    heartbeat_ms: Annotated[int, Query(ge=1000, le=60_000)] = 15_000,
    last_event_id: Annotated[str | None, Header()] = None,
    # Redeemed by AccessMiddleware before the handler runs; declared for the document.
    ticket: Annotated[str | None, Query(
        max_length=2048, description="with access control on, in place of the "
        "Authorization header: a ticket from POST /topics/{topic}/stream/tickets")] = None,
) -> StreamingResponse:
    broker: Broker = request.app.state.broker  # assembled by the lifespan
    validate_topic(topic)
    authorize(request, Right.CONSUME, [topic])
    stream = EventStream(broker.streaming, topic, encoding=encoding, max_bytes=max_bytes,
                         heartbeat_ms=heartbeat_ms, guard=_guard(request, topic),
                         consumed=lambda size: account(request, consumed=size))
    await stream.open(partitions, start, last_event_id)
    events = stream.events()
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Vary": VARY}
    compressed = answer_encoding(request.headers.get("accept-encoding"),
                                 broker.settings.answer_encodings)
    if compressed is not None:  # each event flushed whole: compressing buffers nothing
        events = compress_events(events, compressed)
        headers["Content-Encoding"] = compressed
    return _EventStream(events, release=stream.release, media_type="text/event-stream",
                        headers=headers)


def _guard(request: Request, topic: str) -> StreamGuard | None:
    """With access control on, what keeps re-checking the stream's principal (checked
    once here too: the auth file may have been reloaded since the request was
    authenticated)."""
    control, principal = control_of(request), principal_of(request)
    if control is None or principal is None:
        return None
    guard = StreamGuard(control, principal, topic)
    refused = guard.refusal()
    if refused is not None:
        raise refused
    return guard


class _EventStream(StreamingResponse):
    """Gives the stream slot back however the response ends, even when the client left
    before the first event (the generator's own cleanup would then never run)."""

    def __init__(self, content: AsyncIterator[bytes], *, release: Callable[[], None],
                 media_type: str, headers: dict[str, str]) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
