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
as it is sent (app/routes/answer_compression.py), so compression delays no event.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import anyio
import orjson
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.auth.rights import Right
from app.broker.answering import JSON_FACTOR, AnswerHold
from app.broker.consume import Fetch
from app.broker.state import BrokerState
from app.errors import InvalidRequest, LlogError, RoleDisabled, ShuttingDown, Unavailable
from app.routes.access import account, authorize, control_of, principal_of
from app.routes.answer_compression import VARY, compress_events
from app.routes.consume import _record, _times
from app.routes.models import PathTopic
from app.routes.offsets import lookup_all
from app.routes.openapi import error, errors
from app.routes.openapi_encoding import ACCEPT_ENCODING, compressible
from app.routes.stream_guard import StreamGuard
from app.storage.keys import TopicPartition, validate_topic
from app.storage.offsets import PartitionOffsets
from app.storage.reader import ReadOutcome, ReadResult
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
MAX_STREAM_PARTITIONS = 256
# How long a stream waits before reading again when the answer budget had no room for
# its read: what a 503 from /consume tells a client (Retry-After: 1).
RETRY_AFTER_S = 1.0
DRAINING = "the broker is draining; reconnect (with Last-Event-ID) to another broker"
_POSITION = re.compile(r"(\d{1,10}):(\d{1,19})")


def _partitions(raw: str) -> list[int]:
    try:
        parts = [int(p) for p in raw.split(",")]
    except ValueError:
        raise InvalidRequest(f"partitions {raw!r}: a comma-separated list of "
                             "partition numbers") from None
    if not parts or len(parts) > MAX_STREAM_PARTITIONS or len(set(parts)) != len(parts):
        raise InvalidRequest(f"partitions: 1 to {MAX_STREAM_PARTITIONS} distinct partitions")
    if any(not 0 <= p < 2**31 for p in parts):
        raise InvalidRequest("partitions are 0 .. 2147483647")
    return parts


def _resume(last_event_id: str, partitions: list[int]) -> dict[int, int]:
    """Next offsets from a ``Last-Event-ID`` this stream sent."""
    found: dict[int, int] = {}
    for item in last_event_id.split(","):
        m = _POSITION.fullmatch(item.strip())
        if m is None:
            raise InvalidRequest(f"Last-Event-ID {last_event_id!r} is not one this "
                                 "stream sent")
        found[int(m.group(1))] = int(m.group(2))
    if set(found) != set(partitions):
        raise InvalidRequest("Last-Event-ID names other partitions than the stream")
    return found


async def _starts(state: BrokerState, topic: str, partitions: list[int], start: str
                  ) -> dict[int, int]:
    if start.isdigit():
        return dict.fromkeys(partitions, max(1, int(start)))
    if start not in ("earliest", "latest"):
        raise InvalidRequest(f"from {start!r}: earliest, latest or an offset")
    assert state.reader is not None
    found = await lookup_all(state.reader, [(TopicPartition(topic, p), None)
                                            for p in partitions])
    out: dict[int, int] = {}
    for p, where in zip(partitions, found, strict=True):
        if not isinstance(where, PartitionOffsets):
            raise where
        out[p] = where.log_start if start == "earliest" else where.high_watermark + 1
    return out


def _event(kind: str, data: Any, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def _position(offsets: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in offsets.items())


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
    start: Annotated[str, Query(alias="from", description="earliest, latest or an offset")
                     ] = "latest",
    encoding: Annotated[str, Query(pattern="^(auto|base64)$")] = "auto",
    max_bytes: Annotated[int, Query(ge=1)] = 1024 * 1024,
    heartbeat_ms: Annotated[int, Query(ge=1000, le=60_000)] = 15_000,
    last_event_id: Annotated[str | None, Header()] = None,
    # Redeemed by AccessMiddleware before the handler runs; declared for the document.
    ticket: Annotated[str | None, Query(
        max_length=2048, description="with access control on, in place of the "
        "Authorization header: a ticket from POST /topics/{topic}/stream/tickets")] = None,
) -> StreamingResponse:
    state: BrokerState = request.app.state.broker
    validate_topic(topic)
    authorize(request, Right.CONSUME, [topic])
    guard = _guard(request, topic)
    parts = _partitions(partitions)
    if max_bytes > state.settings.max_fetch_bytes:
        raise InvalidRequest(f"max_bytes {max_bytes} exceeds the limit of "
                             f"{state.settings.max_fetch_bytes}")
    if state.consume is None or state.reader is None:
        raise RoleDisabled("this broker does not have the read role")
    slots = state.consume.stream_slots
    if state.status == "stopping":
        raise ShuttingDown("the broker is draining; connect to another broker")
    if state.topics is not None:
        for p in parts:
            await state.topics.check_readable(TopicPartition(topic, p))
    offsets = (_resume(last_event_id, parts) if last_event_id
               else await _starts(state, topic, parts, start))
    try:
        slots.acquire_on_behalf_of_nowait(request)
    except anyio.WouldBlock:
        state.consume_metrics.streams.labels("refused").inc()
        raise Unavailable(f"all {state.settings.max_concurrent_streams} stream slots are "
                          "taken; retry shortly or on another broker") from None
    ending = _Ending()
    events = _follow(state, topic, offsets, encoding, max_bytes, heartbeat_ms / 1000,
                     ending, guard, lambda size: account(request, consumed=size))
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "Vary": VARY}
    compressed = answer_encoding(request.headers.get("accept-encoding"),
                                 state.settings.answer_encodings)
    if compressed is not None:  # each event flushed whole: compressing buffers nothing
        events = compress_events(events, compressed)
        headers["Content-Encoding"] = compressed
    return _EventStream(events, release=lambda: _release(state, slots, request, ending),
                        media_type="text/event-stream", headers=headers)


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


