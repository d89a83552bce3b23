"""Consume answers in the binary format (``Accept: application/vnd.llog.records``, "LLR1":
docs/http-api.md, Binary bodies), decoded lazily.

An answer holds one result per partition asked for; a partition's records are a
bytes-batch-v3 body (columns) or, when a record has headers, a bytes-batch-v2 body
(docs/protocol.md, Encodings). Decoding one costs a few calls into C whatever its number
of records: the value-length column is unpacked at once and turned into positions with
``itertools.accumulate``; keys, timestamps and append times are unpacked when first
asked for. Nothing of a record is copied until it is read: a :class:`RecordView` is the
batch and an index, and its ``value`` is a slice of the answer made when it is read. A
bytes-batch-v2 body has a length before each record, so its positions take one Python
loop step per record (its keys and headers are still sliced only when read).

A record or batch keeps its whole answer alive: keep ``record.value`` (a copy) or
:meth:`RecordView.to_consumed`, not the view, to hold a record for long.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import sub
from typing import Any

from llog_client._errors import UnexpectedResponse
from llog_client._models import ConsumedRecord

CONTENT_TYPE = "application/vnd.llog.records"
_MAGIC = b"LLR1"
_HEAD = struct.Struct(">4sI")  # magic, result count
_TOPIC = struct.Struct(">H")
_PARTITION_OK = struct.Struct(">IB")
_OK = struct.Struct(">qqqqBI")  # high watermark, log start, next, first, encoding, length
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_I64 = struct.Struct(">q")
_V3_HEAD = struct.Struct(">IB")  # count, column bits
_V2_HEAD = struct.Struct(">IBq")  # length, attributes, append time
V2, V3 = 2, 3
KEYS, TIMESTAMPS, APPEND_TIMES = 0x01, 0x02, 0x04  # bytes-batch-v3 column bits
V2_KEY, V2_HEADERS, V2_TIMESTAMP = 0x01, 0x02, 0x04  # bytes-batch-v2 attribute bits
NONE = -1  # no key, no timestamp: in a column, and in the positions below
Header = tuple[str, bytes]


def malformed(why: str) -> UnexpectedResponse:
    return UnexpectedResponse(f"malformed LLR1 answer: {why}")


@dataclass(frozen=True)
class PartitionFailure:
    """A partition the broker could not read: the JSON a JSON answer would hold."""

    topic: str
    partition: int
    error: dict[str, Any]


class PartitionBatch:
    """One partition's records in an answer, as columns: ``values`` (copies, made when
    asked for), :meth:`value_views` (no copy), ``offsets`` (a range), ``keys``,
    ``timestamps``, ``append_times``, ``headers``. Iterating gives a
    :class:`RecordView` per record, made as it is reached."""

    __slots__ = ("_at", "_cols", "_hd", "_ke", "_ks", "_ts", "_ve", "_vs", "buffer",
                 "first_offset", "high_watermark", "log_start_offset", "next_offset",
                 "partition", "tag", "topic")

    def __init__(self, topic: str, partition: int, head: tuple[int, int, int, int],
                 buffer: bytes, starts: list[int], ends: list[int]) -> None:
        self.topic = topic
        self.partition = partition
        self.high_watermark, self.log_start_offset, self.next_offset, self.first_offset = head
        self.buffer = buffer  # the whole answer; every position below is into it
        self._vs = starts
        self._ve = ends
        self._cols: tuple[int, int, int] | None = None  # v3: count, columns, where
        self._ks: Sequence[int] = ()  # key start (NONE: no key) and end
        self._ke: Sequence[int] = ()
        self._ts: Sequence[int] = ()  # producer timestamp, NONE for none
        self._at: Sequence[int] | None = None  # append time (None: the body has none)
        self._hd: Sequence[int] | None = None  # where a record's headers start (v2)
        self.tag = 0  # the consumer's: which seek or assignment the batch was read for

    # -- columns ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._vs)

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.first_offset + len(self._vs))

    @property
    def last_offset(self) -> int:
        """The offset of the last record (``first_offset - 1`` for an empty batch)."""
        return self.first_offset + len(self._vs) - 1

    @property
    def at_end(self) -> bool:
        """Nothing was left to read when the broker answered."""
        return self.next_offset > self.high_watermark

    @property
    def values(self) -> list[bytes]:
        """Every value, each copied out of the answer now."""
        buf = self.buffer
        return [buf[a:b] for a, b in zip(self._vs, self._ve, strict=True)]

    def value_views(self) -> list[memoryview]:
        """Every value as a view of the answer: no copy."""
        view = memoryview(self.buffer)
        return [view[a:b] for a, b in zip(self._vs, self._ve, strict=True)]

    @property
    def value_lengths(self) -> list[int]:
        return list(map(sub, self._ve, self._vs))

    @property
    def value_bytes(self) -> int:
        return sum(self.value_lengths)

    @property
    def keys(self) -> list[bytes | None]:
        buf = self.buffer
        return [None if a == NONE else buf[a:b]
                for a, b in zip(self._ks, self._ke, strict=True)]

    @property
    def timestamps(self) -> list[int | None]:
        """The producer's timestamps (None where the record has none)."""
        self._columns()
        return [None if t == NONE else t for t in self._ts]

    @property
    def append_times(self) -> list[int | None]:
        self._columns()
        return [None] * len(self) if self._at is None else list(self._at)

    @property
    def headers(self) -> list[tuple[Header, ...]]:
        return [self._headers(i) for i in range(len(self))]

    def __iter__(self) -> Iterator[RecordView]:
        return map(RecordView, repeat(self), range(len(self._vs)))

    def tail(self, start: int) -> PartitionBatch:
        """Its records from ``start`` on, as a batch of their own (the same answer
        underneath): what an iteration left part way."""
        self._columns()
        out = PartitionBatch(self.topic, self.partition,
                             (self.high_watermark, self.log_start_offset, self.next_offset,
                              self.first_offset + start),
                             self.buffer, self._vs[start:], self._ve[start:])
        out._ks, out._ke, out._ts = self._ks[start:], self._ke[start:], self._ts[start:]
        out._at = None if self._at is None else self._at[start:]
        out._hd = None if self._hd is None else self._hd[start:]
        out.tag = self.tag
        return out

    def __getitem__(self, index: int) -> RecordView:
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return RecordView(self, index % len(self))

    def __repr__(self) -> str:
        return (f"PartitionBatch({self.topic!r}, {self.partition}, offsets={self.offsets}, "
                f"next_offset={self.next_offset}, high_watermark={self.high_watermark})")

    # -- lazily read ------------------------------------------------------------------

    def _columns(self) -> None:
        """Unpack a bytes-batch-v3 body's timestamp and append-time columns, the first
        time one of them is asked for."""
        if self._cols is None:
            return
        count, columns, pos = self._cols
        self._cols = None
        self._ts = [NONE] * count
        if columns & TIMESTAMPS:
            self._ts = struct.unpack_from(f">{count}q", self.buffer, pos)
            pos += 8 * count
        if columns & APPEND_TIMES:
            self._at = struct.unpack_from(f">{count}q", self.buffer, pos)

    def _value(self, i: int) -> bytes:
        return self.buffer[self._vs[i]:self._ve[i]]

    def _key(self, i: int) -> bytes | None:
        start = self._ks[i]
        return None if start == NONE else self.buffer[start:self._ke[i]]

    def _timestamp(self, i: int) -> int | None:
        self._columns()
        ts = self._ts[i]
        return None if ts == NONE else ts

    def _append_time(self, i: int) -> int | None:
        self._columns()
        return None if self._at is None else self._at[i]

    def _headers(self, i: int) -> tuple[Header, ...]:
        if self._hd is None or self._hd[i] == NONE:
            return ()
        return read_headers(self.buffer, self._hd[i])[0]


