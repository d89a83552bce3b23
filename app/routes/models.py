"""Request and response bodies of the HTTP API, as named schemas with examples.

Types are strict: ``"0"`` is not a partition, ``1`` is not a record, and unknown fields
are errors, so a generated client and a hand-written one are held to the same contract.
"""

from __future__ import annotations

import base64
import binascii
import enum
from typing import Annotated, Literal, Self

from fastapi import Path
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict, JsonValue
from pydantic.json_schema import JsonSchemaValue, SkipJsonSchema
from pydantic_core import CoreSchema
from typing_extensions import TypeAliasType

from app.routes.error_types import ErrorType
from app.settings import MAX_PARTITIONS_PER_REQUEST_CEILING
from app.storage.appends import ProducerSeq
from app.storage.compression import ZSTD_MAX_LEVEL, ZSTD_MIN_LEVEL
from app.storage.keys import MAX_PARTITION
from app.storage.log_record import LogRecord, Payload
from app.storage.names import (
    IDEMPOTENCY_KEY_MAX_CHARS,
    IDEMPOTENCY_KEY_PATTERN,
    IDEMPOTENCY_KEY_RULE,
    NAME_MAX_CHARS,
    NAME_PATTERN,
    NAME_RULE,
)
from app.wire.produce import PRODUCER_RULE

# An answer's field that is left out when it does not apply: answers are sent without
# their None fields, so the document says "optional", never "null".
Absent = SkipJsonSchema[None]
IdempotencyKey = Annotated[StrictStr, Field(
    min_length=1, max_length=IDEMPOTENCY_KEY_MAX_CHARS, pattern=IDEMPOTENCY_KEY_PATTERN,
    description=f"{IDEMPOTENCY_KEY_RULE}, chosen by the client: a retry with "
                "the same key for the same partition is answered with the first "
                "attempt's offsets and writes nothing (see docs/http-api.md)",
    examples=["order-4711"])]

ProducerId = Annotated[StrictStr, Field(
    min_length=1, max_length=IDEMPOTENCY_KEY_MAX_CHARS, pattern=IDEMPOTENCY_KEY_PATTERN,
    description=f"{IDEMPOTENCY_KEY_RULE}, chosen by the client once for its life (a "
                "random id): with sequence, the partition answers a repeat of the "
                "producer's entry with its first offsets and keeps the producer's entries "
                "in order (see docs/http-api.md, Idempotent producers)",
    examples=["7f3c9a0e5b2d4c18"])]

TopicName = Annotated[
    StrictStr,
    Field(min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN,
          description=NAME_RULE,
          examples=["orders"]),
]
# A topic in a path: the document declares the same pattern, so a client generated from
# it (or a fuzzer) knows which names the broker refuses.
PathTopic = Annotated[TopicName, Path(description="the topic's name")]
Partition = Annotated[StrictInt, Field(ge=0, le=MAX_PARTITION, examples=[0])]


# The largest offset, generation, time or byte count a request may name: 2**53 - 1, the
# largest integer every JSON reader holds exactly. Above it doubles are 2 or more apart,
# and a reader that compares numbers as doubles (JSON Schema validators, JavaScript)
# would take a number just past the bound for the bound itself.
MAX_SAFE_INTEGER = 2**53 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _integral(cls, value: object) -> object:
        """A JSON number without a fraction (``2191.0``) as the integer it is: JSON
        Schema counts it an integer, so a field the document types ``integer`` takes
        it as it takes ``2191``. Anything else (``2.5``, ``"2"``, ``true``) is left as
        it came, for the strict types to refuse. (A validator rather than a type, so
        that the fields' bounds stay ``minimum``/``maximum`` in the document.)"""
        if type(value) is float and value.is_integer():
            return int(value)
        return value


def _check_topic(value: str) -> str:
    if value in (".", ".."):
        raise ValueError("a topic may not be '.' or '..'")
    return value


