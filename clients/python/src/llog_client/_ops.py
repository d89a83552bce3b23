"""What each client call does, free of I/O, so the sync and the async client share it.

An operation is a generator: it yields :class:`Send` (the driver answers with the
broker's :class:`~llog_client._wire.Reply` or :class:`~llog_client._wire.Broken`) and
:class:`Pause` (the driver sleeps, then moves on to the next broker), and returns the
call's result or raises its error. Following a partition also yields :class:`Deliver`
for the driver to hand each batch of records to its caller.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import quote

from llog_client import _wire as wire
from llog_client._batching import Entry as _Entry
from llog_client._batching import KeySource, plan_requests, request_body
from llog_client._errors import LlogError
from llog_client._models import (
    Fetched,
    PartitionOffsets,
    ProducedBatch,
    ProduceResult,
    RecordLike,
    Start,
    TopicDescription,
    TopicInfo,
)
from llog_client._retry import ProduceLimits, RetryPolicy
from llog_client._wire import Broken, Json, Outcome, Reply

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    method: str
    path: str
    content: bytes | None = None
    wait_s: float = 0.0  # a long-poll: the answer may take this much longer
    compressible: bool = False  # the route decodes a Content-Encoding (produce)
    # The one topic-partition the request writes, if it names one: with routing on, the
    # client sends it to that partition's preferred broker (_routing.py).
    partition: tuple[str, int] | None = None


@dataclass(frozen=True)
class Pause:
    delay_s: float


@dataclass(frozen=True)
class Deliver:
    fetched: Fetched


Action = Send | Pause
Op = Generator[Action, Outcome | None, T]
Follow = Generator[Action | Deliver, Outcome | None, None]


def keep_result(op: Op[T], kept: list[T]) -> Follow:
    """``op`` with its result appended to ``kept`` (for drivers that cannot take a
    generator's return value, such as an async generator)."""
    kept.append((yield from op))


def attempts(send: Callable[[], Send], policy: RetryPolicy,
              interpret: Callable[[Outcome], T | LlogError]) -> Op[T]:
    """Send until ``interpret`` makes a result of the outcome; retry what it calls
    retriable, within the policy; raise the rest (and the last error when attempts run
    out)."""
    attempt = 0
    while True:
        outcome = yield send()
        assert outcome is not None
        result = interpret(outcome)
        if not isinstance(result, LlogError):
            return result
        attempt += 1
        if not result.retriable or attempt >= policy.max_attempts:
            raise result
        yield Pause(policy.delay_s(attempt - 1, result.retry_after_s))


def failure(outcome: Outcome, idempotent: bool) -> LlogError:
    """The error of an outcome that is not an answer of the contract's success shape.

    A request that may have reached the broker is retried only when repeating it
    cannot do anything twice."""
    if isinstance(outcome, Broken):
        error: LlogError = wire.broken_error(outcome)
    else:
        error = wire.reply_error(outcome)
    if error.maybe_written and not idempotent:
        error.retriable = False
    return error


def results_of(reply: Reply, statuses: tuple[int, ...], expected: int
             ) -> list[Mapping[str, Any]] | None:
    body = reply.body
    if reply.status not in statuses or not isinstance(body, dict):
        return None
    results = body.get("results")
    if not isinstance(results, list) or len(results) != expected:
        return None
    return results


# -- produce -------------------------------------------------------------------------


def _one_partition(entries: list[_Entry]) -> tuple[str, int] | None:
    """The topic-partition every entry names, if they all name the same one (a keyed
    entry names none: the broker picks its partition from the key)."""
    first = entries[0]
    if isinstance(first.route, int) and all(
            e.topic == first.topic and e.route == first.route for e in entries):
        return first.topic, first.route
    return None


class _ProduceRequest:
    """One produce request through its retries: only the entries not yet acknowledged
    are sent again, each with its idempotency key, so a retry never writes twice."""

    def __init__(self, entries: list[_Entry]) -> None:
        self.pending = entries
        self.done: list[ProducedBatch] = []

    def send(self) -> Send:
        return Send("POST", "/produce", request_body(self.pending), compressible=True,
                    partition=_one_partition(self.pending))

    def interpret(self, outcome: Outcome) -> list[ProducedBatch] | LlogError:
        if isinstance(outcome, Broken):
            return wire.broken_error(outcome)  # keyed entries: retrying is safe
        results = results_of(outcome, (200, 409, 503), len(self.pending))
        if results is None:
            return failure(outcome, idempotent=True)
        failed: list[tuple[_Entry, LlogError]] = []
        for entry, result in zip(self.pending, results, strict=True):
            if result.get("ok"):
                self.done.append(_batch(entry, result))
            else:
                failed.append((entry, wire.entry_error(result, outcome)))
        self.pending = [entry for entry, _ in failed]
        if not failed:
            return sorted(self.done, key=lambda b: b.first_index)
        errors = [error for _, error in failed]
        return next((e for e in errors if not e.retriable), errors[0])


def _batch(entry: _Entry, result: Mapping[str, Any]) -> ProducedBatch:
    return ProducedBatch(
        topic=entry.topic, partition=int(result["partition"]),
        start_offset=int(result["start_offset"]), end_offset=int(result["end_offset"]),
        count=int(result["count"]), first_index=entry.first_index,
        duplicate=bool(result.get("duplicate")))


def produce(topic: str, records: Iterable[RecordLike], partition: int | None,
            limits: ProduceLimits, keys: KeySource, policy: RetryPolicy
            ) -> Op[ProduceResult]:
    produced: list[ProducedBatch] = []
    for entries in plan_requests(topic, records, partition, limits, keys):
        request = _ProduceRequest(entries)
        try:
            batches = yield from attempts(request.send, policy, request.interpret)
        except LlogError as exc:
            exc.produced = (*produced, *sorted(request.done, key=lambda b: b.first_index))
            raise
        produced.extend(batches)
    return ProduceResult(tuple(produced))


# -- consume -------------------------------------------------------------------------


def _one_result(parse: Callable[[Mapping[str, Any]], T]) -> Callable[[Outcome], T | LlogError]:
    """Reads the answer of a request for one partition: its result, or its error."""

    def interpret(outcome: Outcome) -> T | LlogError:
        if isinstance(outcome, Reply):
            results = results_of(outcome, (200,), 1)
            if results is not None:
                (result,) = results
                return parse(result) if result.get("ok") else wire.entry_error(result, outcome)
        return failure(outcome, idempotent=True)

    return interpret


def fetch(topic: str, partition: int, offset: Start, *, max_wait_ms: int, max_bytes: int,
          policy: RetryPolicy) -> Op[Fetched]:
    body = wire.dumps({
        "topic_partitions": [{"topic": topic, "partition": partition, "fetch_offset": offset,
                              "partition_max_bytes": max_bytes}],
        "max_wait_ms": max_wait_ms, "max_bytes": max_bytes})
    send = Send("POST", "/consume", body, wait_s=max_wait_ms / 1000)
    return (yield from attempts(lambda: send, policy, _one_result(wire.fetched)))


def fetch_many(positions: Mapping[tuple[str, int], Start | str], *, max_wait_ms: int,
               max_bytes: int, policy: RetryPolicy, group: str | None = None,
               reset: str | None = None) -> Op[list[Fetched | LlogError]]:
    """One consume request over several partitions (the answer's budget goes to them in
    the order given); each partition's records or its error. A ``group`` is only sent
    with it, for ``"committed"`` positions to be read from its committed offsets."""
    request: dict[str, Any] = {
        "topic_partitions": [{"topic": t, "partition": p, "fetch_offset": position}
                             for (t, p), position in positions.items()],
        "max_wait_ms": max_wait_ms, "max_bytes": max_bytes}
    if group is not None:
        request.update(group=group, auto_offset_reset=reset or "earliest")
    send = Send("POST", "/consume", wire.dumps(request), wait_s=max_wait_ms / 1000)

    def interpret(outcome: Outcome) -> list[Fetched | LlogError] | LlogError:
        if isinstance(outcome, Reply):
            results = results_of(outcome, (200,), len(positions))
            if results is not None:
                return [wire.fetched(r) if r.get("ok") else wire.entry_error(r, outcome)
                        for r in results]
        return failure(outcome, idempotent=True)

    return (yield from attempts(lambda: send, policy, interpret))


def follow(topic: str, partition: int, start: Start, *, forever: bool, max_wait_ms: int,
           max_bytes: int, policy: RetryPolicy) -> Follow:
    """Fetch from ``start`` on, following ``next_offset``: forever (long-polling at the
    tail), or until the end the broker reported."""
    position: Start = start
    while True:
        got = yield from fetch(topic, partition, position, max_bytes=max_bytes, policy=policy,
                               max_wait_ms=max_wait_ms if forever else 0)
        if got.records:
            yield Deliver(got)
        position = got.next_offset
        if not forever and got.at_end:
            return


# -- offsets and topics --------------------------------------------------------------


def offsets(topic: str, partition: int, timestamp_ms: int | None, policy: RetryPolicy
            ) -> Op[PartitionOffsets]:
    entry: dict[str, Json] = {"topic": topic, "partition": partition}
    if timestamp_ms is not None:
        entry["timestamp_ms"] = timestamp_ms
    send = Send("POST", "/offsets", wire.dumps({"topic_partitions": [entry]}))
    return (yield from attempts(lambda: send, policy,
                                 _one_result(wire.partition_offsets)))


def call(method: str, path: str, body: Json, policy: RetryPolicy, *, idempotent: bool
          ) -> Op[Json]:
    """A request answered with 200, 201 or 202 and a JSON body."""
    send = Send(method, path, None if body is None else wire.dumps(body))

    def interpret(outcome: Outcome) -> Json | LlogError:
        if isinstance(outcome, Reply) and outcome.status in (200, 201, 202) and isinstance(
                outcome.body, dict):
            return outcome.body
        return failure(outcome, idempotent)

    return (yield from attempts(lambda: send, policy, interpret))


def _topic_path(topic: str) -> str:
    return "/topics/" + quote(topic, safe="")


def create_topic(topic: str, partitions: int, config: Mapping[str, object],
                 policy: RetryPolicy) -> Op[TopicInfo]:
    body = {"topic": topic, "partitions": partitions,
            **{k: v for k, v in config.items() if v is not None}}
    return wire.topic_info((yield from call("POST", "/topics", body, policy,
                                             idempotent=False)))


def list_topics(policy: RetryPolicy) -> Op[list[TopicInfo]]:
    body = yield from call("GET", "/topics", None, policy, idempotent=True)
    return [wire.topic_info(t) for t in body.get("topics") or ()]


def describe_topic(topic: str, policy: RetryPolicy) -> Op[TopicDescription]:
    """The topic and every partition's state: the broker answers a page at a time (at
    most 1,000 partitions per request), so this asks for each page in turn."""
    path = _topic_path(topic)
    first = body = yield from call("GET", path, None, policy, idempotent=True)
    states = list(wire.topic_description(body).partition_states)
    while body.get("next_partition") is not None:
        body = yield from call("GET", f"{path}?from_partition={int(body['next_partition'])}",
                               None, policy, idempotent=True)
        states += wire.topic_description(body).partition_states
    return replace(wire.topic_description(first), partition_states=tuple(states))


def update_topic(topic: str, changes: Mapping[str, object], policy: RetryPolicy
                 ) -> Op[TopicInfo]:
    # Setting the same values again changes nothing: safe to repeat.
    return wire.topic_info((yield from call("PATCH", _topic_path(topic), dict(changes),
                                             policy, idempotent=True)))


def delete_topic(topic: str, policy: RetryPolicy) -> Op[TopicInfo]:
    """The topic with ``status`` "deleted", or "deleting" when the broker goes on with it
    in the background (describe_topic answers UnknownTopic once it is done)."""
    return wire.topic_info((yield from call("DELETE", _topic_path(topic), None, policy,
                                             idempotent=False)))

