"""The frames brokers forward appends in (docs/protocol.md, Forwarding between brokers).

    u32  payload length         (at most the receiver's limit, else it closes)
    u8   type
    payload

All integers are big-endian. A connection opens with a handshake (HELLO from the
server, AUTH from the client, WELCOME from the server), then carries APPEND frames one
way and their answers (RESULTS, REFUSED, EXPIRED: one per APPEND, by id, in any order)
the other. Only the format lives here; app/cluster/forward.py and forward_server.py
speak it.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.cluster.fences import Fence
from app.errors import CommitInDoubt, InvalidRequest, LlogError, Unavailable, error_types
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition, is_fence_token
from app.wire import produce as envelope

# 2: an APPEND carries its fence (sent_at_ms and token, app/cluster/fences.py).
# 3: and its commit window (u32 ms, after the deadline). An APPEND of one version read
#    as the other misplaces every field after the deadline, so brokers that speak
#    different versions refuse each other at the handshake and forward nothing.
PROTOCOL_VERSION = 3
NONCE_BYTES = 32
MAC_BYTES = 32
# An APPEND holds at most a lane's buffer (LLOG_BATCH_BUFFER_MAX_BYTES by default) of
# records, plus the envelope's few hundred bytes per entry.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024 + 1024 * 1024
# Id 0 is never an APPEND's: a REFUSED with it refuses the connection, which then closes.
CONNECTION = 0

_HEADER = struct.Struct(">IB")
_HELLO = struct.Struct(">H32s")
_AUTH = struct.Struct(">H32s")
_ID = struct.Struct(">Q")
_APPEND = struct.Struct(">QIIQB")
_MAX_U32 = 2**32 - 1

Parts = list[bytes | memoryview]


class FrameType(enum.IntEnum):
    HELLO = 1     # server: u16 version, 32-byte nonce
    AUTH = 2      # client: u16 version, 32-byte nonce, HMAC (32 bytes, or none)
    WELCOME = 3   # server: HMAC (32 bytes, or none)
    APPEND = 4    # client: u64 id, u32 deadline_ms, u32 window_ms, u64 sent_at_ms,
    #               u8 n, token (n ASCII bytes), LLP1 envelope
    RESULTS = 5   # server: u64 id, JSON list of outcomes (one per entry, in order)
    REFUSED = 6   # server: u64 id, JSON {"error_type", "error"}: nothing was written
    EXPIRED = 7   # server: u64 id: no flush took the records in time, nothing written


class FrameError(Exception):
    """The peer broke the protocol (a malformed, unexpected or oversized frame): the
    connection is closed."""


class FrameTooLarge(FrameError):
    """A frame over the receiver's limit (refused before its payload is read)."""


class ProtocolMismatch(FrameError):
    """The peer speaks another version of the protocol: the connection is refused at
    the handshake, before any APPEND (whose layout differs between versions) crosses."""


@dataclass(frozen=True)
class Frame:
    type: FrameType
    payload: bytes


async def read_frame(reader: asyncio.StreamReader, max_payload: int) -> Frame | None:
    """The next frame, or None if the stream ended cleanly between two frames. A frame
    over ``max_payload`` is refused before its payload is read."""
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("the connection ended inside a frame header") from None
    length, kind = _HEADER.unpack(head)
    if length > max_payload:
        raise FrameTooLarge(f"a frame of {length} bytes; the limit is {max_payload}")
    try:
        frame_type = FrameType(kind)
    except ValueError:
        raise FrameError(f"unknown frame type {kind}") from None
    try:
        payload = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError("the connection ended inside a frame") from None
    return Frame(frame_type, payload)


def frame(kind: FrameType, *parts: bytes | memoryview) -> Parts:
    return [_HEADER.pack(sum(len(p) for p in parts), kind), *parts]


def frame_size(parts: Parts) -> int:
    """The payload bytes of a frame :func:`frame` made."""
    return sum(len(p) for p in parts) - _HEADER.size


# -- the handshake ----------------------------------------------------------------------

def hello(nonce: bytes) -> Parts:
    return frame(FrameType.HELLO, _HELLO.pack(PROTOCOL_VERSION, nonce))


def parse_hello(payload: bytes) -> bytes:
    """The server's nonce (FrameError for another version or shape)."""
    if len(payload) != _HELLO.size:
        raise FrameError("a malformed HELLO")
    version, nonce = _HELLO.unpack(payload)
    _check_version(version)
    return bytes(nonce)


def auth(nonce: bytes, mac: bytes) -> Parts:
    return frame(FrameType.AUTH, _AUTH.pack(PROTOCOL_VERSION, nonce), mac)


