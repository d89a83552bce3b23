"""The records of one append as one encoded body, from the request to the WAL blob.

A produce request's records are encoded once, at the edge (JSON records into a
bytes-batch-v3 body with a few calls into C; a binary request's bodies are checked and
kept as sent), and travel as a :class:`RecordBatch` through the batcher and the writer
into the shared blob, where bodies of one partition are joined without touching their
records. The batch is also a ``Sequence[Payload]``: whoever needs single records (the
tail cache's readers, choosing a partition by key) gets them decoded on first use.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from app.errors import CorruptData
from app.storage import codec, columnar
from app.storage.log_record import Payload, payload_size


class RecordBatch(Sequence[Payload]):
    __slots__ = ("_decoded", "body", "columns", "encoding", "n_records", "size")

    def __init__(self, body: bytes | memoryview, encoding: str, count: int, size: int,
                 columns: columnar.Columns | None = None,
                 decoded: list[Payload] | None = None) -> None:
        self.body = body
        self.encoding = encoding
        self.n_records = count
        self.size = size  # value, key and header bytes: what budgets and limits count
        self.columns = columns  # the layout of a bytes-batch-v3 body
        self._decoded = decoded

    @classmethod
    def of(cls, payloads: Sequence[Payload]) -> RecordBatch:
        """Encode ``payloads``: bytes-batch-v3 unless a record has headers (v2)."""
        if isinstance(payloads, RecordBatch):
            return payloads
        decoded = list(payloads)
        if columnar.encodable(decoded):
            body = columnar.encode(decoded)
            layout = columnar.read_columns(body)
            return cls(body, columnar.ENCODING_V3, layout.count, layout.payload_bytes,
                       layout, decoded)
        body = codec.encode_batch_v2(decoded)
        return cls(body, codec.ENCODING_V2, len(decoded),
                   sum(payload_size(p) for p in decoded), None, decoded)

    @classmethod
    def of_columns(cls, body: bytes | memoryview, layout: columnar.Columns) -> RecordBatch:
        """A checked bytes-batch-v3 body, kept in its columns (decoded on first use)."""
        return cls(body, columnar.ENCODING_V3, layout.count, layout.payload_bytes, layout)

    @classmethod
    def of_values(cls, values: list[bytes]) -> RecordBatch:
        """Plain records (the common JSON request): no per-record checks needed."""
        body, lengths = columnar.encode_values(values)
        layout = columnar.values_columns(body, lengths)
        decoded: list[Payload] = values  # type: ignore[assignment]  # bytes are payloads
        return cls(body, columnar.ENCODING_V3, layout.count, layout.payload_bytes, layout,
                   decoded)

    @classmethod
    def checked(cls, body: bytes | memoryview, encoding: str) -> RecordBatch:
        """A body a client sent, checked as the log's readers will read it (raises
        :class:`CorruptData`). A bytes-batch-v3 body is checked by its columns; v1 and
        v2 bodies are decoded record by record."""
        if encoding == columnar.ENCODING_V3:
            layout = columnar.read_columns(body)
            if layout.append_times is not None:
                raise CorruptData("append times are the broker's to set")
            return cls.of_columns(body, layout)
        decoded = codec.decode_body(body, encoding)
        if any(not isinstance(p, bytes) and p.append_time_ms for p in decoded):
            raise CorruptData("append times are the broker's to set")
        return cls(body, encoding, len(decoded), sum(payload_size(p) for p in decoded),
                   None, decoded)

    def detached(self) -> RecordBatch:
        """The same records holding their own bytes (not a view into a request)."""
        if isinstance(self.body, bytes):
            return self
        body = bytes(self.body)
        layout = None if self.columns is None else columnar.copied(self.columns, body)
        return RecordBatch(body, self.encoding, self.n_records, self.size, layout,
                           self._decoded)

    def record_sizes(self) -> Sequence[int]:
        """Each record's value, key and header bytes."""
        if self.columns is not None:
            return self.columns.record_sizes()
        return [payload_size(p) for p in self.decoded()]

    def decoded(self) -> list[Payload]:
        if self._decoded is None:
            if self.columns is not None:
                self._decoded = columnar.decode(self.columns)
            else:
                self._decoded = codec.decode_body(self.body, self.encoding, self.n_records)
        return self._decoded

    def __len__(self) -> int:
        return self.n_records

    @overload
    def __getitem__(self, index: int) -> Payload: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Payload]: ...

    def __getitem__(self, index: int | slice) -> Payload | Sequence[Payload]:
        return self.decoded()[index]

    def __iter__(self) -> Iterator[Payload]:
        return iter(self.decoded())


def records_size(records: Sequence[Payload]) -> int:
    if isinstance(records, RecordBatch):
        return records.size
    return sum(payload_size(r) for r in records)


def partition_body(batches: Sequence[Sequence[Payload]], encoding: str
                   ) -> tuple[list[bytes | memoryview], str, int]:
    """One body for the records of ``batches`` (one partition of a flush), as parts to
    join: (parts, encoding, record count).

    With ``encoding`` bytes-batch-v3 (the default), v3 bodies are joined column by
    column without touching a record; any other body is re-encoded. A record with
    headers makes the whole body bytes-batch-v2. With bytes-batch-v1 (what releases
    before v3 read), the body is v1, or v2 when a record has more than a value.
    """
    count = sum(len(b) for b in batches)
    if encoding == columnar.ENCODING_V3:
        layouts = [_as_v3(b) for b in batches]
        if all(layout is not None for layout in layouts):
            return columnar.join([c for c in layouts if c is not None]), \
                columnar.ENCODING_V3, count
    payloads = [p for b in batches for p in b]
    if encoding == columnar.ENCODING_V3:
        return [codec.encode_batch_v2(payloads)], codec.ENCODING_V2, count
    body, used = codec.encode_body(payloads)
    return [body], used, count


def _as_v3(records: Sequence[Payload]) -> columnar.Columns | None:
    if isinstance(records, RecordBatch) and records.columns is not None:
        return records.columns
    payloads = list(records)
    if not columnar.encodable(payloads):
        return None
    return columnar.read_columns(columnar.encode(payloads))
