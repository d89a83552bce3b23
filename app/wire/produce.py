"""``application/vnd.llog.produce``: a produce request as one binary envelope.

    "LLP1"
    u32  entry count
    entry:
      u16  topic length, topic         (the JSON API's topic rules)
      i32  partition                   (-1: chosen from the records' key)
      u8   idempotency key length      (0: none), key
      u8   encoding                    (1: bytes-batch-v1, 2: v2, 3: v3)
      u32  body length, body           (a bytes-batch body, exactly as the log stores it)

All integers are big-endian. A bytes-batch-v3 body is checked by its columns, without a
step per record, and goes into the WAL object without being decoded or copied record by
record: it is the fast way in (docs/http-api.md, Binary bodies).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import CorruptData, InvalidRequest, PayloadTooLarge
from app.storage import codec
from app.storage.batch import RecordBatch
from app.storage.keys import validate_topic
from app.storage.names import IDEMPOTENCY_KEY_RULE, is_idempotency_key

CONTENT_TYPE = "application/vnd.llog.produce"
MAGIC = b"LLP1"
ENCODINGS = {1: codec.ENCODING_V1, 2: codec.ENCODING_V2, 3: codec.ENCODING_V3}
CODES = {name: code for code, name in ENCODINGS.items()}
_HEAD = struct.Struct(">4sI")
_TOPIC = struct.Struct(">H")
_PARTITION_KEY = struct.Struct(">iB")
_BODY = struct.Struct(">BI")
MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class Entry:
    topic: str
    partition: int | None
    idempotency_key: str | None
    records: RecordBatch


def _take(view: memoryview, pos: int, size: int, what: str) -> int:
    if size > len(view) - pos:
        raise InvalidRequest(f"the binary produce body ends inside {what}")
    return pos + size


def parse(body: bytes | memoryview, max_entries: int) -> list[Entry]:
    """The entries of an envelope; :class:`InvalidRequest` for anything malformed, and
    nothing is decoded beyond ``max_entries`` entries."""
    view = memoryview(body)
    _take(view, 0, _HEAD.size, "its header")
    magic, count = _HEAD.unpack_from(view, 0)
    if magic != MAGIC:
        raise InvalidRequest("a binary produce body starts with 'LLP1'")
    if count == 0:
        raise InvalidRequest("a binary produce body needs at least one entry")
    if count > max_entries:
        raise PayloadTooLarge(f"{count} entries in one request; the limit is {max_entries}")
    pos = _HEAD.size
    entries = []
    for i in range(count):
        entry, pos = _entry(view, pos, i)
        entries.append(entry)
    if pos != len(view):
        raise InvalidRequest(f"{len(view) - pos} bytes after the last entry")
    return entries


def _entry(view: memoryview, pos: int, i: int) -> tuple[Entry, int]:
    what = f"entry {i}"
    end = _take(view, pos, _TOPIC.size, what)
    (topic_len,) = _TOPIC.unpack_from(view, pos)
    pos, end = end, _take(view, end, topic_len, what)
    try:
        topic = validate_topic(bytes(view[pos:end]).decode("ascii"))
    except (UnicodeDecodeError, InvalidRequest):
        raise InvalidRequest(f"{what}: the topic is not a valid topic name") from None
    pos, end = end, _take(view, end, _PARTITION_KEY.size, what)
    partition, key_len = _PARTITION_KEY.unpack_from(view, pos)
    if partition < -1:
        raise InvalidRequest(f"{what}: partition {partition} (-1 means: by key)")
    pos, end = end, _take(view, end, key_len, what)
    key = bytes(view[pos:end])
    if key_len and not is_idempotency_key(key):
        raise InvalidRequest(f"{what}: an idempotency key is {IDEMPOTENCY_KEY_RULE}")
    pos, end = end, _take(view, end, _BODY.size, what)
    code, body_len = _BODY.unpack_from(view, pos)
    if code not in ENCODINGS:
        raise InvalidRequest(f"{what}: encoding {code} (1, 2 or 3: bytes-batch-v1..v3)")
    pos, end = end, _take(view, end, body_len, what)
    try:
        records = RecordBatch.checked(view[pos:end], ENCODINGS[code])
    except CorruptData as exc:
        raise InvalidRequest(f"{what} ({topic}): {exc}") from None
    if not records.n_records:
        raise InvalidRequest(f"{what} ({topic}): an entry needs at least one record")
    return Entry(topic, None if partition == -1 else partition,
                 key.decode() if key_len else None, records), end


def build(entries: Sequence[tuple[str, int | None, str | None, bytes, str]]) -> bytes:
    """An envelope of (topic, partition, idempotency key, body, encoding) entries."""
    return b"".join(build_parts(entries))


def build_parts(entries: Sequence[tuple[str, int | None, str | None, bytes | memoryview, str]]
                ) -> list[bytes | memoryview]:
    """:func:`build` as parts to send one after the other: each body stays the object it
    was (a view into a request is not copied into a new envelope)."""
    parts: list[bytes | memoryview] = [_HEAD.pack(MAGIC, len(entries))]
    for topic, partition, key, body, encoding in entries:
        raw_topic, raw_key = topic.encode(), (key or "").encode()
        parts += [_TOPIC.pack(len(raw_topic)), raw_topic,
                  _PARTITION_KEY.pack(-1 if partition is None else partition, len(raw_key)),
                  raw_key, _BODY.pack(CODES[encoding], len(body)), body]
    return parts