def parse_auth(payload: bytes) -> tuple[bytes, bytes]:
    """The client's nonce and HMAC (empty without a secret)."""
    if len(payload) not in (_AUTH.size, _AUTH.size + MAC_BYTES):
        raise FrameError("a malformed AUTH")
    version, nonce = _AUTH.unpack_from(payload)
    _check_version(version)
    return bytes(nonce), payload[_AUTH.size:]


def welcome(mac: bytes) -> Parts:
    return frame(FrameType.WELCOME, mac)


def _check_version(version: int) -> None:
    if version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"the peer speaks forward protocol version {version} and this broker "
            f"{PROTOCOL_VERSION}: brokers of releases with different forward protocols "
            "do not forward to each other (each appends the records it receives itself)")


def mac(secret: str | None, role: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What ``role`` ("client" or "server") proves it holds the secret with: an HMAC of
    both nonces, so neither side's answer can be replayed to the other or on another
    connection. Empty without a secret."""
    if secret is None:
        return b""
    label = f"llog-forward/{PROTOCOL_VERSION} {role}".encode()
    return hmac.new(secret.encode(), label + server_nonce + client_nonce,
                    hashlib.sha256).digest()


def mac_matches(expected: bytes, got: bytes) -> bool:
    return hmac.compare_digest(expected, got)


# -- appends ----------------------------------------------------------------------------

@dataclass(frozen=True)
class AppendHead:
    """What an APPEND says before its records: read first, so a bad body is refused by
    id, and a frame's fence is known before a flush takes it."""

    frame_id: int
    deadline_ms: int  # for a flush to take the groups, from the frame's receipt
    # For a commit of the groups to land, from just before the receiver claims their
    # fence (docs/protocol.md, Forward fences).
    window_ms: int
    fence: Fence
    body_at: int  # where the envelope starts


def append(frame_id: int, deadline_ms: int, window_ms: int, fence: Fence,
           groups: Sequence[AppendGroup]) -> Parts:
    """An APPEND of ``groups``: each group's records as their encoded body (a
    :class:`RecordBatch` keeps the body it arrived in, so nothing is re-encoded)."""
    if not is_fence_token(fence.token):
        raise ValueError(f"a fence token {fence.token!r} that cannot name a fence key")
    token = fence.token.encode("ascii")
    entries: list[envelope.BuildEntry] = []
    for g in groups:
        batch = RecordBatch.of(g.records)
        entries.append((g.tp.topic, g.tp.partition, g.idempotency_key, batch.body,
                        batch.encoding))
    return frame(FrameType.APPEND,
                 _APPEND.pack(frame_id, _u32(deadline_ms), _u32(window_ms),
                              fence.sent_at_ms, len(token)), token,
                 *envelope.build_parts(entries, [g.producer for g in groups]))


def _u32(ms: int) -> int:
    return min(max(ms, 0), _MAX_U32)


def parse_append_head(payload: bytes) -> AppendHead:
    """An APPEND's id, deadline and commit window (ms), and fence."""
    if len(payload) < _APPEND.size:
        raise FrameError("an APPEND shorter than its head")
    frame_id, deadline_ms, window_ms, sent_at_ms, n = _APPEND.unpack_from(payload)
    if frame_id == CONNECTION:
        raise FrameError("an APPEND with id 0")
    body_at = _APPEND.size + n
    if n == 0 or len(payload) < body_at:
        raise FrameError("an APPEND without its fence token")
    try:
        token = payload[_APPEND.size:body_at].decode("ascii")
    except UnicodeDecodeError:
        token = ""
    if not is_fence_token(token):
        raise FrameError("an APPEND whose fence token is not 1..200 of [A-Za-z0-9._-]")
    return AppendHead(frame_id, deadline_ms, window_ms, Fence(sent_at_ms, token), body_at)


def parse_append_groups(payload: bytes, head: AppendHead) -> list[AppendGroup]:
    """The groups of an APPEND (:class:`~app.errors.InvalidRequest` for a malformed body
    or an entry without its partition). Bodies stay views of the frame."""
    entries = envelope.parse(memoryview(payload)[head.body_at:], envelope.MAX_ENTRIES)
    groups = []
    for e in entries:
        if e.partition is None:
            raise InvalidRequest(f"a forwarded entry of {e.topic} without its partition")
        groups.append(AppendGroup(TopicPartition(e.topic, e.partition), e.records,
                                  e.idempotency_key, producer=e.producer))
    return groups


def frame_id(payload: bytes) -> int:
    """The id an answer (RESULTS, REFUSED, EXPIRED) is for."""
    if len(payload) < _ID.size:
        raise FrameError("an answer shorter than its id")
    return int(_ID.unpack_from(payload)[0])


# -- answers ----------------------------------------------------------------------------

def results(frame_id: int, groups: Sequence[AppendGroup],
            outcomes: Sequence[AppendOutcome]) -> Parts:
    return frame(FrameType.RESULTS, _ID.pack(frame_id),
                 orjson.dumps([_outcome(g, o) for g, o in zip(groups, outcomes, strict=True)]))


def _outcome(group: AppendGroup, outcome: AppendOutcome) -> dict[str, Any]:
    if isinstance(outcome, AppendResult):
        return {"ok": True, "topic": outcome.tp.topic, "partition": outcome.tp.partition,
                "start_offset": outcome.start_offset, "end_offset": outcome.end_offset,
                "count": outcome.count, "index_key": outcome.index_key,
                "wal_uri": outcome.wal_uri, "duplicate": outcome.duplicate,
                "append_time_ms": outcome.append_time_ms}
    return {"ok": False, "topic": group.tp.topic, "partition": group.tp.partition,
            **_error(outcome)}


def _error(error: LlogError) -> dict[str, Any]:
    return {"error_type": error.error_type, "error": str(error),
            "retriable": error.retriable, "maybe_written": error.maybe_written}


def parse_results(payload: bytes, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
    """The outcomes of a RESULTS for the APPEND of ``groups`` (FrameError if they do not
    answer exactly those groups, in order)."""
    try:
        raw = orjson.loads(memoryview(payload)[_ID.size:])
        if not isinstance(raw, list) or len(raw) != len(groups):
            raise FrameError("RESULTS that do not answer the APPEND's groups")
        return [_parse_outcome(r, g.tp) for r, g in zip(raw, groups, strict=True)]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"malformed RESULTS: {exc}") from None


def _parse_outcome(raw: Any, tp: TopicPartition) -> AppendOutcome:
    if (raw["topic"], raw["partition"]) != (tp.topic, tp.partition):
        raise FrameError(f"RESULTS for {raw['topic']}:{raw['partition']} where {tp} was "
                         "sent")
    if raw["ok"] is True:
        return AppendResult(tp, _int(raw["start_offset"]), _int(raw["end_offset"]),
                            _int(raw["count"]), _str(raw["index_key"]), _str(raw["wal_uri"]),
                            raw["duplicate"] is True, _int(raw["append_time_ms"]))
    return rebuild_error(_str(raw["error_type"]), _str(raw["error"]),
                         retriable=raw["retriable"] is True,
                         maybe_written=raw["maybe_written"] is True)


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is not an integer")
    return value


def _str(value: Any) -> str:
    if type(value) is not str:
        raise TypeError(f"{value!r} is not a string")
    return value


_ERROR_CLASSES = {c.__name__: c for c in error_types()}


def rebuild_error(error_type: str, message: str, *, retriable: bool, maybe_written: bool
                  ) -> LlogError:
    """The peer's error as the same class, its flags as the peer gave them. A name this
    broker does not know (a newer peer) becomes the nearest safe class: CommitInDoubt if
    it may have written, else Unavailable, the peer's name kept in the message."""
    cls = _ERROR_CLASSES.get(error_type)
    error: LlogError | None = None
    if cls is not None:
        try:
            error = cls(message)
        except TypeError:  # a class with required fields never describes an append
            error = None
    if error is None:
        fallback = CommitInDoubt if maybe_written else Unavailable
        error = fallback(f"{error_type}: {message}")
    # Class defaults unless the peer said otherwise (an instance attribute wins).
    if error.retriable != retriable:
        setattr(error, "retriable", retriable)  # noqa: B010  # a ClassVar, set per instance
    if error.maybe_written != maybe_written:
        setattr(error, "maybe_written", maybe_written)  # noqa: B010
    return error


def refused(frame_id: int, error: LlogError) -> Parts:
    return frame(FrameType.REFUSED, _ID.pack(frame_id),
                 orjson.dumps({"error_type": error.error_type, "error": str(error)}))


def parse_refused(payload: bytes) -> str:
    """What a REFUSED says, as "ErrorType: message"."""
    try:
        raw = orjson.loads(memoryview(payload)[_ID.size:])
        return f"{_str(raw['error_type'])}: {_str(raw['error'])}"
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        return f"a malformed REFUSED ({exc})"


def expired(frame_id: int) -> Parts:
    return frame(FrameType.EXPIRED, _ID.pack(frame_id))
