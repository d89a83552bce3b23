"""Request and response bodies of the HTTP API, as named schemas with examples.

Types are strict: ``"0"`` is not a partition, ``1`` is not a record, and unknown fields
are errors, so a generated client and a hand-written one are held to the same contract.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from app.errors import error_types
from app.storage.keys import MAX_PARTITION

# Every error_type a response may carry: the engine's tree (app/errors.py) and the few
# that only the HTTP edge produces.
EDGE_ERROR_TYPES = ("NotFound", "MethodNotAllowed", "HTTPError")
ERROR_TYPES = sorted({c.__name__ for c in error_types()} | set(EDGE_ERROR_TYPES))
ErrorType = Annotated[StrictStr, Field(
    json_schema_extra={"enum": ERROR_TYPES},
    description="A stable name from the documented list (docs/http-api.md, Errors)")]
IdempotencyKey = Annotated[StrictStr, Field(
    min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$",
    description="1..128 printable ASCII characters, chosen by the client: a retry with "
                "the same key for the same partition is answered with the first "
                "attempt's offsets and writes nothing (see docs/http-api.md)",
    examples=["order-4711"])]

TopicName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$",
          description="1..249 characters of [A-Za-z0-9._-], not '.' or '..'",
          examples=["orders"]),
]
Partition = Annotated[StrictInt, Field(ge=0, le=MAX_PARTITION, examples=[0])]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _check_topic(value: str) -> str:
    if value in (".", ".."):
        raise ValueError("a topic may not be '.' or '..'")
    return value


class Base64Record(_Strict):
    """Arbitrary bytes, base64-encoded (standard alphabet, with padding)."""

    base64: StrictStr = Field(examples=["AAE="])

    @field_validator("base64")
    @classmethod
    def _decodable(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("not valid base64") from None
        return value

    def decoded(self) -> bytes:
        return base64.b64decode(self.base64, validate=True)


ProduceRecord = Annotated[
    StrictStr | Base64Record,
    Field(description="A UTF-8 string, or {\"base64\": ...} for arbitrary bytes"),
]


class ProduceTopicPartition(_Strict):
    topic: TopicName
    partition: Partition
    records: list[ProduceRecord] = Field(min_length=1, examples=[["alpha", {"base64": "AAE="}]])
    idempotency_key: IdempotencyKey | None = None

    _topic = field_validator("topic")(_check_topic)

    @field_validator("records")
    @classmethod
    def _encodable(cls, records: list[str | Base64Record]) -> list[str | Base64Record]:
        for i, record in enumerate(records):
            if isinstance(record, str):
                try:
                    record.encode()
                except UnicodeEncodeError:
                    raise ValueError(f"record {i} is not valid UTF-8 text (a lone "
                                     "surrogate); send bytes as {\"base64\": ...}") from None
        return records

    def record_bytes(self) -> list[bytes]:
        return [r.encode() if isinstance(r, str) else r.decoded() for r in self.records]


class ProduceRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"topic_partitions": [
            {"topic": "orders", "partition": 0, "records": ["alpha", {"base64": "AAE="}]}
        ]}]},
    )

    topic_partitions: list[ProduceTopicPartition] = Field(min_length=1)


class ProducePartitionResult(BaseModel):
    """One entry per request entry, in request order; ``ok`` says which fields are set."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"topic": "orders", "partition": 0, "ok": True, "start_offset": 1, "end_offset": 2,
         "count": 2, "index_key": "llog/orders/partitions/0/index/00000000000000000002",
         "wal_uri": "s3://leaderless-log-wal/llog/wal-shared/3f2a"},
        {"topic": "orders", "partition": 1, "ok": False, "error_type": "PartitionFenced",
         "error": "orders:1 is fenced: appends are refused"},
    ]})

    topic: str
    partition: int
    ok: bool
    start_offset: int | None = None
    end_offset: int | None = None
    count: int | None = None
    index_key: str | None = None
    wal_uri: str | None = None
    duplicate: bool | None = Field(default=None, description=(
        "true when the idempotency key was committed before: these are the offsets of "
        "that first append, and nothing was written now"))
    error_type: ErrorType | None = None
    error: str | None = None
    retriable: bool | None = Field(default=None, description=(
        "on errors: sending the same entry again may succeed"))
    maybe_written: bool | None = Field(default=None, description=(
        "on errors: the records may have been committed although it could not be "
        "confirmed; retry with the same idempotency_key to be sure of one copy"))


class ProduceResponse(BaseModel):
    results: list[ProducePartitionResult]
    success_count: int
    error_count: int


class ConsumeTopicPartition(_Strict):
    topic: TopicName
    partition: Partition
    fetch_offset: Annotated[StrictInt, Field(ge=0, examples=[1], description=(
        "first offset wanted; offsets start at 1 and 0 means from the start"))]
    partition_max_bytes: Annotated[StrictInt, Field(ge=1, examples=[1048576])] | None = None

    _topic = field_validator("topic")(_check_topic)


class ConsumeRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{
            "topic_partitions": [{"topic": "orders", "partition": 0, "fetch_offset": 1,
                                  "partition_max_bytes": 1048576}],
            "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 4194304,
        }]},
    )

    topic_partitions: list[ConsumeTopicPartition] = Field(min_length=1)
    max_wait_ms: Annotated[StrictInt, Field(ge=0)] = 500
    min_bytes: Annotated[StrictInt, Field(ge=0)] = 1
    max_bytes: Annotated[StrictInt, Field(ge=1)] = 4 * 1024 * 1024
    encoding: Literal["auto", "base64"] = "auto"


class ConsumedRecord(BaseModel):
    """``value`` when the bytes are UTF-8 and encoding is auto; otherwise ``base64``."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"offset": 1, "value": "alpha"}, {"offset": 2, "base64": "AAE="},
    ]})

    offset: int
    value: str | None = None
    base64: str | None = None


class ConsumePartitionResult(BaseModel):
    topic: str
    partition: int
    ok: bool
    high_watermark: int | None = None
    next_offset: int | None = None
    records: list[ConsumedRecord] | None = None
    error_type: ErrorType | None = None
    error: str | None = None
    retriable: bool | None = None


class ConsumeResponse(BaseModel):
    results: list[ConsumePartitionResult]


class ErrorDetail(BaseModel):
    loc: str
    msg: str


class ErrorResponse(BaseModel):
    """Body of 400, 404, 413 and whole-request 503 answers."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "error_type": "InvalidRequest", "error": "invalid request body",
        "details": [{"loc": "topic_partitions.0.partition",
                     "msg": "Input should be a valid integer"}],
    }]})

    error_type: ErrorType
    error: str
    details: list[ErrorDetail] | None = None


class HealthResponse(BaseModel):
    """A broker names itself with ``broker_id``, ``host`` and ``port``; the compactor
    service with ``compactor_id``. ``failure`` says why a failed service failed."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "status": "ok", "broker_id": "broker-1", "host": "127.0.0.1", "port": 8080,
        "started_at_ms": 1760000000000,
    }]})

    status: Literal["ok", "starting", "stopping", "failed"]
    started_at_ms: int
    broker_id: str | None = None
    compactor_id: str | None = None
    host: str | None = None
    port: int | None = None
    failure: str | None = None
