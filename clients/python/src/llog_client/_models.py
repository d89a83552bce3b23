"""What the client takes and gives back: records to produce, records read, results of
produce, offsets and topics. Plain frozen dataclasses; bytes are bytes (the wire's
text/base64 choice is the client's business)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Bytesish = bytes | str  # str means its UTF-8 bytes


@dataclass(frozen=True)
class Record:
    """A record to produce with more than a value. ``headers`` are (name, value) pairs;
    names may repeat. ``timestamp_ms`` is the producer's time (the broker records its
    own append time as well)."""

    value: Bytesish
    key: Bytesish | None = None
    headers: Sequence[tuple[str, Bytesish]] = ()
    timestamp_ms: int | None = None


# What ``produce`` takes: a plain value (bytes, or text meaning its UTF-8 bytes) or a Record.
RecordLike = Bytesish | Record

Position = Literal["earliest", "latest"]
Start = Position | int


@dataclass(frozen=True)
class ProducedBatch:
    """Records of one produce call acknowledged together, at ``start_offset`` ..
    ``end_offset`` of one partition. ``first_index`` is the position of the batch's
    first record in the records given to ``produce``. ``duplicate``: a retry found the
    batch committed by an earlier attempt (nothing was written twice)."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    count: int
    first_index: int
    duplicate: bool = False

    @property
    def offsets(self) -> range:
        return range(self.start_offset, self.end_offset + 1)


@dataclass(frozen=True)
class ProduceResult:
    """Every batch of a produce call, in the order of the records given."""

    batches: tuple[ProducedBatch, ...]

    @property
    def count(self) -> int:
        return sum(b.count for b in self.batches)

    def offsets(self) -> list[tuple[int, int]]:
        """(partition, offset) of each record, in the order the records were given."""
        return [(b.partition, o) for b in self.batches for o in b.offsets]


class RecordMetadata(NamedTuple):
    """Where a producer's record was appended. ``duplicate``: a retry of its batch found
    it committed by an earlier attempt (it is stored once, at this offset). A named tuple:
    one is made per record acknowledged, and a tuple is made fastest."""

    topic: str
    partition: int
    offset: int
    duplicate: bool = False


@dataclass(frozen=True)
class ConsumedRecord:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None
    append_time_ms: int | None = None

    def text(self) -> str:
        """The value as UTF-8 text."""
        return self.value.decode()


@dataclass(frozen=True)
class Fetched:
    """One answer of a fetch: the records and where to continue."""

    topic: str
    partition: int
    records: tuple[ConsumedRecord, ...]
    next_offset: int
    high_watermark: int
    log_start_offset: int | None = None
    committed_offset: int | None = None  # a consume with commit: what it committed

    @property
    def at_end(self) -> bool:
        """Nothing was left to read when the broker answered."""
        return self.next_offset > self.high_watermark


@dataclass(frozen=True)
class PartitionOffsets:
    """Where a partition starts and ends; ``offset`` answers a time query (the first
    offset appended at or after it, or ``high_watermark + 1``)."""

    topic: str
    partition: int
    log_start_offset: int
    high_watermark: int
    offset: int | None = None


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    partitions: int
    retention_ms: int | None
    retention_bytes: int | None
    max_record_bytes: int | None
    created_at_ms: int
    compression: str = "none"  # how new appends are stored: none or zstd
    compression_level: int | None = None  # zstd's level (None: its default)
    # active; deleting (a delete goes on in the background); deleted (a delete's answer)
    status: str = "active"


@dataclass(frozen=True)
class PartitionState:
    partition: int
    log_start_offset: int
    high_watermark: int
    retained_bytes: int | None
    last_append_ms: int | None


@dataclass(frozen=True)
class TopicDescription(TopicInfo):
    partition_states: tuple[PartitionState, ...] = field(default=())


TopicPartitionKey = tuple[str, int]  # (topic, partition)
Resume = Start | Literal["committed"]


@dataclass(frozen=True)
class GroupMembership:
    """A member's standing in its group, as a join or a heartbeat answered it: its
    partitions in this ``generation`` (commits name it)."""

    group: str
    member_id: str
    generation: int
    assignment: tuple[TopicPartitionKey, ...]
    members: int
    session_timeout_ms: int
    heartbeat_interval_ms: int


@dataclass(frozen=True)
class GroupSummary:
    group: str
    generation: int
    members: int
    topics: tuple[str, ...]
    created_at_ms: int
    updated_at_ms: int


@dataclass(frozen=True)
class GroupPage:
    """One page of groups; ``next_after`` (None on the last page) asks for the next."""

    groups: tuple[GroupSummary, ...]
    next_after: str | None


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str | None
    topics: tuple[str, ...]
    session_timeout_ms: int
    joined_at_ms: int
    expires_at_ms: int | None
    assignment: tuple[TopicPartitionKey, ...]


@dataclass(frozen=True)
class GroupPartition:
    """A partition of the group: its owner, the last offset the group processed, and
    the lag (high watermark minus committed offset)."""

    topic: str
    partition: int
    owner: str | None
    committed_offset: int | None
    committed_generation: int | None
    committed_at_ms: int | None
    log_start_offset: int
    high_watermark: int
    lag: int | None


@dataclass(frozen=True)
class GroupDescription:
    group: str
    generation: int
    created_at_ms: int
    updated_at_ms: int
    members: tuple[GroupMember, ...]
    partitions: tuple[GroupPartition, ...]
