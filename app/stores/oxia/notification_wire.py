"""Oxia's ``NotificationBatch`` read straight from the wire.

Every commit of every broker comes back to each broker as change notifications (the
control record and the index entry it writes, group offsets, fences), and the ``oxia``
client decodes each batch with its generic protobuf runtime (betterproto2, pure Python):
about 300 µs for a batch of eight keys, on a thread that holds the GIL the event loop
needs. This reads the three fields a listener uses, by hand, in a tenth of that:

    NotificationBatch { int64 shard = 1; int64 offset = 2; fixed64 timestamp = 3;
                        map<string, Notification> notifications = 4; }
    Notification      { NotificationType type = 1; optional int64 version_id = 2;
                        optional string key_range_last = 3; }

(a map is a repeated message of ``key = 1``, ``value = 2``). Unknown fields, and known
ones of another wire type, are skipped by their wire type, as protobuf's own decoders
do; anything truncated, a group or a string that is not UTF-8 is :class:`MalformedBatch`.
:func:`read_batch`, the stream's decoder, never raises (gRPC leaves a stream whose
decoder raised open for good): it answers such bytes with :class:`Refused`, which says
how far the batch was read.
"""

from __future__ import annotations

from typing import NamedTuple

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_INT64_SPAN = 1 << 64
_INT64_MAX = (1 << 63) - 1


class MalformedBatch(ValueError):
    """A ``NotificationBatch`` that does not decode."""


class Change(NamedTuple):
    """One key's notification: its ``NotificationType`` value (0 created, 1 modified,
    2 deleted, 3 range deleted), the new version (0 when absent), the last key of a
    deleted range (None when absent)."""

    key: str
    type: int
    version_id: int
    key_range_last: str | None


class Batch(NamedTuple):
    shard: int
    offset: int
    changes: list[Change]


class Refused(NamedTuple):
    """A batch that does not decode, and its shard and offset where they were read
    before the fault (Oxia writes them first): a listener can skip it and go on."""

    shard: int | None
    offset: int | None
    reason: str


def read_batch(data: bytes) -> Batch | Refused:
    """:func:`parse_batch`, or :class:`Refused` for bytes that are not a batch."""
    head: list[int | None] = [None, None]  # the shard and offset, once read
    try:
        return _parse(data, head)
    except MalformedBatch as exc:
        return Refused(head[0], head[1], str(exc))


def parse_batch(data: bytes) -> Batch:
    """A ``NotificationBatch``'s shard, offset and changes, in the order sent."""
    return _parse(data, [None, None])


def _parse(data: bytes, head: list[int | None]) -> Batch:
    """:func:`parse_batch`, noting the shard and offset in ``head`` as they are read."""
    changes: list[Change] = []
    pos, end = 0, len(data)
    while pos < end:
        tag, pos = _varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field in (1, 2) and wire == _VARINT:
            value, pos = _varint(data, pos, end)
            head[field - 1] = _signed(value)
        elif field == 4 and wire == _LENGTH:
            start, pos = _span(data, pos, end)
            changes.append(_change(data, start, pos))
        else:
            pos = _skip(data, pos, end, wire)
    return Batch(head[0] or 0, head[1] or 0, changes)


def _change(data: bytes, pos: int, end: int) -> Change:
    """A map entry: ``key = 1`` (string), ``value = 2`` (Notification)."""
    key = ""
    type_ = version = 0
    range_last: str | None = None
    while pos < end:
        tag, pos = _varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 1 and wire == _LENGTH:
            start, pos = _span(data, pos, end)
            key = _text(data, start, pos)
        elif field == 2 and wire == _LENGTH:
            start, pos = _span(data, pos, end)
            type_, version, range_last = _notification(data, start, pos)
        else:
            pos = _skip(data, pos, end, wire)
    return Change(key, type_, version, range_last)


def _notification(data: bytes, pos: int, end: int) -> tuple[int, int, str | None]:
    type_ = version = 0
    range_last: str | None = None
    while pos < end:
        tag, pos = _varint(data, pos, end)
        field, wire = tag >> 3, tag & 7
        if field == 1 and wire == _VARINT:
            type_, pos = _varint(data, pos, end)
            type_ = _signed(type_)  # an enum is an int32, sign-extended on the wire
        elif field == 2 and wire == _VARINT:
            version, pos = _varint(data, pos, end)
            version = _signed(version)
        elif field == 3 and wire == _LENGTH:
            start, pos = _span(data, pos, end)
            range_last = _text(data, start, pos)
        else:
            pos = _skip(data, pos, end, wire)
    return type_, version, range_last


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    if pos < end:
        byte = data[pos]
        if byte < 0x80:  # most tags, lengths and small values: one byte
            return byte, pos + 1
    value = shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise MalformedBatch("a varint runs past its message")


def _signed(value: int) -> int:
    """An int64 (or sign-extended int32) from its varint."""
    value &= _INT64_SPAN - 1
    return value - _INT64_SPAN if value > _INT64_MAX else value


def _span(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Where a length-delimited field's bytes start and stop (its length at ``pos``)."""
    size, pos = _varint(data, pos, end)
    return pos, _within(pos, size, end)


def _within(pos: int, size: int, end: int) -> int:
    stop = pos + size
    if stop > end:
        raise MalformedBatch("a field runs past its message")
    return stop


def _text(data: bytes, pos: int, stop: int) -> str:
    try:
        return data[pos:stop].decode()
    except UnicodeDecodeError:
        raise MalformedBatch("a string field is not UTF-8") from None


def _skip(data: bytes, pos: int, end: int, wire: int) -> int:
    if wire == _VARINT:
        return _varint(data, pos, end)[1]
    if wire == _FIXED64:
        return _within(pos, 8, end)
    if wire == _LENGTH:
        return _span(data, pos, end)[1]
    if wire == _FIXED32:
        return _within(pos, 4, end)
    raise MalformedBatch(f"wire type {wire} (groups are not used by Oxia)")
