"""Binary produce bodies (docs/http-api.md, Binary bodies): the records of a batch as a
bytes-batch-v3 body (bytes-batch-v2 when a record has headers), and a request as one
``application/vnd.llog.produce`` envelope of many partitions' bodies.

Why binary: the broker checks a bytes-batch-v3 body by its length columns and puts it in
the WAL object as it is, and the client builds one with a few calls into C
(``struct.pack`` of the lengths, ``bytes.join`` of the values) whatever the record count.
JSON would cost both sides a step per record, and base64 for bytes that are not text.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

CONTENT_TYPE = "application/vnd.llog.produce"
MAGIC = b"LLP1"
MAGIC_SEQUENCED = b"LLP2"  # entries carry a producer id and sequence
V2, V3 = 2, 3  # the envelope's encoding codes
KEYS, TIMESTAMPS = 0x01, 0x02  # bytes-batch-v3 column bits (no append times: the broker's)
NO_KEY = NO_TIMESTAMP = -1
_V3_HEAD = struct.Struct(">IB")
_V2_RECORD = struct.Struct(">IBq")  # length, attributes, append time (0: the broker's)
_V2_KEY, _V2_HEADERS, _V2_TIMESTAMP = 0x01, 0x02, 0x04
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_ENVELOPE_HEAD = struct.Struct(">4sI")
_PARTITION_KEY = struct.Struct(">iB")
_BODY_HEAD = struct.Struct(">BI")
_U8 = struct.Struct(">B")
_U64 = struct.Struct(">Q")
_NO_PRODUCER = _U8.pack(0)

Headers = Sequence[tuple[str, bytes]]


def v3_parts(values: Sequence[bytes], keys: Sequence[bytes | None] | None,
             timestamps: Sequence[int] | None) -> list[bytes]:
    """One bytes-batch-v3 body, as parts to be joined once with the rest of a request
    (the values are not copied before that). ``keys`` and ``timestamps`` are None when
    no record has one, else one per record (None / -1 for a record without)."""
    count = len(values)
    columns = (KEYS if keys is not None else 0) | (TIMESTAMPS if timestamps is not None else 0)
    parts = [_V3_HEAD.pack(count, columns), struct.pack(f">{count}I", *map(len, values))]
    if keys is not None:
        parts.append(struct.pack(f">{count}i", *(NO_KEY if k is None else len(k)
                                                  for k in keys)))
    if timestamps is not None:
        parts.append(struct.pack(f">{count}q", *timestamps))
    parts += values
    if keys is not None:
        parts += [k for k in keys if k is not None]
    return parts


def _v2_record(value: bytes, key: bytes | None, headers: Headers, timestamp: int) -> bytes:
    attributes, fields = 0, []
    if timestamp != NO_TIMESTAMP:
        attributes |= _V2_TIMESTAMP
        fields.append(_I64.pack(timestamp))
    if key is not None:
        attributes |= _V2_KEY
        fields += [_U32.pack(len(key)), key]
    if headers:
        attributes |= _V2_HEADERS
        fields.append(_U16.pack(len(headers)))
        for name, header_value in headers:
            raw = name.encode()
            fields += [_U16.pack(len(raw)), raw, _U32.pack(len(header_value)), header_value]
    rest = b"".join([*fields, value])
    return _V2_RECORD.pack(9 + len(rest), attributes, 0) + rest


def encode_v2(values: Sequence[bytes], keys: Sequence[bytes | None] | None,
              timestamps: Sequence[int] | None, headers: Sequence[Headers]) -> bytes:
    """One bytes-batch-v2 body: the encoding that holds headers."""
    count = len(values)
    key_of = keys if keys is not None else [None] * count
    time_of = timestamps if timestamps is not None else [NO_TIMESTAMP] * count
    return b"".join([_U32.pack(count), *(
        _v2_record(values[i], key_of[i], headers[i], time_of[i]) for i in range(count))])


def envelope(entries: Sequence[tuple[bytes, int, bytes, int, Sequence[bytes]]],
             producers: Sequence[tuple[bytes, int] | None] | None = None) -> bytes:
    """One request of (topic, partition (-1: by key), idempotency key, encoding code,
    body parts) entries; topic and key already ASCII bytes. With ``producers`` (an
    entry's producer id, ASCII, and sequence, or None), the LLP2 envelope. One join:
    every record's bytes are copied once, into the request."""
    parts = [_ENVELOPE_HEAD.pack(MAGIC if producers is None else MAGIC_SEQUENCED,
                                 len(entries))]
    for i, (topic, partition, key, code, body) in enumerate(entries):
        parts += [_U16.pack(len(topic)), topic, _PARTITION_KEY.pack(partition, len(key)), key]
        if producers is not None:
            producer = producers[i]
            if producer is None:
                parts.append(_NO_PRODUCER)
            else:
                parts += [_U8.pack(len(producer[0])), producer[0], _U64.pack(producer[1])]
        parts.append(_BODY_HEAD.pack(code, sum(map(len, body))))
        parts += body
    return b"".join(parts)
