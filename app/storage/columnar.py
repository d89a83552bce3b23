"""``bytes-batch-v3``: a body whose records are stored as columns.

    u32  count
    u8   columns                    0x01 keys, 0x02 producer timestamps, 0x04 append times
    u32  value_length[count]
    i32  key_length[count]          with keys; -1: the record has no key
    i64  timestamp_ms[count]        with producer timestamps; -1: none
    i64  append_time_ms[count]      with append times; 0: the entry's append time
    values, back to back
    keys, back to back              with keys

Why columns: checking a body a client sent, joining the bodies of one flush, and cutting
a range of offsets out of one are a few calls into C (``struct.unpack``, ``sum``,
``max``, ``bytes.join``) whatever the record count, where a body with a length before
every record costs a Python loop of a few hundred nanoseconds per record. Records with
headers are bytes-batch-v2 (docs/protocol.md, Encodings).

Like the other decoders, these treat their input as hostile: every length is checked
against the bytes present before anything is allocated; failures are
:class:`~app.errors.CorruptData`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

from app.errors import CorruptData
from app.storage.log_record import LogRecord, Payload

ENCODING_V3 = "bytes-batch-v3"
KEYS, TIMESTAMPS, APPEND_TIMES = 0x01, 0x02, 0x04
_KNOWN = KEYS | TIMESTAMPS | APPEND_TIMES
_HEAD = struct.Struct(">IB")
_U32 = struct.Struct(">I")
NO_KEY = -1
NO_TIMESTAMP = -1


@dataclass(frozen=True)
class Columns:
    """A checked bytes-batch-v3 body: its columns, and where its values and keys lie."""

    view: memoryview
    count: int
    lengths_at: int  # where the value lengths start; the other columns follow them
    value_lengths: tuple[int, ...]
    key_lengths: tuple[int, ...] | None
    timestamps: tuple[int, ...] | None
    append_times: tuple[int, ...] | None
    values_at: int
    keys_at: int
    end: int

    @property
    def columns(self) -> int:
        return ((KEYS if self.key_lengths is not None else 0)
                | (TIMESTAMPS if self.timestamps is not None else 0)
                | (APPEND_TIMES if self.append_times is not None else 0))

    @property
    def payload_bytes(self) -> int:
        """Value and key bytes: what budgets and limits count (no headers here)."""
        return self.end - self.values_at

    def record_sizes(self, first: int = 0, stop: int | None = None) -> Sequence[int]:
        """Each record's value plus key bytes, in order (for per-record limits); of
        records ``first .. stop - 1`` only, when given."""
        values = self.value_lengths[first:stop]  # a tuple: the whole of it is not copied
        if self.key_lengths is None:
            return values
        return [v + max(k, 0) for v, k in zip(values, self.key_lengths[first:stop],
                                              strict=True)]


def _table(view: memoryview, pos: int, count: int, code: str, end: int, what: str
           ) -> tuple[tuple[int, ...], int]:
    size = struct.calcsize(code) * count
    if size > end - pos:
        raise CorruptData(f"bytes-batch-v3 {what} column overruns the body")
    return struct.unpack_from(f">{count}{code}", view, pos), pos + size


def read_columns(body: bytes | memoryview, pos: int = 0, end: int | None = None,
                 count: int | None = None) -> Columns:
    """Check the body at ``pos`` (up to ``end``) and describe it. With ``count``, the
    body starts after its count (the records area of a tail-cache segment)."""
    view = memoryview(body)
    end = len(view) if end is None else end
    if count is None:
        if end - pos < _HEAD.size:
            raise CorruptData("bytes-batch-v3 body is shorter than its header")
        count, columns = _HEAD.unpack_from(view, pos)
        pos += _HEAD.size
    else:
        if pos >= end:
            raise CorruptData("bytes-batch-v3 records area is empty")
        columns = view[pos]
        pos += 1
    if columns & ~_KNOWN:
        raise CorruptData(f"bytes-batch-v3 has unknown columns {columns:#x}")
    if count > (end - pos) // 4:  # every record has at least its value length
        raise CorruptData(f"bytes-batch-v3 claims {count} records in {end - pos} bytes")
    lengths_at = pos
    values, pos = _table(view, pos, count, "I", end, "value length")
    keys = timestamps = appended = None
    if columns & KEYS:
        keys, pos = _table(view, pos, count, "i", end, "key length")
    if columns & TIMESTAMPS:
        timestamps, pos = _table(view, pos, count, "q", end, "timestamp")
    if columns & APPEND_TIMES:
        appended, pos = _table(view, pos, count, "q", end, "append time")
    value_bytes = sum(values)
    key_bytes = 0
    if keys is not None:
        if count and min(keys) < NO_KEY:
            raise CorruptData("bytes-batch-v3 has a negative key length")
        key_bytes = sum(keys) + keys.count(NO_KEY)
    if timestamps is not None and count and min(timestamps) < NO_TIMESTAMP:
        raise CorruptData("bytes-batch-v3 has a negative timestamp")
    if appended is not None and count and min(appended) < 0:
        raise CorruptData("bytes-batch-v3 has a negative append time")
    if pos + value_bytes + key_bytes != end:
        raise CorruptData(f"bytes-batch-v3 lengths add up to {value_bytes + key_bytes} "
                          f"bytes, the body holds {end - pos}")
    return Columns(view, count, lengths_at, values, keys, timestamps, appended, pos,
                   pos + value_bytes, end)


def copied(layout: Columns, body: bytes) -> Columns:
    """``layout`` for ``body``, a copy of the whole body it describes: the same columns
    at the same places, checked already (a tail cache keeps its own copy of each put).
    A layout of a body within a larger buffer is read again from the copy."""
    if layout.view.nbytes != len(body) or layout.end != len(body):
        return read_columns(body)
    c = layout  # the constructor, not dataclasses.replace: a tenth of its cost
    return Columns(memoryview(body), c.count, c.lengths_at, c.value_lengths, c.key_lengths,
                   c.timestamps, c.append_times, c.values_at, c.keys_at, c.end)


def read_counted(body: bytes | memoryview, count: int) -> Columns:
    """:func:`read_columns` of a whole body that must hold ``count`` records (what its
    index entry or chunk table says)."""
    layout = read_columns(body)
    if layout.count != count:
        raise CorruptData(f"bytes-batch-v3 holds {layout.count} records, the index says "
                          f"{count}")
    return layout


def body_end(body: bytes | memoryview, pos: int = 0) -> int:
    """Where the bytes-batch-v3 body starting at ``pos`` ends, from its header and length
    columns (a body among others, as in a chunked compacted blob); checked only as far as
    its extent: :func:`read_columns` of ``[pos, end)`` checks the rest."""
    view = memoryview(body)
    if len(view) - pos < _HEAD.size:
        raise CorruptData("bytes-batch-v3 body is shorter than its header")
    count, columns = _HEAD.unpack_from(view, pos)
    if columns & ~_KNOWN:
        raise CorruptData(f"bytes-batch-v3 has unknown columns {columns:#x}")
    at: int = pos + _HEAD.size
    values, at = _table(view, at, count, "I", len(view), "value length")
    extent = sum(values)
    if columns & KEYS:
        keys, at = _table(view, at, count, "i", len(view), "key length")
        extent += sum(keys) + keys.count(NO_KEY)
    at += 8 * int(count) * (bool(columns & TIMESTAMPS) + bool(columns & APPEND_TIMES))
    if at + extent > len(view):
        raise CorruptData("bytes-batch-v3 body overruns what holds it")
    return at + extent


def _starts(lengths: Sequence[int], at: int) -> list[int]:
    return list(accumulate(lengths, initial=at))


def decode(c: Columns) -> list[Payload]:
    """Every record: plain bytes where the record has nothing but a value."""
    data = c.view
    starts = _starts(c.value_lengths, c.values_at)
    values = [bytes(data[a:b]) for a, b in pairwise(starts)]
    if c.columns == 0:
        return list(values)
    keys: list[bytes | None] = [None] * c.count
    if c.key_lengths is not None:
        pos = c.keys_at
        for i, n in enumerate(c.key_lengths):
            if n >= 0:
                keys[i] = bytes(data[pos:pos + n])
                pos += n
    out: list[Payload] = []
    for i, value in enumerate(values):
        ts = c.timestamps[i] if c.timestamps is not None else NO_TIMESTAMP
        appended = c.append_times[i] if c.append_times is not None else 0
        if keys[i] is None and ts == NO_TIMESTAMP and not appended:
            out.append(value)
        else:
            out.append(LogRecord(value, keys[i], (), None if ts == NO_TIMESTAMP else ts,
                                 appended))
    return out


def encodable(payloads: Sequence[Payload]) -> bool:
    """Whether bytes-batch-v3 holds these records (it has no headers column)."""
    return not any(type(p) is LogRecord and p.headers for p in payloads)


def encode_values(values: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """One body of plain records, and their lengths: a few calls into C."""
    lengths = list(map(len, values))
    count = len(lengths)
    return b"".join([_HEAD.pack(count, 0), struct.pack(f">{count}I", *lengths),
                     *values]), lengths


def encode_timed(payloads: Sequence[Payload], append_times: Sequence[int]) -> bytes | None:
    """One body of ``payloads`` with an append-time column, or None when one of them is
    more than a value (then encode LogRecords carrying their times)."""
    if any(type(p) is LogRecord for p in payloads):
        return None
    count = len(payloads)
    return b"".join([_HEAD.pack(count, APPEND_TIMES),
                     struct.pack(f">{count}I", *map(len, payloads)),  # type: ignore[arg-type]
                     struct.pack(f">{count}q", *append_times), *payloads])  # type: ignore[list-item]


def values_columns(body: bytes, lengths: list[int]) -> Columns:
    """The layout of a body :func:`encode_values` made (no need to read it back)."""
    values_at = _HEAD.size + 4 * len(lengths)
    return Columns(memoryview(body), len(lengths), _HEAD.size, tuple(lengths), None, None,
                   None, values_at, len(body), len(body))


def encode(payloads: Sequence[Payload]) -> bytes:
    """One body for ``payloads`` (none of them with headers)."""
    count = len(payloads)
    if not any(type(p) is LogRecord for p in payloads):
        return encode_values(payloads)[0]  # type: ignore[arg-type]
    records = [p if isinstance(p, LogRecord) else LogRecord(p) for p in payloads]
    columns = 0
    parts: list[bytes] = [b"", struct.pack(f">{count}I", *(len(r.value) for r in records))]
    if any(r.key is not None for r in records):
        columns |= KEYS
        parts.append(struct.pack(f">{count}i", *(
            NO_KEY if r.key is None else len(r.key) for r in records)))
    if any(r.timestamp_ms is not None for r in records):
        columns |= TIMESTAMPS
        parts.append(struct.pack(f">{count}q", *(
            NO_TIMESTAMP if r.timestamp_ms is None else r.timestamp_ms for r in records)))
    if any(r.append_time_ms for r in records):
        columns |= APPEND_TIMES
        parts.append(struct.pack(f">{count}q", *(r.append_time_ms for r in records)))
    parts[0] = _HEAD.pack(count, columns)
    parts += [r.value for r in records]
    if columns & KEYS:
        parts += [r.key for r in records if r.key is not None]
    return b"".join(parts)


def _column_bytes(c: Columns) -> dict[int, memoryview]:
    """The raw bytes of each column the body has, by its flag."""
    out: dict[int, memoryview] = {}
    pos = c.lengths_at + 4 * c.count
    for flag, width, present in ((KEYS, 4, c.key_lengths), (TIMESTAMPS, 8, c.timestamps),
                                 (APPEND_TIMES, 8, c.append_times)):
        if present is not None:
            out[flag] = c.view[pos:pos + width * c.count]
            pos += width * c.count
    return out


_FILL = {KEYS: struct.Struct(">i").pack(NO_KEY),
         TIMESTAMPS: struct.Struct(">q").pack(NO_TIMESTAMP),
         APPEND_TIMES: struct.Struct(">q").pack(0)}


def join(bodies: Sequence[Columns]) -> list[bytes | memoryview]:
    """The parts of one body holding the records of ``bodies`` in order (a column one
    of them lacks is filled with its "none" value); record bytes are not copied."""
    return join_cuts([(c, 0, c.count) for c in bodies])


def cut(c: Columns, first: int, stop: int) -> list[bytes | memoryview]:
    """The parts of a body holding records ``first .. stop - 1`` of ``c``."""
    return join_cuts([(c, first, stop)])


def join_cuts(cuts: Sequence[tuple[Columns, int, int]],
              append_times: Sequence[int] | None = None) -> list[bytes | memoryview]:
    """The parts of one body holding records ``first .. stop - 1`` of each body, in
    order; record bytes are not copied. With ``append_times`` (one per record), its
    append-time column holds them instead of the bodies' own."""
    columns = 0
    for c, _, _ in cuts:
        columns |= c.columns
    if append_times is not None:
        columns |= APPEND_TIMES
    count = sum(stop - first for _, first, stop in cuts)
    raw = [_column_bytes(c) for c, _, _ in cuts]
    parts: list[bytes | memoryview] = [_HEAD.pack(count, columns)]
    parts += [c.view[c.lengths_at + 4 * first:c.lengths_at + 4 * stop]
              for c, first, stop in cuts]
    for flag, width in ((KEYS, 4), (TIMESTAMPS, 8), (APPEND_TIMES, 8)):
        if not columns & flag:
            continue
        if flag == APPEND_TIMES and append_times is not None:
            parts.append(struct.pack(f">{count}q", *append_times))
            continue
        parts += [r[flag][width * first:width * stop] if flag in r
                  else _FILL[flag] * (stop - first)
                  for (_, first, stop), r in zip(cuts, raw, strict=True)]
    for c, first, stop in cuts:
        lengths = c.value_lengths
        at = c.values_at + sum(lengths[:first])
        parts.append(c.view[at:at + sum(lengths[first:stop])])
    if columns & KEYS:
        for c, first, stop in cuts:
            keys = c.key_lengths
            if keys is not None:  # a missing key (-1) takes no bytes: add its count back
                at = c.keys_at + sum(keys[:first]) + keys[:first].count(NO_KEY)
                span = keys[first:stop]
                parts.append(c.view[at:at + sum(span) + span.count(NO_KEY)])
    return parts
