"""What the audit reports: findings with a severity, and the object uses it checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.storage.codec import ENCODING_V1
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry

CORRUPTION = "corruption"
WARNING = "warning"
INFO = "info"
ERROR = "error"  # the audit itself failed for a partition

FINDING_COLUMNS = (
    "topic string, partition int, kind string, severity string, first_offset long, "
    "last_offset long, index_key string, data_key string, age_ms long, size long, "
    "message string"
)


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    message: str
    first_offset: int | None = None
    last_offset: int | None = None
    index_key: str | None = None
    data_key: str | None = None
    age_ms: int | None = None
    size: int | None = None

    def row(self, tp: TopicPartition) -> tuple[Any, ...]:
        return self.row_at(tp.topic, tp.partition)

    def row_at(self, topic: str, partition: int | None) -> tuple[Any, ...]:
        """A row of :data:`FINDING_COLUMNS` (``partition`` None: about a whole topic)."""
        return (topic, partition, self.kind, self.severity, self.first_offset,
                self.last_offset, self.index_key, self.data_key, self.age_ms, self.size,
                self.message)


@dataclass(frozen=True)
class ObjectUse:
    """One reference to check: the object, and the slice and records it should hold."""

    kind: str  # index | stray | pending | compaction
    data_key: str
    first: int
    last: int
    msg_count: int
    byte_offset: int | None
    byte_length: int | None
    crc32c: int | None
    index_key: str | None
    encoding: str = ENCODING_V1
    # The entry as recorded: how its bytes are stored (codec, raw_length, chunk table).
    entry: IndexEntry | None = field(default=None, compare=False, repr=False)
