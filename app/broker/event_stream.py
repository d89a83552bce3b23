"""One event stream (``GET /topics/{topic}/stream``): opened, then followed.

:meth:`EventStream.open` checks the request (partitions, limits, the read role, a
draining broker, unknown partitions), resolves where each partition starts (a
``Last-Event-ID`` the stream sent, an offset, or "earliest"/"latest" as
app/broker/positions.py resolves them) and takes a stream slot; :meth:`EventStream.events`
then yields the stream's Server-Sent Events, each read only after the previous event was
handed to the connection, and :meth:`EventStream.release` gives the slot (and the
answer budget its batch in flight holds) back however the response ends. The route
(app/routes/stream.py) adds access control and the response around them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import orjson

from app.broker import answers
from app.broker.answering import JSON_FACTOR, AnswerHold
from app.broker.consume import ConsumeService, Fetch
from app.broker.metrics import ConsumeMetrics
from app.broker.positions import NAMED, Named, Positions
from app.broker.topic_view import TopicDirectory
from app.errors import InvalidRequest, LlogError, ShuttingDown, Unavailable
from app.service_health import ServiceHealth
from app.settings import LimitSettings
from app.storage.keys import TopicPartition
from app.storage.reader import ReadOutcome, ReadResult

T = TypeVar("T")
MAX_STREAM_PARTITIONS = 256
# How long a stream waits before reading again when the answer budget had no room for
# its read: what a 503 from /consume tells a client (Retry-After: 1).
RETRY_AFTER_S = 1.0
DRAINING = "the broker is draining; reconnect (with Last-Event-ID) to another broker"
_POSITION = re.compile(r"(\d{1,10}):(\d{1,19})")
Read = Callable[[], Awaitable[list[ReadOutcome]]]


@dataclass(frozen=True)
class Streaming:
    """What an event stream uses of the broker; without the read role, ``consume`` is
    a stand-in that refuses (app/broker/roles.py)."""

    limits: LimitSettings
    health: ServiceHealth  # a draining broker opens no stream, and ends its streams
    consume: ConsumeService
    positions: Positions  # "earliest" and "latest"
    topics: TopicDirectory  # unknown partitions are refused; a deleted topic's stream ends
    metrics: ConsumeMetrics


class Guard(Protocol):
    """What keeps a stream's access current (app/routes/stream_guard.py)."""

    def throttle(self) -> int: ...

    def refusal_now(self) -> LlogError | None: ...

    async def unless_revoked(self, work: Callable[[], Awaitable[T]]
                             ) -> tuple[T] | LlogError: ...


def partitions_of(raw: str) -> list[int]:
    """The ``partitions`` parameter: distinct partition numbers, comma-separated."""
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


def resumed(last_event_id: str, partitions: list[int], *, given: str = "Last-Event-ID"
            ) -> dict[int, int]:
    """Next offsets from a ``Last-Event-ID`` this stream sent (or the same positions
    given as ``from``, ``given`` naming which in a refusal)."""
    found: dict[int, int] = {}
    items = last_event_id.split(",")
    for item in items:
        m = _POSITION.fullmatch(item.strip())
        if m is None:
            raise InvalidRequest(f"{given} {last_event_id!r} is not one this "
                                 "stream sent")
        found[int(m.group(1))] = int(m.group(2))
    if len(found) != len(items) or set(found) != set(partitions):
        raise InvalidRequest(f"{given} names other partitions than the stream")
    return found


