"""The JSON of the HTTP API (docs/http-api.md): records to and from it, answers to
results, error bodies and failed entries to exceptions."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from llog_client import _errors as errors
from llog_client._models import (
    Bytesish,
    ConsumedRecord,
    Fetched,
    GroupDescription,
    GroupMember,
    GroupMembership,
    GroupPage,
    GroupPartition,
    GroupSummary,
    PartitionOffsets,
    PartitionState,
    Record,
    RecordLike,
    TopicDescription,
    TopicInfo,
)

Json = Any


@dataclass(frozen=True)
class Reply:
    """A broker's answer: status, ``Retry-After`` in seconds, and the body as JSON
    (None when it is not JSON)."""

    status: int
    body: Json
    retry_after_s: float | None = None
    text: str = ""


@dataclass(frozen=True)
class Broken:
    """No answer: the connection failed. ``maybe_sent``: the request may have reached
    the broker before that (a cut answer, a read timeout)."""

    reason: str
    maybe_sent: bool


Outcome = Reply | Broken


def parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` as seconds; None when absent or not a number of seconds."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _bytes_json(value: Bytesish) -> Json:
    """Text when the bytes are UTF-8 (smaller on the wire), base64 otherwise."""
    if isinstance(value, str):
        value = value.encode()  # a lone surrogate fails here, before any request
    try:
        return value.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode()}


def _header_json(name: str, value: Bytesish) -> Json:
    encoded = _bytes_json(value)
    return ({"name": name, "value": encoded} if isinstance(encoded, str)
            else {"name": name, **encoded})


def record_json(record: RecordLike) -> Json:
    """One record as the produce request writes it."""
    if not isinstance(record, Record):
        return _bytes_json(record)
    out: dict[str, Json] = {"value": _bytes_json(record.value)}
    if record.key is not None:
        out["key"] = _bytes_json(record.key)
    if record.headers:
        out["headers"] = [_header_json(n, v) for n, v in record.headers]
    if record.timestamp_ms is not None:
        out["timestamp_ms"] = record.timestamp_ms
    return out


def record_key(record: RecordLike) -> bytes | None:
    if isinstance(record, Record) and record.key is not None:
        return record.key.encode() if isinstance(record.key, str) else record.key
    return None


def value_size(record: RecordLike) -> int:
    """The record's value bytes (what progress reports count)."""
    value = record.value if isinstance(record, Record) else record
    return len(value.encode()) if isinstance(value, str) else len(value)


def dumps(body: Json) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _decoded(obj: Mapping[str, Any], text: str, b64: str) -> bytes | None:
    if obj.get(text) is not None:
        return str(obj[text]).encode()
    if obj.get(b64) is not None:
        return base64.b64decode(obj[b64])
    return None


def consumed_record(topic: str, partition: int, obj: Mapping[str, Any]) -> ConsumedRecord:
    headers = tuple((str(h["name"]), _decoded(h, "value", "base64") or b"")
                    for h in obj.get("headers") or ())
    return ConsumedRecord(
        topic=topic, partition=partition, offset=int(obj["offset"]),
        value=_decoded(obj, "value", "base64") or b"", key=_decoded(obj, "key", "key_base64"),
        headers=headers, timestamp_ms=obj.get("timestamp_ms"),
        append_time_ms=obj.get("append_time_ms"))


def fetched(result: Mapping[str, Any]) -> Fetched:
    topic, partition = str(result["topic"]), int(result["partition"])
    return Fetched(topic=topic, partition=partition,
                   records=tuple(consumed_record(topic, partition, r)
                                 for r in result.get("records") or ()),
                   next_offset=int(result["next_offset"]),
                   high_watermark=int(result["high_watermark"]),
                   log_start_offset=result.get("log_start_offset"),
                   committed_offset=result.get("committed_offset"))


def partition_offsets(result: Mapping[str, Any]) -> PartitionOffsets:
    return PartitionOffsets(topic=str(result["topic"]), partition=int(result["partition"]),
                            log_start_offset=int(result["log_start_offset"]),
                            high_watermark=int(result["high_watermark"]),
                            offset=result.get("offset"))


_TOPIC_FIELDS = [f.name for f in fields(TopicInfo)]
_PARTITION_FIELDS = [f.name for f in fields(PartitionState)]