def _given(*fields: str, **values: JsonDict) -> JsonDict:
    """A JSON schema matching objects with each of ``fields`` present and not null (and
    each of ``values`` matching its schema): the rules of a model's validator, stated in
    the document, where the validator reads a null field as an absent one."""
    properties: JsonDict = {f: {"not": {"type": "null"}} for f in fields}
    properties.update(values)
    return {"required": [*fields, *values], "properties": properties}


# Standard base64 with padding, as the validators below decode it (validate=True).
BASE64_PATTERN = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def together(a: str, b: str) -> list[JsonValue]:
    """JSON Schema rules: ``a`` and ``b`` are given together or not at all."""
    return [{"if": _given(a), "then": _given(b)}, {"if": _given(b), "then": _given(a)}]


class Base64Record(_Strict):
    """Arbitrary bytes, base64-encoded (standard alphabet, with padding)."""

    base64: StrictStr = Field(examples=["AAE="], pattern=BASE64_PATTERN)

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


class OneOf:
    """Marks a union whose members never overlap (a string, or objects that forbid each
    other's fields) to be described as ``oneOf`` rather than pydantic's ``anyOf``.
    Generators read ``anyOf`` as one type holding every member's fields at once
    (openapi-generator's TypeScript: an interface requiring both ``base64`` and
    ``value``, whose serializer mangles every record); ``oneOf`` as the union it is."""

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        if "anyOf" in schema:
            schema["oneOf"] = schema.pop("anyOf")
        return schema


# Named, so that generated clients have a type for it rather than an anonymous one.
RecordBytes = TypeAliasType("RecordBytes", Annotated[StrictStr | Base64Record, OneOf(), Field(
    description="A UTF-8 string, or {\"base64\": ...} for arbitrary bytes")])


def _to_bytes(value: str | Base64Record) -> bytes:
    return value.encode() if isinstance(value, str) else value.decoded()


class TextHeader(_Strict):
    """A header whose value is a UTF-8 string."""

    name: StrictStr = Field(min_length=1, max_length=256, examples=["trace-id"])
    value: StrictStr = Field(examples=["4bf92f35"])

    def pair(self) -> tuple[str, bytes]:
        return self.name, self.value.encode()


class Base64Header(_Strict):
    """A header whose value is arbitrary bytes, base64-encoded."""

    name: StrictStr = Field(min_length=1, max_length=256, examples=["trace-id"])
    base64: StrictStr = Field(examples=["AAE="], pattern=BASE64_PATTERN)

    @field_validator("base64")
    @classmethod
    def _decodable(cls, value: str) -> str:
        Base64Record(base64=value)
        return value

    def pair(self) -> tuple[str, bytes]:
        return self.name, base64.b64decode(self.base64, validate=True)


# Exactly one of value and base64: two shapes, each a whole object with its name, so
# that generated clients have a type for each (a null member is refused: no generator
# reads a property whose type is null). (Rules alone,
# {"oneOf": [{"required": ["value"]}, ...]}, become types without the name: TypeScript's
# serializer then sends {"value": ...} alone.)
Header = TypeAliasType("Header", Annotated[TextHeader | Base64Header, OneOf(), Field(
    description="A header: its name, and a UTF-8 value or base64 bytes")])