class RecordView:
    """A record of a :class:`PartitionBatch`: ``value``, ``key`` and ``headers`` are
    read out of the answer when asked for (``value_view`` without a copy). Has every
    field of :class:`~llog_client.ConsumedRecord`."""

    __slots__ = ("_i", "batch")

    def __init__(self, batch: PartitionBatch, index: int) -> None:
        self.batch = batch
        self._i = index

    @property
    def topic(self) -> str:
        return self.batch.topic

    @property
    def partition(self) -> int:
        return self.batch.partition

    @property
    def offset(self) -> int:
        return self.batch.first_offset + self._i

    @property
    def value(self) -> bytes:
        b = self.batch
        return b.buffer[b._vs[self._i]:b._ve[self._i]]

    @property
    def value_view(self) -> memoryview:
        b = self.batch
        return memoryview(b.buffer)[b._vs[self._i]:b._ve[self._i]]

    @property
    def key(self) -> bytes | None:
        return self.batch._key(self._i)

    @property
    def headers(self) -> tuple[Header, ...]:
        return self.batch._headers(self._i)

    @property
    def timestamp_ms(self) -> int | None:
        return self.batch._timestamp(self._i)

    @property
    def append_time_ms(self) -> int | None:
        return self.batch._append_time(self._i)

    def text(self) -> str:
        """The value as UTF-8 text."""
        return self.value.decode()

    def to_consumed(self) -> ConsumedRecord:
        """The record as a plain :class:`~llog_client.ConsumedRecord` (copies it)."""
        return ConsumedRecord(topic=self.topic, partition=self.partition, offset=self.offset,
                              value=self.value, key=self.key, headers=self.headers,
                              timestamp_ms=self.timestamp_ms,
                              append_time_ms=self.append_time_ms)

    def __repr__(self) -> str:
        return (f"RecordView(topic={self.topic!r}, partition={self.partition}, "
                f"offset={self.offset}, value={self.value[:40]!r})")


