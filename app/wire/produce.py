"""``application/vnd.llog.produce``: a produce request as one binary envelope.

    "LLP1" or "LLP2"
    u32  entry count
    entry:
      u16  topic length, topic         (the JSON API's topic rules)
      i32  partition                   (-1: chosen from the records' key)
      u8   idempotency key length      (0: none), key
      LLP2 only:
      u8   producer id length          (0: none), producer id (the idempotency key's rules)
      u64  sequence                    (present only with a producer id)
      u8   encoding                    (1: bytes-batch-v1, 2: v2, 3: v3)
      u32  body length, body           (a bytes-batch body, exactly as the log stores it)

All integers are big-endian. An entry carries an idempotency key or a producer id, not
both, and an entry with a producer id names its partition (docs/http-api.md, Idempotent
producers); the same rules as the JSON body's. A bytes-batch-v3 body is checked by its
columns, without a step per record, and goes into the WAL object without being decoded
or copied record by record: it is the fast way in (docs/http-api.md, Binary bodies).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import CorruptData, InvalidRequest, PayloadTooLarge
from app.storage import codec
from app.storage.appends import ProducerSeq
from app.storage.batch import RecordBatch
from app.storage.keys import validate_topic
from app.storage.names import IDEMPOTENCY_KEY_RULE, is_idempotency_key

CONTENT_TYPE = "application/vnd.llog.produce"
MAGIC = b"LLP1"
MAGIC_SEQUENCED = b"LLP2"  # entries carry a producer id and sequence
MAX_SEQUENCE = 2**53 - 1  # what JSON carries exactly
ENCODINGS = {1: codec.ENCODING_V1, 2: codec.ENCODING_V2, 3: codec.ENCODING_V3}
CODES = {name: code for code, name in ENCODINGS.items()}
_HEAD = struct.Struct(">4sI")
_TOPIC = struct.Struct(">H")
_PARTITION_KEY = struct.Struct(">iB")
_BODY = struct.Struct(">BI")
_PRODUCER = struct.Struct(">B")
_SEQUENCE = struct.Struct(">Q")
MAX_ENTRIES = 1_000_000


@dataclass(frozen=True)
class Entry:
    topic: str
    partition: int | None
    idempotency_key: str | None
    records: RecordBatch
    producer: ProducerSeq | None = None


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
    if magic != MAGIC and magic != MAGIC_SEQUENCED:
        raise InvalidRequest("a binary produce body starts with 'LLP1' or 'LLP2'")
    if count == 0:
        raise InvalidRequest("a binary produce body needs at least one entry")
    PayloadTooLarge.unless_within(count, max_entries, "entries")
    pos = _HEAD.size
    entries = []
    for i in range(count):
        entry, pos = _entry(view, pos, i, magic == MAGIC_SEQUENCED)
        entries.append(entry)
    if pos != len(view):
        raise InvalidRequest(f"{len(view) - pos} bytes after the last entry")
    return entries


def _entry(view: memoryview, pos: int, i: int, sequenced: bool) -> tuple[Entry, int]:
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
    producer = None
    if sequenced:
        producer, end = _producer(view, end, what)
        if producer is not None and (key_len or partition == -1):
            raise InvalidRequest(f"{what}: {PRODUCER_RULE}")
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
                 key.decode() if key_len else None, records, producer), end


PRODUCER_RULE = ("an entry with a producer id names its partition and carries no "
                 "idempotency key")


def _producer(view: memoryview, pos: int, what: str) -> tuple[ProducerSeq | None, int]:
    end = _take(view, pos, _PRODUCER.size, what)
    (n,) = _PRODUCER.unpack_from(view, pos)
    if not n:
        return None, end
    pos, end = end, _take(view, end, n, what)
    producer_id = bytes(view[pos:end])
    if not is_idempotency_key(producer_id):
        raise InvalidRequest(f"{what}: a producer id is {IDEMPOTENCY_KEY_RULE}")
    pos, end = end, _take(view, end, _SEQUENCE.size, what)
    (sequence,) = _SEQUENCE.unpack_from(view, pos)
    if sequence > MAX_SEQUENCE:
        raise InvalidRequest(f"{what}: a sequence is at most {MAX_SEQUENCE}")
    return ProducerSeq(producer_id.decode(), sequence), end


BuildEntry = tuple[str, int | None, str | None, bytes | memoryview, str]


def build(entries: Sequence[BuildEntry],
          producers: Sequence[ProducerSeq | None] | None = None) -> bytes:
    """An envelope of (topic, partition, idempotency key, body, encoding) entries, with
    each entry's producer sequence where ``producers`` gives one."""
    return b"".join(build_parts(entries, producers))


def build_parts(entries: Sequence[BuildEntry],
                producers: Sequence[ProducerSeq | None] | None = None
                ) -> list[bytes | memoryview]:
    """:func:`build` as parts to send one after the other: each body stays the object it
    was (a view into a request is not copied into a new envelope). ``LLP2`` only where
    an entry has a producer: a receiver of the earlier version reads the rest."""
    sequenced = producers is not None and any(p is not None for p in producers)
    parts: list[bytes | memoryview] = [
        _HEAD.pack(MAGIC_SEQUENCED if sequenced else MAGIC, len(entries))]
    for i, (topic, partition, key, body, encoding) in enumerate(entries):
        raw_topic, raw_key = topic.encode(), (key or "").encode()
        parts += [_TOPIC.pack(len(raw_topic)), raw_topic,
                  _PARTITION_KEY.pack(-1 if partition is None else partition, len(raw_key)),
                  raw_key]
        if sequenced:
            assert producers is not None
            producer = producers[i]
            if producer is None:
                parts.append(_PRODUCER.pack(0))
            else:
                raw_id = producer.producer_id.encode()
                parts += [_PRODUCER.pack(len(raw_id)), raw_id,
                          _SEQUENCE.pack(producer.sequence)]
        parts += [_BODY.pack(CODES[encoding], len(body)), body]
    return parts