class RecordObject(_Strict):
    """A record with more than a value: a key, headers, the producer's timestamp."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"value": "order created", "key": "customer-17",
         "headers": [{"name": "trace-id", "value": "4bf92f35"}],
         "timestamp_ms": 1760000000000}]})

    value: RecordBytes
    key: RecordBytes | None = None
    headers: list[Header] | None = None
    timestamp_ms: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None

    def payload(self) -> Payload:
        value = _to_bytes(self.value)
        if self.key is None and not self.headers and self.timestamp_ms is None:
            return value
        return LogRecord(value, None if self.key is None else _to_bytes(self.key),
                         tuple(h.pair() for h in self.headers or ()), self.timestamp_ms)


ProduceRecord = TypeAliasType("ProduceRecord", Annotated[
    StrictStr | Base64Record | RecordObject, OneOf(),
    Field(description="A UTF-8 string, {\"base64\": ...} for arbitrary bytes, or an "
                      "object with a value and a key, headers or a timestamp"),
])


class ProduceTopicPartition(_Strict):
    # Without a partition, every record is an object with a key (that the keys are
    # equal, JSON Schema cannot say: the broker refuses other keys with 400).
    # A producer's entry (producer_id with sequence, not one without the other) names its
    # partition and carries no idempotency key.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"allOf": [
        {"if": {"not": _given("partition")},
         "then": {"properties": {"records": {"items": {"type": "object", **_given("key")}}}}},
        {"if": _given("producer_id"),
         "then": {**_given("sequence", "partition"), "not": _given("idempotency_key")}},
        {"if": _given("sequence"), "then": _given("producer_id")},
    ]})

    topic: TopicName
    partition: Partition | None = Field(default=None, description=(
        "the partition; omitted, it is chosen from the records' key (every record of the "
        "entry must carry the same key): Kafka's default partitioner, murmur2 of the key "
        "modulo the topic's partition count"))
    records: list[ProduceRecord] = Field(min_length=1, examples=[["alpha", {"base64": "AAE="}]])
    idempotency_key: IdempotencyKey | None = None
    producer_id: ProducerId | None = None
    sequence: int | None = Field(default=None, ge=0, le=MAX_SAFE_INTEGER, description=(
        "with producer_id: this entry's number in the producer's sequence for the "
        "partition, 0 for its first entry and one more for each after it"))

    _topic = field_validator("topic")(_check_topic)

    @model_validator(mode="after")
    def _sequenced(self) -> Self:
        if (self.producer_id is None) != (self.sequence is None):
            raise ValueError("producer_id and sequence come together")
        if self.producer_id is not None and (self.partition is None
                                             or self.idempotency_key is not None):
            raise ValueError(PRODUCER_RULE)
        return self

    def producer(self) -> ProducerSeq | None:
        if self.producer_id is None or self.sequence is None:
            return None
        return ProducerSeq(self.producer_id, self.sequence)

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
        if isinstance(header, TextHeader):
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


class _PartitionResult(BaseModel):
    """One entry of a result list: a success or a failure, told apart by ``outcome``
    (``"success"``/``"failure"``) and by ``ok`` (``true``/``false``), which always agree.

    ``outcome`` is what the document discriminates on: generators read a boolean
    discriminator's ``const: true`` as the string ``"true"`` and then match no answer
    (openapi-generator) or cannot decode it (oapi-codegen), so ``ok`` is described as a
    plain boolean and ``outcome``, a string, picks the schema."""

    topic: str = Field(examples=["orders"])
    partition: int = Field(examples=[0])

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = super().__get_pydantic_json_schema__(core_schema, handler)
        schema = handler.resolve_ref_schema(json_schema)
        properties = schema.get("properties", {})
        if "outcome" in properties:
            properties["ok"].pop("const", None)
            # Answered in every result (it has a default only so that code building a
            # model need not repeat what the class already says).
            if "outcome" not in schema.setdefault("required", []):
                schema["required"].insert(schema["required"].index("ok") + 1, "outcome")
        return json_schema


SUCCESS: Literal["success"] = "success"
FAILURE: Literal["failure"] = "failure"


class _Failure(_PartitionResult):
    ok: Literal[False] = Field(description="false: this entry failed, error_type says why")
    outcome: Literal["failure"] = Field(default=FAILURE, description=(
        "failure: this entry failed (ok is false)"))
    error_type: ErrorType
    error: str = Field(description="what went wrong, for people")
    retriable: bool = Field(description="sending the same entry again may succeed")


PRODUCED: JsonDict = {
    "topic": "orders", "partition": 0, "ok": True, "outcome": "success", "start_offset": 1,
    "end_offset": 2, "count": 2,
    "index_key": "llog/orders/partitions/0/index/00000000000000000002",
    "wal_uri": "s3://leaderless-log-wal/llog/wal-shared/3f6c2a0e"}
FENCED: JsonDict = {
    "topic": "audit", "partition": 3, "ok": False, "outcome": "failure",
    "error_type": "PartitionFenced",
    "error": "audit/3 is fenced; appends are refused", "retriable": False,
    "maybe_written": False}


class ProduceSuccess(_PartitionResult):
    """A written entry: its records are durable and readable at these offsets."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        PRODUCED, {**PRODUCED, "duplicate": True}]})

    ok: Literal[True] = Field(description="true: the records are written")
    outcome: Literal["success"] = Field(default=SUCCESS, description=(
        "success: the records are written (ok is true)"))
    start_offset: int = Field(description="the offset of the entry's first record")
    end_offset: int = Field(description="the offset of the entry's last record")
    count: int = Field(description="how many records the entry holds")
    index_key: str | Absent = Field(default=None, description=(
        "Oxia key of the index entry of the append holding the records; informational. "
        "Absent when LLOG_PRODUCE_LOCATIONS keeps it from this caller"))
    wal_uri: str | Absent = Field(default=None, description=(
        "the shared WAL object holding the records; informational. Absent when "
        "LLOG_PRODUCE_LOCATIONS keeps it from this caller"))
    duplicate: bool | Absent = Field(default=None, description=(
        "present and true when the idempotency key was committed before: these are the "
        "offsets of that first append, and nothing was written now"))


