"""A produce request's body as append entries, each with its records encoded once.

JSON bodies take a fast path (orjson, and checks written for the common shapes: records
that are strings, or objects whose value, key and headers are strings) that accepts
exactly what the :class:`ProduceRequest` model accepts or steps aside: anything else --
base64, or any mistake -- goes through the model, which also words the 400. Binary
bodies are the ``LLP1`` envelope (app/wire/produce.py). Either may come compressed
(``Content-Encoding``: app/wire/content_encoding.py).
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request

from app.routes.json_body import invalid_body
from app.routes.models import MAX_SAFE_INTEGER, ProduceRequest
from app.storage.appends import ProducerSeq
from app.storage.batch import RecordBatch
from app.storage.keys import MAX_PARTITION
from app.storage.log_record import LogRecord, Payload
from app.storage.names import is_idempotency_key, is_name
from app.wire import content_encoding
from app.wire import produce as wire
from app.wire.produce import Entry

_ENTRY_FIELDS = frozenset({"topic", "partition", "records", "idempotency_key"})
_SEQUENCED_FIELDS = frozenset({"topic", "partition", "records", "producer_id", "sequence"})
_RECORD_FIELDS = frozenset({"value", "key", "headers", "timestamp_ms"})
_MAX_TIMESTAMP = MAX_SAFE_INTEGER
_MAX_HEADER_NAME = 256


def is_binary(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == wire.CONTENT_TYPE


async def read_decoded(request: Request, max_size: int) -> bytes:
    """The request's body as it was before its ``Content-Encoding``, at most
    ``max_size`` bytes decoded (413 otherwise; 415 for an encoding the broker does not
    decode, told before the body is read; 400 for a stream that does not decode).

    A compressed body is decoded on a worker thread: a small one may still inflate to
    the limit, many MiB of work that would otherwise stall every other request."""
    encoding = content_encoding.request_encoding(request.headers.get("content-encoding"))
    body = await request.body()
    if encoding == content_encoding.IDENTITY:
        return body
    return await anyio.to_thread.run_sync(content_encoding.decode, encoding, body, max_size)


def parse_json(body: bytes) -> list[Entry]:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _through_model(body)
    entries = _fast(doc)
    return entries if entries is not None else _through_model(body)


def _fast(doc: Any) -> list[Entry] | None:
    """The entries of a body whose records are all strings, or None (not this shape,
    or anything the model might refuse)."""
    if type(doc) is not dict or doc.keys() != {"topic_partitions"}:
        return None
    raw = doc["topic_partitions"]
    if type(raw) is not list or not raw:
        return None
    out = []
    for e in raw:
        if type(e) is not dict:
            return None
        producer = None
        if not e.keys() <= _ENTRY_FIELDS:
            producer = _producer(e)
            if producer is None:
                return None
        topic, partition = e.get("topic"), e.get("partition")
        key, records = e.get("idempotency_key"), e.get("records")
        if (type(topic) is not str or not is_name(topic)
                or (partition is not None and (type(partition) is not int
                                               or not 0 <= partition <= MAX_PARTITION))
                or (key is not None and (type(key) is not str or not is_idempotency_key(key)))
                or type(records) is not list or not records):
            return None
        try:
            values = list(map(str.encode, records))
        except UnicodeEncodeError:  # a lone surrogate: the model words the 400
            return None
        except TypeError:  # not all strings: record objects, perhaps
            payloads = _payloads(records)
            if payloads is None:
                return None
            out.append(Entry(topic, partition, key, RecordBatch.of(payloads), producer))
            continue
        out.append(Entry(topic, partition, key, RecordBatch.of_values(values), producer))
    return out


def _producer(e: dict[str, Any]) -> ProducerSeq | None:
    """The producer sequence of an entry with exactly the sequenced fields, all of the
    common shape; None for anything else (the model decides)."""
    if e.keys() != _SEQUENCED_FIELDS:
        return None
    producer_id, sequence = e["producer_id"], e["sequence"]
    if (type(e["partition"]) is not int
            or type(producer_id) is not str or not is_idempotency_key(producer_id)
            or type(sequence) is not int or not 0 <= sequence <= MAX_SAFE_INTEGER):
        return None
    return ProducerSeq(producer_id, sequence)


def _payloads(records: list[Any]) -> list[Payload] | None:
    """Strings and record objects whose value, key and header values are strings, as
    the model's ``payloads()`` would make them; None for anything else."""
    out: list[Payload] = []
    try:
        for r in records:
            if type(r) is str:
                out.append(r.encode())
                continue
            if type(r) is not dict or not r.keys() <= _RECORD_FIELDS:
                return None
            value, key = r.get("value"), r.get("key")
            headers, ts = r.get("headers"), r.get("timestamp_ms")
            if (type(value) is not str or (key is not None and type(key) is not str)
                    or (ts is not None and (type(ts) is not int
                                            or not 0 <= ts <= _MAX_TIMESTAMP))):
                return None
            pairs = _headers(headers) if headers is not None else ()
            if pairs is None:
                return None
            if key is None and not pairs and ts is None:
                out.append(value.encode())
            else:
                out.append(LogRecord(value.encode(), None if key is None else key.encode(),
                                     pairs, ts))
    except UnicodeEncodeError:  # a lone surrogate: the model words the 400
        return None
    return out


def _headers(headers: Any) -> tuple[tuple[str, bytes], ...] | None:
    if type(headers) is not list:
        return None
    pairs = []
    for h in headers:
        if type(h) is not dict or h.keys() != {"name", "value"}:
            return None
        name, value = h["name"], h["value"]
        if (type(name) is not str or type(value) is not str
                or not 1 <= len(name) <= _MAX_HEADER_NAME):
            return None
        name.encode()  # a lone surrogate raises here, as the model refuses it
        pairs.append((name, value.encode()))
    return tuple(pairs)


def _through_model(body: bytes) -> list[Entry]:
    """Parse and check as FastAPI would with the model (the same 400 on a mistake)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body",),
                                       "msg": f"JSON decode error: {exc}"}]) from None
    try:
        request = ProduceRequest.model_validate(doc)
    except ValidationError as exc:
        raise invalid_body(exc) from None
    return [Entry(e.topic, e.partition, e.idempotency_key, RecordBatch.of(e.payloads()),
                  e.producer())
            for e in request.topic_partitions]
