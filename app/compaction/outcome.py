"""What one ``compact_once`` call did (:class:`CompactionOutcome`), as the scheduler,
the commands and the metrics read it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from app.storage.keys import TopicPartition
from app.storage.metadata import CompactionState

Action = Literal["compacted", "resumed", "advanced_cursor", "abandoned", "nothing_to_do",
                 "raced", "trimmed"]


@dataclass(frozen=True)
class CompactionOutcome:
    """What one ``compact_once`` call did.

    ``action``: ``compacted`` (a new range), ``resumed`` (finished an interrupted run found
    in ``resumed_from``), ``advanced_cursor`` (the entry at the cursor was already
    compacted), ``abandoned`` (dropped a stale ``meta/compaction`` that had changed
    nothing, or a blob that grew too old to reference), ``trimmed`` (index entries below
    the log start let go, see app/storage/retention.py), ``nothing_to_do`` (see
    ``reason``) or ``raced`` (another compactor changed the partition under this one;
    nothing was changed by this call's later steps).

    ``wal_bytes``: the WAL bytes (as decompressed) this call read and rewrote into a
    blob, whatever became of the run afterwards (raced and abandoned runs cost the same
    I/O); what the compaction throttle charges. Finishing another process's run costs
    no rewrite and counts 0.
    """

    tp: TopicPartition
    action: Action
    start_offset: int | None = None
    end_offset: int | None = None
    records: int = 0
    bytes: int = 0
    entries: int = 0
    data_key: str | None = None
    resumed_from: CompactionState | None = None
    reason: str | None = None
    materialised_pending: bool = False
    cursor: int | None = None
    high_watermark: int | None = None
    wal_bytes: int = 0

    @property
    def did_work(self) -> bool:
        """True if the partition changed, so another call may find more to do."""
        return self.action in ("compacted", "resumed", "advanced_cursor", "abandoned",
                               "trimmed")

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["tp"] = str(self.tp)
        return out