class ProduceFailure(_Failure):
    """A failed entry: not written, unless ``maybe_written`` (``CommitInDoubt``)."""

    model_config = ConfigDict(json_schema_extra={"examples": [FENCED]})

    maybe_written: bool = Field(description=(
        "the records may have been committed although it could not be confirmed; retry "
        "with the same idempotency_key to be sure of one copy"))


ProducePartitionResult = TypeAliasType("ProducePartitionResult", Annotated[
    ProduceSuccess | ProduceFailure,
    Field(discriminator="outcome", description="An entry's outcome")])


class ProduceResults(BaseModel):
    """Each entry's outcome; entries succeed or fail independently."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"results": [PRODUCED], "success_count": 1, "error_count": 0},
        {"results": [PRODUCED, FENCED], "success_count": 1, "error_count": 1},
    ]})

    results: list[ProducePartitionResult] = Field(description=(
        "one per request entry, in request order"))
    success_count: int
    error_count: int


# Named, so that a generated client calls it Position.
Position = TypeAliasType("Position", Literal["earliest", "latest", "committed"])


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


# The rules of the validator below, in the document: which fields go together. (Only
# when a field is present and not null, as the validator reads them.)
_CONSUME_RULES: tuple[JsonValue, ...] = (
    *together("member_id", "generation"),
    {"if": _given("member_id"), "then": _given(commit={"const": True})},
    {"if": _given(commit={"const": True}), "then": _given("group")},
    {"if": _given(topic_partitions={"contains": _given(fetch_offset={"const": "committed"})}),
     "then": _given("group")},
)


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
        }], "allOf": list(_CONSUME_RULES)},
    )

    # Bounded here, so a body of many entries is refused while it is read; the route
    # applies the configured limit (LLOG_MAX_PARTITIONS_PER_REQUEST, at most this).
    # Not uniqueItems: it compares whole entries (the same partition at two offsets
    # passes it), and typescript-fetch types such a list as a Set, which tells objects
    # apart by identity, so it keeps nothing unique.
    topic_partitions: list[ConsumeTopicPartition] = Field(
        min_length=1, max_length=MAX_PARTITIONS_PER_REQUEST_CEILING, description=(
            "each partition at most once (400 otherwise); at most "
            "LLOG_MAX_PARTITIONS_PER_REQUEST partitions (413 beyond; 1000 by default), "
            "never more than this schema's maxItems (400)"))
    max_wait_ms: Annotated[StrictInt, Field(ge=0)] = 500
    min_bytes: Annotated[StrictInt, Field(ge=0)] = 1
    max_bytes: Annotated[StrictInt, Field(ge=1)] = 4 * 1024 * 1024
    encoding: Literal["auto", "base64"] = "auto"
    group: Annotated[StrictStr, Field(
        min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN)] | None = Field(
        default=None, examples=["billing"], description=(
            "the consumer group whose committed offsets \"committed\" reads and commit "
            "writes"))
    member_id: Annotated[StrictStr, Field(
        min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")] | None = Field(
        default=None, description="with commit: the member committing (with generation)")
    generation: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = None
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
    timestamp_ms: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER)] | None = Field(
        default=None, description="also find the first offset appended at or after this "
                                  "time (milliseconds since the Unix epoch)")

    _topic = field_validator("topic")(_check_topic)


class OffsetsRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "topic_partitions": [{"topic": "orders", "partition": 0},
                             {"topic": "orders", "partition": 1,
                              "timestamp_ms": 1760000000000}]}]})

    topic_partitions: list[OffsetsTopicPartition] = Field(min_length=1)


class OffsetsSuccess(_PartitionResult):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"topic": "orders", "partition": 0, "ok": True, "outcome": "success",
         "log_start_offset": 1, "high_watermark": 42},
        {"topic": "orders", "partition": 1, "ok": True, "outcome": "success",
         "log_start_offset": 101, "high_watermark": 250, "offset": 188},
    ]})

    ok: Literal[True] = Field(description="true: the partition could be looked up")
    outcome: Literal["success"] = Field(default=SUCCESS, description=(
        "success: the partition could be looked up (ok is true)"))
    log_start_offset: int = Field(description=(
        "the first offset still readable (retention moves it forward)"))
    high_watermark: int = Field(description="the last committed offset (0: empty)")
    offset: int | Absent = Field(default=None, description=(
        "with timestamp_ms: the first offset appended at or after that time, or "
        "high_watermark + 1 when every record is older"))


class OffsetsFailure(_Failure):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"topic": "orders", "partition": 9, "ok": False, "outcome": "failure",
         "error_type": "UnknownPartition",
         "error": "topic 'orders' has 4 partitions", "retriable": False}]})


OffsetsPartitionResult = TypeAliasType("OffsetsPartitionResult", Annotated[
    OffsetsSuccess | OffsetsFailure,
    Field(discriminator="outcome", description="A partition's offsets")])


class OffsetsResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"results": [
        {"topic": "orders", "partition": 0, "ok": True, "outcome": "success", "log_start_offset": 1,
         "high_watermark": 42}]}]})

    results: list[OffsetsPartitionResult]


PositiveLimit = Annotated[StrictInt, Field(ge=1, le=MAX_SAFE_INTEGER)]
CompressionName = Literal["none", "zstd"]
CompressionLevel = Annotated[StrictInt, Field(ge=ZSTD_MIN_LEVEL, le=ZSTD_MAX_LEVEL)]
_COMPRESSION = ("how the topic's appends are stored from now on (each stored body says "
                "its own codec, so a change applies to new appends); absent on create: "
                "the broker's LLOG_TOPIC_DEFAULT_COMPRESSION")
_LEVEL = (f"the zstd level, {ZSTD_MIN_LEVEL} to {ZSTD_MAX_LEVEL} (null: the codec's "
          "default, 3); given only together with compression zstd")


class _CompressionFields(_Strict):
    compression: CompressionName | Absent = Field(default=None, description=_COMPRESSION)
    compression_level: CompressionLevel | None = Field(default=None, description=_LEVEL)

    @model_validator(mode="after")
    def _level_with_zstd(self) -> Self:
        if "compression" in self.model_fields_set and self.compression is None:
            raise ValueError("compression is none or zstd, not null")  # absent, or a name
        if self.compression_level is not None and self.compression != "zstd":
            raise ValueError("compression_level is given with compression zstd only")
        return self


# The rule of the validator above, in the document (a null level reads as an absent one).
_COMPRESSION_RULES: list[JsonValue] = [
    {"if": _given("compression_level"), "then": _given(compression={"const": "zstd"})}]


class TopicCreateRequest(_CompressionFields):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic": "orders", "partitions": 12, "retention_ms": 604800000}],
        "allOf": _COMPRESSION_RULES})

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


class TopicUpdateRequest(_CompressionFields):
    """Only the fields present change; ``null`` clears a limit. Partitions only grow.
    ``compression`` sets ``compression_level`` too (absent: the codec's default)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"partitions": 24, "retention_bytes": 1073741824}], "allOf": _COMPRESSION_RULES})

    partitions: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = None
    retention_ms: PositiveLimit | None = None
    retention_bytes: PositiveLimit | None = None
    max_record_bytes: PositiveLimit | None = None


# No example holds a null: FastAPI leaves None values out of the whole document.
TOPIC: JsonDict = {"topic": "orders", "partitions": 12, "retention_ms": 604800000,
                   "retention_bytes": 1073741824, "max_record_bytes": 1048576,
                   "compression": "zstd", "compression_level": 3,
                   "created_at_ms": 1760000000000, "status": "active"}
PARTITION_STATE: JsonDict = {
    "partition": 0, "log_start_offset": 1, "high_watermark": 42, "retained_bytes": 4096,
    "last_append_ms": 1760000000000}


class TopicDeletion(BaseModel):
    """A deletion under way: when it started, and how many partitions (from 0 on) are
    empty already."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"started_at_ms": 1760000000000, "partitions_emptied": 256}]})

    started_at_ms: int
    partitions_emptied: int


class TopicInfo(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [TOPIC]})

    topic: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    max_record_bytes: int | None
    compression: CompressionName = Field(description="how new appends are stored")
    compression_level: int | None = Field(description="the zstd level (null: default)")
    created_at_ms: int
    status: Literal["active", "deleting", "deleted"] = Field("active", description=(
        "active; deleting: a delete has started (the topic is produced to and read by "
        "no broker, its name is not free; GET /topics/{topic} answers 404 once it is "
        "done); deleted: in the answer of a DELETE that finished"))
    deletion: TopicDeletion | None = Field(None, description="while status is deleting")


class PartitionInfo(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [PARTITION_STATE]})

    partition: int
    log_start_offset: int
    high_watermark: int
    retained_bytes: int | None = Field(description=(
        "body bytes from the log start on (null where not known)"))
    last_append_ms: int | None


class TopicDescription(TopicInfo):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {**TOPIC, "partitions": 1, "partition_states": [PARTITION_STATE]}]})

    partition_states: list[PartitionInfo] = Field(description=(
        "the page of partitions asked for (from_partition on, at most max_partitions); "
        "empty while the topic is being deleted"))
    next_partition: int | None = Field(None, description=(
        "the from_partition of the next page; null on the last"))


class TopicList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"topics": [TOPIC]}]})

    topics: list[TopicInfo]


class ConsumedHeader(BaseModel):
    """A header: ``value`` when it is text (and encoding is auto), else ``base64``."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "trace-id", "value": "4bf92f35"}, {"name": "bin", "base64": "AAE="}]})

    name: str
    value: str | Absent = None
    base64: str | Absent = None


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
    value: str | Absent = None
    base64: str | Absent = None
    key: str | Absent = None
    key_base64: str | Absent = None
    headers: list[ConsumedHeader] | Absent = None
    timestamp_ms: int | Absent = None
    append_time_ms: int | Absent = None


CONSUMED: JsonDict = {
    "topic": "orders", "partition": 0, "ok": True, "outcome": "success", "high_watermark": 2,
    "log_start_offset": 1, "next_offset": 3, "records": [
        {"offset": 1, "value": "alpha", "append_time_ms": 1760000000000},
        {"offset": 2, "base64": "AAE=", "append_time_ms": 1760000000000}]}
OUT_OF_RANGE: JsonDict = {
    "topic": "orders", "partition": 1, "ok": False, "outcome": "failure",
    "error_type": "OffsetOutOfRange",
    "error": "offset 9 of orders/1 is beyond the high watermark 5 + 1", "retriable": False,
    "log_start_offset": 1, "high_watermark": 5}


class ConsumeSuccess(_PartitionResult):
    """A partition that could be read (possibly with no records yet)."""

    model_config = ConfigDict(json_schema_extra={"examples": [CONSUMED]})

    ok: Literal[True] = Field(description="true: the partition could be read")
    outcome: Literal["success"] = Field(default=SUCCESS, description=(
        "success: the partition could be read (ok is true)"))
    high_watermark: int = Field(description=(
        "the last committed offset when the partition was read (0: empty)"))
    log_start_offset: int = Field(description="the first offset still readable")
    next_offset: int = Field(description="the offset to fetch next")
    records: list[ConsumedRecord] = Field(description="in offset order, possibly empty")
    committed_offset: int | Absent = Field(default=None, description=(
        "with commit: the offset committed for the group (the last record delivered)"))


class ConsumeFailure(_Failure):
    """A partition that could not be read; the others are answered as usual."""

    model_config = ConfigDict(json_schema_extra={"examples": [OUT_OF_RANGE]})

    log_start_offset: int | Absent = Field(default=None, description=(
        "with OffsetOutOfRange: where the log starts"))
    high_watermark: int | Absent = Field(default=None, description=(
        "with OffsetOutOfRange: where the log ends"))


ConsumePartitionResult = TypeAliasType("ConsumePartitionResult", Annotated[
    ConsumeSuccess | ConsumeFailure,
    Field(discriminator="outcome", description="A partition's outcome")])


class ConsumeResults(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"results": [CONSUMED]}, {"results": [CONSUMED, OUT_OF_RANGE]}]})

    results: list[ConsumePartitionResult] = Field(description=(
        "one per requested partition, in request order"))


