"""Request and response bodies of the consumer-group endpoints (docs/http-api.md,
Consumer groups), strict like the rest of the API (app/routes/models.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema
from typing_extensions import TypeAliasType

from app.routes.models import (
    MAX_SAFE_INTEGER,
    SUCCESS,
    Partition,
    TopicName,
    _check_topic,
    _Failure,
    _PartitionResult,
    _Strict,
    together,
)
from app.storage.names import NAME_MAX_CHARS, NAME_PATTERN, NAME_RULE

GroupName = Annotated[StrictStr, Field(
    min_length=1, max_length=NAME_MAX_CHARS, pattern=NAME_PATTERN,
    description=f"{NAME_RULE} (as topics)",
    examples=["billing"])]
MemberId = Annotated[StrictStr, Field(
    min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$",
    description="the member id the broker answered the join with",
    examples=["3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f"])]
Generation = Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER, examples=[4], description=(
    "the group's generation the member knows (from its join or last heartbeat)"))]
Offset = Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INTEGER, examples=[41])]


class JoinRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topics": ["orders"], "client_id": "billing-worker-1", "session_timeout_ms": 30000}]})

    topics: list[TopicName] = Field(min_length=1, description=(
        "the topics whose partitions this member reads (at most LLOG_GROUP_MAX_TOPICS)"))
    client_id: Annotated[StrictStr, Field(min_length=1, max_length=255,
                                          pattern=r"^[\x20-\x7e]+$")] | None = Field(
        default=None, description="a name for people reading describe; not an identity")
    session_timeout_ms: Annotated[StrictInt, Field(ge=1, le=2**31)] | None = Field(
        default=None, description=(
            "how long the member stays without a heartbeat; between "
            "LLOG_GROUP_MIN_SESSION_TIMEOUT_MS and LLOG_GROUP_MAX_SESSION_TIMEOUT_MS "
            "(default LLOG_GROUP_SESSION_TIMEOUT_MS)"))

    @model_validator(mode="after")
    def _topics(self) -> Self:
        for topic in self.topics:
            _check_topic(topic)
        return self


class MemberRequest(_Strict):
    """A heartbeat or a leave: who is asking."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"member_id": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f"}]})

    member_id: MemberId


class AssignedTopic(BaseModel):
    topic: str
    partitions: list[int]


class MemberAssignment(BaseModel):
    """What a member needs to consume: its id, the generation, its partitions."""

    model_config = ConfigDict(json_schema_extra={"examples": [{
        "group": "billing", "member_id": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f", "generation": 4,
        "assignment": [{"topic": "orders", "partitions": [0, 2]}], "members": 2,
        "session_timeout_ms": 30000, "heartbeat_interval_ms": 10000}]})

    group: str
    member_id: str
    generation: int
    assignment: list[AssignedTopic]
    members: int
    session_timeout_ms: int
    heartbeat_interval_ms: int = Field(description=(
        "heartbeat at least this often (a third of the session)"))


class LeaveResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "group": "billing", "member_id": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f", "left": True,
        "generation": 5}]})

    group: str
    member_id: str
    left: bool = Field(description="false when the member was not in the group any more")
    generation: int


class CommitOffset(_Strict):
    topic: TopicName
    partition: Partition
    offset: Offset = Field(description=(
        "the last offset processed (reading resumes one past it); at most the "
        "partition's high watermark"))


class CommitRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"member_id": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f", "generation": 4,
         "offsets": [{"topic": "orders", "partition": 0, "offset": 41}]}],
        "allOf": together("member_id", "generation")})

    member_id: MemberId | None = Field(default=None, description=(
        "with generation: commit as this member (it must own every partition); without "
        "both, the group must have no live members"))
    generation: Generation | None = None
    # Not uniqueItems, as ConsumeRequest.topic_partitions (app/routes/models.py).
    offsets: list[CommitOffset] = Field(min_length=1, description=(
        "each partition at most once (400 otherwise)"))

    @model_validator(mode="after")
    def _member(self) -> Self:
        if (self.member_id is None) != (self.generation is None):
            raise ValueError("member_id and generation go together")
        for entry in self.offsets:
            _check_topic(entry.topic)
        return self


COMMITTED: JsonDict = {"topic": "orders", "partition": 0, "ok": True, "outcome": "success",
                        "offset": 41}
STALE: JsonDict = {
    "topic": "orders", "partition": 1, "ok": False, "outcome": "failure",
    "error_type": "StaleGeneration",
    "error": "orders:1 was committed by generation 5 of group 'billing'; this commit is of "
             "generation 4", "retriable": False}


class OffsetSuccess(_PartitionResult):
    """A partition whose committed offset is now ``offset``."""

    model_config = ConfigDict(json_schema_extra={"examples": [COMMITTED]})

    ok: Literal[True] = Field(description="true: the offset is committed")
    outcome: Literal["success"] = Field(default=SUCCESS, description=(
        "success: the offset is committed (ok is true)"))
    offset: int = Field(description="the committed offset (the last processed)")


class OffsetFailure(_Failure):
    """A partition whose offset was not committed; the others' were."""

    model_config = ConfigDict(json_schema_extra={"examples": [STALE]})


OffsetResult = TypeAliasType("OffsetResult", Annotated[
    OffsetSuccess | OffsetFailure,
    Field(discriminator="outcome", description="A partition's commit")])