class _Ending:
    """How a stream ended, for the metrics: closed by the client (or the server
    stopping) unless the stream itself ended it; and the share of the answer budget its
    batch in flight holds, given back with the slot."""

    outcome = "closed"
    hold: AnswerHold | None = None


def _release(state: BrokerState, slots: anyio.CapacityLimiter, holder: object,
             ending: _Ending) -> None:
    slots.release_on_behalf_of(holder)
    if ending.hold is not None:
        ending.hold.release()
    state.consume_metrics.streams.labels(ending.outcome).inc()


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


async def _follow(state: BrokerState, topic: str, offsets: dict[int, int], encoding: str,
                  max_bytes: int, heartbeat_s: float, ending: _Ending,
                  guard: StreamGuard | None, consumed: Callable[[int], None]
                  ) -> AsyncGenerator[bytes, None]:
    """The events of one stream, each read only after the previous was sent; with
    access control on, each read races the guard, which ends the stream with an
    ``error`` event when the principal loses access."""
    metrics = state.consume_metrics
    first = True  # the request that opened the stream paid for its first read
    yield b"retry: 1000\n\n"
    while True:
        if state.status != "ok" or state.consume is None or state.consume.released:
            yield _last(state, ending, "ended", "end", {"reason": DRAINING})
            return
        fetches = [Fetch(TopicPartition(topic, p), o) for p, o in offsets.items()]
        # Within the answer budget: the previous batch was sent, this one holds its bytes.
        hold = ending.hold = ending.hold or state.consume.answer(JSON_FACTOR)
        read = functools.partial(state.consume.consume_holding, hold, fetches,
                                 max_wait_s=heartbeat_s, min_bytes=1, max_bytes=max_bytes,
                                 slot=False)
        try:
            answered = await _read_once(guard, read, heartbeat_s, first, hold)
        except ShuttingDown:
            yield _last(state, ending, "ended", "end", {"reason": DRAINING})
            return
        except LlogError as exc:
            if not exc.retriable:
                yield _last(state, ending, "error", "error", _problem(exc))
                return
            # The answer budget stayed full: a heartbeat, then read again.
            metrics.stream_events.labels("heartbeat").inc()
            yield b": heartbeat\n\n"
            await anyio.sleep(min(RETRY_AFTER_S, heartbeat_s))
            continue
        first = False
        if isinstance(answered, LlogError):
            yield _last(state, ending, "revoked", "error", _problem(answered))
            return
        results = answered[0]  # None: the quota made the read wait, nothing was read
        paired = () if results is None else zip(fetches, results, strict=True)
        sent = False
        for fetch, result in paired:
            if isinstance(result, LlogError):
                yield _last(state, ending, "error", "error", {
                    "partition": fetch.tp.partition, **_problem(result)})
                return
            if result.records:
                sent = True
                consumed(result.size)  # counted as handed over, as consume counts its answer
                yield _records_event(fetch.tp.partition, result, offsets, encoding)
                metrics.stream_events.labels("records").inc()
                metrics.records.inc(len(result.records))
                metrics.bytes.inc(result.size)
        if not sent:  # an empty read, or none (the quota made it wait)
            metrics.stream_events.labels("heartbeat").inc()
            yield b": heartbeat\n\n"


def _last(state: BrokerState, ending: _Ending, outcome: str, kind: str,
          data: dict[str, Any]) -> bytes:
    """The stream's last event, counted, with how the stream ended."""
    state.consume_metrics.stream_events.labels(kind).inc()
    ending.outcome = outcome
    return _event(kind, data)


async def _read_once(guard: StreamGuard | None,
                     read: Callable[[], Awaitable[list[ReadOutcome]]], heartbeat_s: float,
                     first: bool, hold: AnswerHold
                     ) -> tuple[list[ReadOutcome] | None] | LlogError:
    """One read: as it is without access control; with it, paid from the principal's
    quota and raced against the guard (its refusal, when access was taken away)."""
    if guard is None:
        return (await read(),)
    return await guard.unless_revoked(functools.partial(
        _paid_read, guard, read, heartbeat_s, first, hold.release))


async def _paid_read(guard: StreamGuard, read: Callable[[], Awaitable[list[ReadOutcome]]],
                     heartbeat_s: float, first: bool, release: Callable[[], None]
                     ) -> list[ReadOutcome] | None:
    """The read, charged to the principal's request quota; None, after waiting (at most
    a heartbeat), when the quota does not grant it yet. The previous batch has been
    sent: ``release`` gives its share of the answer budget back before that wait."""
    wait_s = 0 if first else guard.throttle()
    if wait_s:
        release()
        await anyio.sleep(min(wait_s, heartbeat_s))
        return None
    return await read()


def _problem(exc: LlogError) -> dict[str, Any]:
    """An error event's data: the HTTP API's error body, and whether to retry."""
    return {"error_type": exc.error_type, "error": str(exc), "retriable": exc.retriable}


def _records_event(partition: int, result: ReadResult, offsets: dict[int, int],
                   encoding: str) -> bytes:
    offsets[partition] = result.next_offset
    return _event("records", {
        "partition": partition, "next_offset": result.next_offset,
        "high_watermark": result.high_watermark,
        "records": [_record(o, v, t, encoding)
                    for (o, v), t in zip(result.records, _times(result), strict=True)]},
        _position(offsets))