# -- decoding ---------------------------------------------------------------------------


def read_headers(buf: bytes, pos: int) -> tuple[tuple[Header, ...], int]:
    """The headers of a bytes-batch-v2 record at ``pos``, and where they end."""
    (count,) = _U16.unpack_from(buf, pos)
    pos += 2
    out: list[Header] = []
    for _ in range(count):
        (n,) = _U16.unpack_from(buf, pos)
        name = buf[pos + 2:pos + 2 + n].decode()
        pos += 2 + n
        (size,) = _U32.unpack_from(buf, pos)
        out.append((name, buf[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return tuple(out), pos


def _v3(batch: PartitionBatch, pos: int, end: int) -> None:
    """A bytes-batch-v3 body: value and key positions now, the other columns when asked
    for."""
    buf = batch.buffer
    if end - pos < _V3_HEAD.size:
        raise malformed("a bytes-batch-v3 body shorter than its header")
    count, columns = _V3_HEAD.unpack_from(buf, pos)
    if columns & ~(KEYS | TIMESTAMPS | APPEND_TIMES):
        raise malformed(f"unknown bytes-batch-v3 columns {columns:#x}")
    pos += _V3_HEAD.size
    widths = 4 + 4 * bool(columns & KEYS) + 8 * bool(columns & TIMESTAMPS) \
        + 8 * bool(columns & APPEND_TIMES)
    values_at = pos + widths * count
    if values_at > end:
        raise malformed("bytes-batch-v3 columns overrun the body")
    starts = list(accumulate(struct.unpack_from(f">{count}I", buf, pos), initial=values_at))
    pos += 4 * count
    batch._vs, batch._ve = starts[:-1], starts[1:]
    if columns & KEYS:
        batch._ks, batch._ke = _key_positions(buf, pos, count, starts[-1], end)
        pos += 4 * count
    elif starts[-1] != end:
        raise malformed("bytes-batch-v3 value lengths do not add up to the body")
    else:
        batch._ks = batch._ke = [NONE] * count
    batch._cols = (count, columns, pos)


def _key_positions(buf: bytes, pos: int, count: int, keys_at: int, end: int
                   ) -> tuple[list[int], list[int]]:
    """Where each key starts (NONE: the record has none) and ends."""
    lengths = struct.unpack_from(f">{count}i", buf, pos)
    if count and min(lengths) < NONE:
        raise malformed("a negative key length")
    ends = list(accumulate(map(max, lengths, repeat(0)), initial=keys_at))
    if ends[-1] != end:
        raise malformed("bytes-batch-v3 lengths do not add up to the body")
    return [NONE if n == NONE else e for n, e in zip(lengths, ends, strict=False)], ends[1:]


def _v2(batch: PartitionBatch, pos: int, end: int) -> None:
    """A bytes-batch-v2 body: a Python step per record to find where each part lies."""
    buf = batch.buffer
    (count,) = _U32.unpack_from(buf, pos)
    pos += 4
    if count > (end - pos) // _V2_HEAD.size:
        raise malformed(f"bytes-batch-v2 claims {count} records in {end - pos} bytes")
    vs, ve, ks, ke, ts, at, hd = [], [], [], [], [], [], []
    for _ in range(count):
        length, attrs, appended = _V2_HEAD.unpack_from(buf, pos)
        stop = pos + 4 + length
        if stop > end or length < _V2_HEAD.size - 4 or attrs & ~7:
            raise malformed("a bytes-batch-v2 record overruns the body")
        pos += _V2_HEAD.size
        ts.append(_I64.unpack_from(buf, pos)[0] if attrs & V2_TIMESTAMP else NONE)
        pos += 8 if attrs & V2_TIMESTAMP else 0
        if attrs & V2_KEY:
            (n,) = _U32.unpack_from(buf, pos)
            ks.append(pos + 4)
            pos += 4 + n
        else:
            ks.append(NONE)
        ke.append(pos)
        hd.append(pos if attrs & V2_HEADERS else NONE)
        if attrs & V2_HEADERS:
            pos = read_headers(buf, pos)[1]
        if pos > stop:
            raise malformed("a bytes-batch-v2 record's parts overrun it")
        vs.append(pos)
        ve.append(stop)
        at.append(appended)
        pos = stop
    if pos != end:
        raise malformed("bytes-batch-v2 records do not add up to the body")
    batch._vs, batch._ve, batch._ks, batch._ke = vs, ve, ks, ke
    batch._ts, batch._at, batch._hd = ts, at, hd


def parse(buffer: bytes) -> list[PartitionBatch | PartitionFailure]:
    """The results of an LLR1 answer, in the order the partitions were asked for."""
    try:
        return _parse(buffer)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, UnexpectedResponse):
            raise
        raise malformed(str(exc)) from None


def _parse(buf: bytes) -> list[PartitionBatch | PartitionFailure]:
    magic, count = _HEAD.unpack_from(buf, 0)
    if magic != _MAGIC:
        raise malformed("not an LLR1 answer")
    pos = _HEAD.size
    out: list[PartitionBatch | PartitionFailure] = []
    for _ in range(count):
        (n,) = _TOPIC.unpack_from(buf, pos)
        topic = buf[pos + 2:pos + 2 + n].decode()
        pos += 2 + n
        partition, ok = _PARTITION_OK.unpack_from(buf, pos)
        pos += _PARTITION_OK.size
        if not ok:
            (size,) = _U32.unpack_from(buf, pos)
            error = json.loads(buf[pos + 4:pos + 4 + size])
            if not isinstance(error, dict):
                raise malformed(f"{topic}/{partition}'s error is not an object")
            out.append(PartitionFailure(topic, partition, error))
            pos += 4 + size
            continue
        hw, start, nxt, first, encoding, size = _OK.unpack_from(buf, pos)
        pos += _OK.size
        if pos + size > len(buf):
            raise malformed(f"{topic}/{partition}'s body overruns the answer")
        batch = PartitionBatch(topic, partition, (hw, start, nxt, first), buf, [], [])
        if encoding == V3:
            _v3(batch, pos, pos + size)
        elif encoding == V2:
            _v2(batch, pos, pos + size)
        else:
            raise malformed(f"encoding {encoding} (this client reads 2 and 3)")
        out.append(batch)
        pos += size
    if pos != len(buf):
        raise malformed(f"{len(buf) - pos} bytes after the last result")
    return out