def _pick(obj: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    return {k: obj.get(k) for k in names}


def topic_info(obj: Mapping[str, Any]) -> TopicInfo:
    return TopicInfo(**_topic(obj))


def topic_description(obj: Mapping[str, Any]) -> TopicDescription:
    states = tuple(PartitionState(**_pick(p, _PARTITION_FIELDS))
                   for p in obj.get("partition_states") or ())
    return TopicDescription(**_topic(obj), partition_states=states)


def _topic(obj: Mapping[str, Any]) -> dict[str, Any]:
    # A broker from before topics had a compression setting names none.
    return {**_pick(obj, _TOPIC_FIELDS), "compression": obj.get("compression") or "none",
            "status": obj.get("status") or "active"}


def _assigned(topics: Any) -> tuple[tuple[str, int], ...]:
    return tuple((str(a["topic"]), int(p)) for a in topics or () for p in a["partitions"])


def group_membership(obj: Mapping[str, Any]) -> GroupMembership:
    return GroupMembership(
        group=str(obj["group"]), member_id=str(obj["member_id"]),
        generation=int(obj["generation"]), assignment=_assigned(obj.get("assignment")),
        members=int(obj["members"]), session_timeout_ms=int(obj["session_timeout_ms"]),
        heartbeat_interval_ms=int(obj["heartbeat_interval_ms"]))


_SUMMARY_FIELDS = [f.name for f in fields(GroupSummary)]
_GROUP_PARTITION_FIELDS = [f.name for f in fields(GroupPartition)]
_MEMBER_FIELDS = [f.name for f in fields(GroupMember) if f.name not in ("topics", "assignment")]


def group_page(obj: Mapping[str, Any]) -> GroupPage:
    return GroupPage(groups=tuple(
        GroupSummary(**{**_pick(g, _SUMMARY_FIELDS), "topics": tuple(g.get("topics") or ())})
        for g in obj.get("groups") or ()), next_after=obj.get("next_after"))


def group_description(obj: Mapping[str, Any]) -> GroupDescription:
    members = tuple(GroupMember(**_pick(m, _MEMBER_FIELDS), topics=tuple(m.get("topics") or ()),
                                assignment=_assigned(m.get("assignment")))
                    for m in obj.get("members") or ())
    partitions = tuple(GroupPartition(**_pick(p, _GROUP_PARTITION_FIELDS))
                       for p in obj.get("partitions") or ())
    return GroupDescription(group=str(obj["group"]), generation=int(obj["generation"]),
                            created_at_ms=int(obj["created_at_ms"]),
                            updated_at_ms=int(obj["updated_at_ms"]), members=members,
                            partitions=partitions)


def entry_error(result: Mapping[str, Any], reply: Reply) -> errors.LlogError:
    """The exception for a failed entry of a produce, consume or offsets answer."""
    kind = errors.error_class(result.get("error_type"), None)
    exc = kind(str(result.get("error") or "failed"), error_type=result.get("error_type"),
               status=reply.status, retriable=result.get("retriable"),
               maybe_written=result.get("maybe_written"), retry_after_s=reply.retry_after_s,
               topic=result.get("topic"), partition=result.get("partition"))
    if isinstance(exc, errors.OffsetOutOfRange):
        exc.log_start_offset = result.get("log_start_offset")
        exc.high_watermark = result.get("high_watermark")
    return exc


def reply_error(reply: Reply) -> errors.LlogError:
    """The exception for an answer that refuses a whole request (an error body), or
    one outside the contract."""
    body = reply.body
    if isinstance(body, dict) and isinstance(body.get("error_type"), str):
        kind = errors.error_class(body["error_type"], reply.status)
        details = [(str(d.get("loc")), str(d.get("msg"))) for d in body.get("details") or ()]
        return kind(str(body.get("error") or body["error_type"]),
                    error_type=body["error_type"], status=reply.status,
                    retry_after_s=reply.retry_after_s, details=details)
    server_side = reply.status >= 500
    return errors.UnexpectedResponse(
        f"HTTP {reply.status}: {reply.text[:200] or 'no body'}", status=reply.status,
        retriable=server_side, maybe_written=server_side, retry_after_s=reply.retry_after_s)


def broken_error(broken: Broken) -> errors.TransportError:
    return errors.TransportError(broken.reason, maybe_written=broken.maybe_sent)