class OffsetResults(BaseModel):
    """One result per partition, in request order."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"results": [COMMITTED]}, {"results": [COMMITTED, STALE]}]})

    results: list[OffsetResult]


ResetPartition = Annotated[Partition | None, Field(description=(
    "omitted: every partition of the topic"))]
ResetPosition = Annotated[Literal["earliest", "latest"], Field(description=(
    "earliest: read from the log start next; latest: only what is written next"))]
ResetTimestamp = Annotated[StrictInt, Field(
    ge=0, le=MAX_SAFE_INTEGER, examples=[1760000000000],
    description="read next from the first offset appended at or after it")]
ResetOffset = Annotated[Offset, Field(description=(
    "the committed offset itself (the last processed; reading resumes one past it)"))]


# The three shapes of a reset entry, each a whole object with its topic: what the
# document describes (ResetEntry below), so that generated clients have a type for each.
class ResetToPosition(_Strict):
    """Reset to the log start or to its end."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic": "orders", "to": "earliest"}]})

    topic: TopicName
    partition: ResetPartition = None
    to: ResetPosition


class ResetToTimestamp(_Strict):
    """Reset to the first offset appended at or after a time."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic": "audit", "partition": 0, "timestamp_ms": 1760000000000}]})

    topic: TopicName
    partition: ResetPartition = None
    timestamp_ms: ResetTimestamp


class ResetToOffset(_Strict):
    """Set the committed offset itself."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic": "audit", "partition": 2, "offset": 41}]})

    topic: TopicName
    partition: ResetPartition = None
    offset: ResetOffset


RESET_SHAPES = (ResetToPosition, ResetToTimestamp, ResetToOffset)


class ResetEntry(_Strict):
    """Exactly one of ``to``, ``timestamp_ms`` and ``offset``.

    Validated as one model (a missing or second target is one 400 in the broker's
    words, and a null target reads as an absent one, as it always did) but described
    as ``oneOf`` the three closed shapes above. Rules alone beside the properties
    (``oneOf: [{required: [to]}, ...]``) become types without the topic in the
    generators (openapi-generator's TypeScript and Python, openapi-python-client),
    whose serializers then send ``{"to": ...}`` alone."""

    topic: TopicName
    partition: ResetPartition = None
    to: ResetPosition | None = None
    timestamp_ms: ResetTimestamp | None = None
    offset: ResetOffset | None = None

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # A union's members are generated as references to their named schemas.
        shapes = handler(core_schema.union_schema(
            [shape.__pydantic_core_schema__ for shape in RESET_SHAPES]))
        return {"description": "A partition, or every partition of a topic, and exactly "
                               "one target: to, timestamp_ms or offset",
                "oneOf": shapes["anyOf"]}

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        _check_topic(self.topic)
        given = [x for x in (self.to, self.timestamp_ms, self.offset) if x is not None]
        if len(given) != 1:
            raise ValueError("exactly one of to, timestamp_ms and offset")
        # The document's shapes leave the other targets out; a null for one is refused
        # as the document refuses it (as for a header's unused value or base64).
        if {"to", "timestamp_ms", "offset"} & self.model_fields_set != {
                name for name in ("to", "timestamp_ms", "offset")
                if getattr(self, name) is not None}:
            raise ValueError("exactly one of to, timestamp_ms and offset; leave the others "
                             "out rather than null")
        return self


class ResetRequest(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"topic_partitions": [{"topic": "orders", "to": "earliest"},
                              {"topic": "audit", "partition": 0,
                               "timestamp_ms": 1760000000000}]}]})

    topic_partitions: list[ResetEntry] = Field(min_length=1)


class GroupSummary(BaseModel):
    group: str
    generation: int
    members: int
    topics: list[str]
    created_at_ms: int
    updated_at_ms: int


class GroupList(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "groups": [{"group": "billing", "generation": 4, "members": 2, "topics": ["orders"],
                    "created_at_ms": 1760000000000, "updated_at_ms": 1760000360000}],
        "next_after": None}]})

    groups: list[GroupSummary]
    next_after: str | None = Field(default=None, description=(
        "more groups follow: ask again with after=this"))


class MemberInfo(BaseModel):
    member_id: str
    client_id: str | None
    topics: list[str]
    session_timeout_ms: int
    joined_at_ms: int
    expires_at_ms: int | None = Field(description="when its session ends without a heartbeat")
    assignment: list[AssignedTopic]


class GroupPartition(BaseModel):
    topic: str
    partition: int
    owner: str | None = Field(description="the member it is assigned to")
    committed_offset: int | None = Field(description="the last offset the group processed")
    committed_generation: int | None
    committed_at_ms: int | None
    log_start_offset: int
    high_watermark: int
    lag: int | None = Field(description="high_watermark - committed_offset")


class GroupDescription(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "group": "billing", "generation": 4, "created_at_ms": 1760000000000,
        "updated_at_ms": 1760000360000,
        "members": [{"member_id": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f",
                     "client_id": "billing-worker-1", "topics": ["orders"],
                     "session_timeout_ms": 30000, "joined_at_ms": 1760000300000,
                     "expires_at_ms": 1760000390000,
                     "assignment": [{"topic": "orders", "partitions": [0]}]}],
        "partitions": [{"topic": "orders", "partition": 0,
                        "owner": "3f0c9d2e8b7a4c1d9e6f5a4b3c2d1e0f", "committed_offset": 41,
                        "committed_generation": 4, "committed_at_ms": 1760000370000,
                        "log_start_offset": 1, "high_watermark": 45, "lag": 4}]}]})

    group: str
    generation: int
    created_at_ms: int
    updated_at_ms: int
    members: list[MemberInfo]
    partitions: list[GroupPartition]