class ErrorDetail(BaseModel):
    """One problem with the request: where it is and what is wrong there."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"loc": "topic_partitions.0.partition", "msg": "Input should be a valid integer"}]})

    loc: str = Field(description="a dot-separated path into the request body")
    msg: str


class ErrorResponse(BaseModel):
    """The body of an answer refusing the whole request (4xx, and whole-request 5xx)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "error_type": "InvalidRequest", "error": "invalid request body",
        "details": [{"loc": "topic_partitions.0.partition",
                     "msg": "Input should be a valid integer"}],
    }]})

    error_type: ErrorType
    error: str = Field(description="what went wrong, for people")
    details: list[ErrorDetail] | Absent = Field(default=None, description=(
        "with InvalidRequest: one item per problem"))


class ServiceStatus(enum.StrEnum):
    """``ok``: taking work; ``starting``; ``stopping``: draining for shutdown; ``failed``:
    a background loop failed."""

    OK = "ok"
    STARTING = "starting"
    STOPPING = "stopping"
    FAILED = "failed"


class HealthResponse(BaseModel):
    """A broker names itself with ``broker_id``, ``host`` and ``port``; the compactor
    service with ``compactor_id``. ``failure`` says why a failed service failed."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "status": "ok", "broker_id": "broker-1", "host": "127.0.0.1", "port": 8080,
        "started_at_ms": 1760000000000,
    }]})

    status: ServiceStatus
    started_at_ms: int
    broker_id: str | Absent = None
    compactor_id: str | Absent = None
    host: str | Absent = None
    port: int | Absent = None
    failure: str | Absent = None


class MetricsSnapshot(BaseModel):
    """Process-local figures: the service's identity and settings, then every sample as
    ``{metric: {labels: value}}`` (labels ``k=v`` joined by commas, ``""`` without)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [{
        "broker_id": "broker-1", "roles": ["write", "read", "compact"], "status": "ok",
        "started_at_ms": 1760000000000,
        "batch": {"max_bytes": 4194304, "max_delay_ms": 5, "buffer_max_bytes": 67108864},
        "metrics": {"llog_produce_records_total": {"": 2.0},
                    "llog_s3_requests_total": {"op=put,outcome=ok": 1.0}}}]})

    status: ServiceStatus
    started_at_ms: int
    metrics: dict[str, dict[str, float]]
