"""Request and response bodies of the HTTP API, as named schemas with examples.

Types are strict: ``"0"`` is not a partition, ``1`` is not a record, and unknown fields
are errors, so a generated client and a hand-written one are held to the same contract.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from app.errors import error_types
from app.storage.keys import MAX_PARTITION
from app.storage.log_record import LogRecord, Payload

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


Bytes = Annotated[StrictStr | Base64Record, Field(
    description="A UTF-8 string, or {\"base64\": ...} for arbitrary bytes")]


def _to_bytes(value: str | Base64Record) -> bytes:
    return value.encode() if isinstance(value, str) else value.decoded()


class Header(_Strict):
    name: StrictStr = Field(min_length=1, max_length=256, examples=["trace-id"])
    value: StrictStr | None = Field(default=None, examples=["4bf92f35"])
    base64: StrictStr | None = Field(default=None, examples=["AAE="])

    @field_validator("base64")
    @classmethod
    def _decodable(cls, value: str | None) -> str | None:
        if value is not None:
            Base64Record(base64=value)
        return value

    def pair(self) -> tuple[str, bytes]:
        if (self.value is None) == (self.base64 is None):
            raise ValueError(f"header {self.name!r} needs exactly one of value or base64")
        if self.value is not None:
            return self.name, self.value.encode()
        return self.name, base64.b64decode(self.base64 or "", validate=True)


class RecordObject(_Strict):
    """A record with more than a value: a key, headers, the producer's timestamp."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"value": "order created", "key": "customer-17",
         "headers": [{"name": "trace-id", "value": "4bf92f35"}],
         "timestamp_ms": 1760000000000}]})

    value: Bytes
    key: Bytes | None = None
    headers: list[Header] | None = None
    timestamp_ms: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None

    def payload(self) -> Payload:
        value = _to_bytes(self.value)
        if self.key is None and not self.headers and self.timestamp_ms is None:
            return value
        return LogRecord(value, None if self.key is None else _to_bytes(self.key),
                         tuple(h.pair() for h in self.headers or ()), self.timestamp_ms)


ProduceRecord = Annotated[
    StrictStr | Base64Record | RecordObject,
    Field(description="A UTF-8 string, {\"base64\": ...} for arbitrary bytes, or an "
                      "object with a value and a key, headers or a timestamp"),
]


class ProduceTopicPartition(_Strict):
    topic: TopicName
    partition: Partition | None = Field(default=None, description=(
        "the partition; omitted, it is chosen from the records' key (every record of the "
        "entry must carry the same key): Kafka's default partitioner, murmur2 of the key "
        "modulo the topic's partition count"))
    records: list[ProduceRecord] = Field(min_length=1, examples=[["alpha", {"base64": "AAE="}]])
    idempotency_key: IdempotencyKey | None = None

    _topic = field_validator("topic")(_check_topic)

    @field_validator("records")
    @classmethod
    def _encodable(cls, records: list[str | Base64Record | RecordObject]
                   ) -> list[str | Base64Record | RecordObject]:
        for i, record in enumerate(records):
            texts = [record] if isinstance(record, str) else _texts(record)
            for text in texts:
                try:
                    text.encode()
                except UnicodeEncodeError:
                    raise ValueError(f"record {i} holds text that is not valid UTF-8 (a "
                                     "lone surrogate); send bytes as {\"base64\": ...}"
                                     ) from None
            if isinstance(record, RecordObject):
                for header in record.headers or ():
                    header.pair()
        return records

    def payloads(self) -> list[Payload]:
        return [r.encode() if isinstance(r, str) else
                r.decoded() if isinstance(r, Base64Record) else r.payload()
                for r in self.records]


def _texts(record: Base64Record | RecordObject) -> list[str]:
    if isinstance(record, Base64Record):
        return []
    out = [v for v in (record.value, record.key) if isinstance(v, str)]
    for header in record.headers or ():
        out.append(header.name)
        if header.value is not None:
            out.append(header.value)
    return out


class ProduceRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"topic_partitions": [
            {"topic": "orders", "partition": 0, "records": ["alpha", {"base64": "AAE="}]},
            {"topic": "orders", "idempotency_key": "order-4711", "records": [
                {"value": "order created", "key": "customer-17",
                 "headers": [{"name": "trace-id", "value": "4bf92f35"}],
                 "timestamp_ms": 1760000000000}]},
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


Position = Literal["earliest", "latest", "committed"]


class ConsumeTopicPartition(_Strict):
    topic: TopicName
    partition: Partition
    fetch_offset: Annotated[StrictInt, Field(ge=0)] | Position = Field(
        examples=[1, "earliest", "committed"], description=(
            "first offset wanted: a number (offsets start at 1; 0 means the log start), "
            "\"earliest\" (the log start), \"latest\" (the next offset to be written) or "
            "\"committed\" (one past the group's committed offset; needs group)"))
    partition_max_bytes: Annotated[StrictInt, Field(ge=1, examples=[1048576])] | None = None

    _topic = field_validator("topic")(_check_topic)


class ConsumeRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{
            "topic_partitions": [{"topic": "orders", "partition": 0, "fetch_offset": 1,
                                  "partition_max_bytes": 1048576}],
            "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 4194304,
        }, {
            "topic_partitions": [{"topic": "orders", "partition": 0,
                                  "fetch_offset": "committed"}],
            "group": "billing", "auto_offset_reset": "earliest", "max_wait_ms": 5000,
        }]},
    )

    topic_partitions: list[ConsumeTopicPartition] = Field(min_length=1)
    max_wait_ms: Annotated[StrictInt, Field(ge=0)] = 500
    min_bytes: Annotated[StrictInt, Field(ge=0)] = 1
    max_bytes: Annotated[StrictInt, Field(ge=1)] = 4 * 1024 * 1024
    encoding: Literal["auto", "base64"] = "auto"
    group: Annotated[StrictStr, Field(
        min_length=1, max_length=249, pattern=r"^[A-Za-z0-9._-]+$")] | None = Field(
        default=None, examples=["billing"], description=(
            "the consumer group whose committed offsets \"committed\" reads and commit "
            "writes"))
    member_id: Annotated[StrictStr, Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None = Field(
        default=None, description="with commit: the member committing (with generation)")
    generation: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = None
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        default="earliest", description=(
            "where \"committed\" starts when the group committed nothing for the partition, "
            "or its committed offset is no longer in the log"))
    commit: StrictBool = Field(default=False, description=(
        "commit the last offset delivered of each partition before answering: "
        "at-most-once (a record is committed before the client processes it); for "
        "at-least-once, commit after processing (POST /groups/{group}/commit)"))

    @model_validator(mode="after")
    def _group_fields(self) -> Self:
        committed = any(e.fetch_offset == "committed" for e in self.topic_partitions)
        if (committed or self.commit) and self.group is None:
            raise ValueError("fetch_offset \"committed\" and commit need a group")
        if (self.member_id is None) != (self.generation is None):
            raise ValueError("member_id and generation go together")
        if self.member_id is not None and not self.commit:
            raise ValueError("member_id and generation are for commit")
        return self


class OffsetsTopicPartition(_Strict):
    topic: TopicName
    partition: Partition
    timestamp_ms: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)] | None = Field(
        default=None, description="also find the first offset appended at or after this "
                                  "time (milliseconds since the Unix epoch)")

    _topic = field_validator("topic")(_check_topic)


class OffsetsRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "topic_partitions": [{"topic": "orders", "partition": 0},
                             {"topic": "orders", "partition": 1,
                              "timestamp_ms": 1760000000000}]}]})

    topic_partitions: list[OffsetsTopicPartition] = Field(min_length=1)


