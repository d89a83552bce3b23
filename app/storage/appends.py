"""What an append is, as the batcher and the writer exchange it.

A caller hands the writer :class:`AppendGroup` s (one entry of a produce request each,
several of them may name the same partition) and gets one :class:`AppendOutcome` per
group back, in order: an :class:`AppendResult` or the error that stopped it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import LlogError, ProduceExpired
from app.storage.batch import records_size
from app.storage.compression import NO_COMPRESSION, Compression
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload


@dataclass(frozen=True)
class ProducerSeq:
    """Where a group stands in its producer's sequence for its partition: the producer's
    id (the client's, stable while it runs) and the group's number, 0 for the
    producer's first group to the partition, one more for each after it (docs/protocol.md,
    Idempotent producers)."""

    producer_id: str
    sequence: int


@dataclass(frozen=True)
class AppendGroup:
    """Records for one partition.

    ``idempotency_key`` makes the group's append happen at most once while the key is
    remembered (see docs/protocol.md, Idempotent appends): a repeat answers the first
    append's offsets with ``duplicate`` set instead of writing again. ``producer`` does
    the same by the producer's sequence, and keeps the producer's groups in order
    (Idempotent producers); a group carries one of the two at most.

    ``compression``: how the topic stores its appends, as the caller's cached catalog
    record says (the writer reads no topic record of its own).

    ``commit_by``: a ``time.monotonic()`` time; no compare-and-set that would commit the
    group expects a control version read after it: once it has passed, whoever sent the
    records may send them again (a client whose produce deadline ended, docs/protocol.md,
    The produce commit deadline; a forwarding broker whose commit window ended, Forward
    fences), and a late first copy must not land after that resend was read. Past it the
    group is answered ``expired_as`` (:class:`~app.errors.ProduceExpired` or
    :class:`~app.errors.ForwardExpired`), never committed, and the groups beside it are
    committed without it; unless an unanswered attempt that read its version in time may
    still commit them all: that attempt is sent again, as it was.
    """

    tp: TopicPartition
    records: Sequence[Payload]
    idempotency_key: str | None = None
    compression: Compression = NO_COMPRESSION
    commit_by: float | None = None
    expired_as: type[LlogError] = ProduceExpired
    producer: ProducerSeq | None = None

    @property
    def identity(self) -> str | ProducerSeq | None:
        """What makes a repeat of this group the same append: its idempotency key or its
        place in its producer's sequence."""
        return self.idempotency_key if self.producer is None else self.producer

    def due_by(self, commit_by: float | None, expired_as: type[LlogError]) -> AppendGroup:
        """This group with a further deadline: the earlier of the two holds, answered as
        the one it came from says."""
        if commit_by is None or (self.commit_by is not None and self.commit_by <= commit_by):
            return self
        return dataclasses.replace(self, commit_by=commit_by, expired_as=expired_as)

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
