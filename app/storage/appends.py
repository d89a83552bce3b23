"""What an append is, as the batcher and the writer exchange it.

A caller hands the writer :class:`AppendGroup` s (one entry of a produce request each,
several of them may name the same partition) and gets one :class:`AppendOutcome` per
group back, in order: an :class:`AppendResult` or the error that stopped it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import LlogError
from app.storage.batch import records_size
from app.storage.compression import NO_COMPRESSION, Compression
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload


@dataclass(frozen=True)
class AppendGroup:
    """Records for one partition.

    ``idempotency_key`` makes the group's append happen at most once while the key is
    remembered (see docs/protocol.md, Idempotent appends): a repeat answers the first
    append's offsets with ``duplicate`` set instead of writing again.

    ``compression``: how the topic stores its appends, as the caller's cached catalog
    record says (the writer reads no topic record of its own).
    """

    tp: TopicPartition
    records: Sequence[Payload]
    idempotency_key: str | None = None
    compression: Compression = NO_COMPRESSION

    @property
    def size(self) -> int:
        return records_size(self.records)


@dataclass(frozen=True)
class AppendResult:
    tp: TopicPartition
    start_offset: int
    end_offset: int
    count: int
    index_key: str
    wal_uri: str
    duplicate: bool = False
    append_time_ms: int = 0  # the broker's append time of these records


AppendOutcome = AppendResult | LlogError
