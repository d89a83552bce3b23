"""The consumer-group calls (docs/http-api.md, Consumer groups), free of I/O like
:mod:`llog_client._ops`: join, heartbeat, leave, commit, list, describe, reset, and a
fetch of several partitions with a group's committed offsets."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from llog_client import _wire as wire
from llog_client._errors import LlogError
from llog_client._models import (
    Fetched,
    GroupDescription,
    GroupMembership,
    GroupPage,
    Resume,
    TopicPartitionKey,
)
from llog_client._ops import Op, Send, attempts, call, failure, fetch_many, results_of
from llog_client._retry import RetryPolicy
from llog_client._wire import Json, Outcome, Reply

Committed = dict[TopicPartitionKey, int]


def _path(group: str, action: str = "") -> str:
    return "/groups/" + quote(group, safe="") + (f"/{action}" if action else "")


def join(group: str, topics: list[str], client_id: str | None,
         session_timeout_ms: int | None, policy: RetryPolicy) -> Op[GroupMembership]:
    body: dict[str, Json] = {"topics": topics}
    if client_id is not None:
        body["client_id"] = client_id
    if session_timeout_ms is not None:
        body["session_timeout_ms"] = session_timeout_ms
    # A join repeated after its answer was lost makes a second member, which holds
    # partitions until its session ends: retried only when it cannot have arrived.
    return wire.group_membership((yield from call("POST", _path(group, "join"), body,
                                                  policy, idempotent=False)))


def heartbeat(group: str, member_id: str, policy: RetryPolicy) -> Op[GroupMembership]:
    return wire.group_membership((yield from call(
        "POST", _path(group, "heartbeat"), {"member_id": member_id}, policy,
        idempotent=True)))


def leave(group: str, member_id: str, policy: RetryPolicy) -> Op[bool]:
    body = yield from call("POST", _path(group, "leave"), {"member_id": member_id}, policy,
                           idempotent=True)
    return bool(body.get("left"))


def offset_results(send: Send, expected: int | None, policy: RetryPolicy
                   ) -> Op[Committed]:
    """An answer of commit, reset-offsets or offsets by time: every partition's offset,
    or the error of the first that failed. ``expected``: how many results (None: any
    number)."""

    def interpret(outcome: Outcome) -> Committed | LlogError:
        if isinstance(outcome, Reply):
            body = outcome.body
            count = expected if expected is not None else (
                len(body["results"]) if isinstance(body, dict)
                and isinstance(body.get("results"), list) else -1)
            results = results_of(outcome, (200, 409), count)
            if results is not None:
                failed = [r for r in results if not r.get("ok")]
                if failed:
                    return wire.entry_error(failed[0], outcome)
                return {(str(r["topic"]), int(r["partition"])): int(r["offset"])
                        for r in results}
        return failure(outcome, idempotent=True)  # the same offsets again change nothing

    return (yield from attempts(lambda: send, policy, interpret))


def commit(group: str, offsets: Mapping[TopicPartitionKey, int], member_id: str | None,
           generation: int | None, policy: RetryPolicy) -> Op[Committed]:
    body: dict[str, Json] = {"offsets": [{"topic": t, "partition": p, "offset": o}
                                         for (t, p), o in offsets.items()]}
    if member_id is not None:
        body |= {"member_id": member_id, "generation": generation}
    send = Send("POST", _path(group, "commit"), wire.dumps(body))
    return (yield from offset_results(send, len(offsets), policy))


def reset(group: str, entries: list[dict[str, Json]], policy: RetryPolicy
          ) -> Op[Committed]:
    """``entries`` as the request names them (one without a partition covers all of its
    topic's)."""
    send = Send("POST", _path(group, "reset-offsets"),
                wire.dumps({"topic_partitions": entries}))
    return (yield from offset_results(send, None, policy))


def page(after: str | None, limit: int, policy: RetryPolicy) -> Op[GroupPage]:
    query = f"?limit={limit}" + (f"&after={quote(after, safe='')}" if after else "")
    return wire.group_page((yield from call("GET", "/groups" + query, None, policy,
                                            idempotent=True)))


def describe(group: str, policy: RetryPolicy) -> Op[GroupDescription]:
    return wire.group_description((yield from call("GET", _path(group), None, policy,
                                                   idempotent=True)))


def fetch(group: str, positions: Mapping[TopicPartitionKey, Resume], *, reset: str,
          max_wait_ms: int, max_bytes: int, policy: RetryPolicy
          ) -> Op[list[Fetched | LlogError]]:
    """One consume request over several partitions, ``"committed"`` read from the
    group's committed offsets; each partition's records or its error."""
    return fetch_many(positions, max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                      policy=policy, group=group, reset=reset)