def event(kind: str, data: Any, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"


def problem(exc: LlogError) -> dict[str, Any]:
    """An error event's data: the HTTP API's error body, and whether to retry."""
    return {"error_type": exc.error_type, "error": str(exc), "retriable": exc.retriable}


class EventStream:
    def __init__(self, broker: Streaming, topic: str, *, encoding: str, max_bytes: int,
                 heartbeat_ms: int, guard: Guard | None, consumed: Callable[[int], None]
                 ) -> None:
        self.broker = broker
        self.topic = topic
        self.encoding = encoding
        self.max_bytes = max_bytes
        self.heartbeat_s = heartbeat_ms / 1000
        self.guard = guard
        self.consumed = consumed  # record bytes handed over, as consume counts its answer
        self.offsets: dict[int, int] = {}
        self.slots: anyio.CapacityLimiter | None = None
        # How the stream ended, for the metrics: closed by the client (or the server
        # stopping) unless the stream itself ended it.
        self.outcome = "closed"
        self.hold: AnswerHold | None = None  # the budget its batch in flight holds

    async def open(self, partitions: str, start: str, last_event_id: str | None) -> None:
        """Check the request, find where each partition starts, and take a stream slot
        (or refuse: 400, 404, 503)."""
        broker, s = self.broker, self.broker.limits
        parts = partitions_of(partitions)
        if self.max_bytes > s.max_fetch_bytes:
            raise InvalidRequest(f"max_bytes {self.max_bytes} exceeds the limit of "
                                 f"{s.max_fetch_bytes}")
        slots = broker.consume.stream_slots  # RoleDisabled without the read role
        if broker.health.status == "stopping":
            raise ShuttingDown("the broker is draining; connect to another broker")
        for p in parts:
            await broker.topics.check_readable(TopicPartition(self.topic, p))
        # Positions as ``from`` (an event's id): how a page resumes with a new
        # EventSource, which cannot send Last-Event-ID.
        self.offsets = (resumed(last_event_id, parts) if last_event_id
                        else resumed(start, parts, given="from") if ":" in start
                        else await self._starts(parts, start))
        try:
            slots.acquire_on_behalf_of_nowait(self)
        except anyio.WouldBlock:
            broker.metrics.streams.labels("refused").inc()
            raise Unavailable(f"all {s.max_concurrent_streams} stream slots are "
                              "taken; retry shortly or on another broker") from None
        self.slots = slots

    async def _starts(self, partitions: list[int], start: str) -> dict[int, int]:
        if start.isdigit():  # 0 is the log start: the read resolves it (reader.py)
            return dict.fromkeys(partitions, int(start))
        if start not in NAMED:
            raise InvalidRequest(f"from {start!r}: earliest, latest or an offset")
        name: Named = start
        found = await self.broker.positions.resolve_named(
            [(TopicPartition(self.topic, p), name) for p in partitions])
        out: dict[int, int] = {}
        for p, offset in zip(partitions, found, strict=True):
            if isinstance(offset, LlogError):
                raise offset
            out[p] = offset
        return out

    def release(self) -> None:
        """Give the slot, and the budget the batch in flight holds, back (once)."""
        if self.slots is None:
            return
        slots, self.slots = self.slots, None
        slots.release_on_behalf_of(self)
        if self.hold is not None:
            self.hold.release()
        self.broker.metrics.streams.labels(self.outcome).inc()

    async def events(self) -> AsyncGenerator[bytes, None]:
        """The events of the stream, each read only after the previous was sent; with
        access control on, each read races the guard, which ends the stream with an
        ``error`` event when the principal loses access."""
        broker, metrics = self.broker, self.broker.metrics
        first = True  # the request that opened the stream paid for its first read
        yield b"retry: 1000\n\n"
        while True:
            service = broker.consume
            if not broker.health.ready or service.released:
                yield self._last("ended", "end", {"reason": DRAINING})
                return
            fetches, hold, read = self._next_read(service)
            try:
                # Deleted while the stream runs: it ends.
                await broker.topics.check_readable(fetches[0].tp)
                answered = await self._read_once(read, first, hold)
            except ShuttingDown:
                yield self._last("ended", "end", {"reason": DRAINING})
                return
            except LlogError as exc:
                if not exc.retriable:
                    yield self._last("error", "error", problem(exc))
                    return
                # The answer budget stayed full: a heartbeat, then read again. What the
                # hold still has (the batch sent before) goes back first: a stream that
                # waits holds nothing, or the streams waiting could fill the budget.
                hold.release()
                metrics.stream_events.labels("heartbeat").inc()
                yield b": heartbeat\n\n"
                await anyio.sleep(min(RETRY_AFTER_S, self.heartbeat_s))
                continue
            first = False
            if isinstance(answered, LlogError):
                yield self._last("revoked", "error", problem(answered))
                return
            results = answered[0]  # None: the quota made the read wait, nothing was read
            sent = False
            for fetch, result in () if results is None else zip(fetches, results, strict=True):
                if isinstance(result, LlogError):
                    yield self._last("error", "error", {
                        "partition": fetch.tp.partition, **problem(result)})
                    return
                if result.records:
                    # Each send may wait for a slow client: access is checked again
                    # before each one, not only when the batch was read.
                    revoked = None if self.guard is None else self.guard.refusal_now()
                    if revoked is not None:
                        yield self._last("revoked", "error", problem(revoked))
                        return
                    sent = True
                    self.consumed(result.size)
                    yield self._records(fetch.tp.partition, result)
                    metrics.stream_events.labels("records").inc()
                    metrics.records.inc(len(result.records))
                    metrics.bytes.inc(result.size)
            if not sent:  # an empty read, or none (the quota made it wait)
                metrics.stream_events.labels("heartbeat").inc()
                yield b": heartbeat\n\n"

    def _next_read(self, service: ConsumeService
                   ) -> tuple[list[Fetch], AnswerHold, Read]:
        """The next read of every partition from where the stream is, within the answer
        budget: the previous batch was sent, this one holds its bytes."""
        fetches = [Fetch(TopicPartition(self.topic, p), o) for p, o in self.offsets.items()]
        hold = self.hold = self.hold or service.answer(JSON_FACTOR)
        read = functools.partial(service.consume, fetches, max_wait_s=self.heartbeat_s,
                                 min_bytes=1, max_bytes=self.max_bytes, slot=False,
                                 hold=hold)
        return fetches, hold, read

    def _last(self, outcome: str, kind: str, data: dict[str, Any]) -> bytes:
        """The stream's last event, counted, with how the stream ended."""
        self.broker.metrics.stream_events.labels(kind).inc()
        self.outcome = outcome
        return event(kind, data)

    async def _read_once(self, read: Read, first: bool, hold: AnswerHold
                         ) -> tuple[list[ReadOutcome] | None] | LlogError:
        """One read: as it is without access control; with it, paid from the principal's
        quota and raced against the guard (its refusal, when access was taken away)."""
        if self.guard is None:
            return (await read(),)
        return await self.guard.unless_revoked(functools.partial(
            self._paid_read, self.guard, read, first, hold.release))

    async def _paid_read(self, guard: Guard, read: Read, first: bool,
                         release: Callable[[], None]) -> list[ReadOutcome] | None:
        """The read, charged to the principal's request quota; None, after waiting (at
        most a heartbeat), when the quota does not grant it yet. The previous batch has
        been sent: ``release`` gives its share of the answer budget back before that
        wait."""
        wait_s = 0 if first else guard.throttle()
        if wait_s:
            release()
            await anyio.sleep(min(wait_s, self.heartbeat_s))
            return None
        return await read()

    def _records(self, partition: int, result: ReadResult) -> bytes:
        self.offsets[partition] = result.next_offset
        position = ",".join(f"{p}:{o}" for p, o in self.offsets.items())
        return event("records", {
            "partition": partition, "next_offset": result.next_offset,
            "high_watermark": result.high_watermark,
            "records": answers.records(result, self.encoding)}, position)