class OffsetsPartitionResult(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"topic": "orders", "partition": 0, "ok": True, "log_start_offset": 1,
         "high_watermark": 42},
        {"topic": "orders", "partition": 1, "ok": True, "log_start_offset": 101,
         "high_watermark": 250, "offset": 188},
    ]})

    topic: str
    partition: int
    ok: bool
    log_start_offset: int | None = Field(default=None, description=(
        "the first offset still readable (retention moves it forward)"))
    high_watermark: int | None = None
    offset: int | None = Field(default=None, description=(
        "with timestamp_ms: the first offset appended at or after that time, or "
        "high_watermark + 1 when every record is older"))
    error_type: ErrorType | None = None
    error: str | None = None
    retriable: bool | None = None


class OffsetsResponse(BaseModel):
    results: list[OffsetsPartitionResult]


PositiveLimit = Annotated[StrictInt, Field(ge=1, le=2**63 - 1)]


class TopicCreateRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic": "orders", "partitions": 12, "retention_ms": 604800000}]})

    topic: TopicName
    partitions: Annotated[StrictInt, Field(ge=1, le=100_000)] = 1
    retention_ms: PositiveLimit | None = Field(default=None, description=(
        "records appended longer ago than this are removed; null keeps them"))
    retention_bytes: PositiveLimit | None = Field(default=None, description=(
        "per partition: the oldest records go once more bytes than this were appended "
        "after them; null keeps them"))
    max_record_bytes: PositiveLimit | None = Field(default=None, description=(
        "a lower record size limit for this topic than the broker's"))

    _topic = field_validator("topic")(_check_topic)


class TopicUpdateRequest(_Strict):
    """Only the fields present change; ``null`` clears a limit. Partitions only grow."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"partitions": 24, "retention_ms": None, "retention_bytes": 1073741824}]})

    partitions: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = None
    retention_ms: PositiveLimit | None = None
    retention_bytes: PositiveLimit | None = None
    max_record_bytes: PositiveLimit | None = None


class TopicInfo(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"topic": "orders", "partitions": 12, "retention_ms": 604800000,
         "retention_bytes": None, "max_record_bytes": None,
         "created_at_ms": 1760000000000}]})

    topic: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    max_record_bytes: int | None
    created_at_ms: int


class PartitionInfo(BaseModel):
    partition: int
    log_start_offset: int
    high_watermark: int
    retained_bytes: int | None = Field(description=(
        "body bytes from the log start on (null where not known)"))
    last_append_ms: int | None


class TopicDescription(TopicInfo):
    partition_states: list[PartitionInfo]


class TopicList(BaseModel):
    topics: list[TopicInfo]


class ConsumedHeader(BaseModel):
    name: str
    value: str | None = None
    base64: str | None = None


class ConsumedRecord(BaseModel):
    """``value`` when the bytes are UTF-8 text and encoding is auto; otherwise
    ``base64`` (likewise ``key``/``key_base64`` and each header). ``append_time_ms`` is
    when the broker appended the record; ``timestamp_ms`` the producer's, if it gave
    one."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"offset": 1, "value": "alpha", "append_time_ms": 1760000000000},
        {"offset": 2, "base64": "AAE=", "append_time_ms": 1760000000000},
        {"offset": 3, "value": "order created", "key": "customer-17",
         "headers": [{"name": "trace-id", "value": "4bf92f35"}],
         "timestamp_ms": 1759999999990, "append_time_ms": 1760000000003},
    ]})

    offset: int
    value: str | None = None
    base64: str | None = None
    key: str | None = None
    key_base64: str | None = None
    headers: list[ConsumedHeader] | None = None
    timestamp_ms: int | None = None
    append_time_ms: int | None = None


class ConsumePartitionResult(BaseModel):
    topic: str
    partition: int
    ok: bool
    high_watermark: int | None = None
    log_start_offset: int | None = None
    next_offset: int | None = None
    records: list[ConsumedRecord] | None = None
    committed_offset: int | None = Field(default=None, description=(
        "with commit: the offset committed for the group (the last record delivered)"))
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
