"""What a consumer's program has processed, and what of it is committed.

A record counts as processed once the program asks for what follows it: iterating, when
the loop asks for the next record; polling, when it polls again (or commits, or
closes). The caller's thread marks it (one attribute per record while iterating, one
entry per partition batch otherwise); the worker reads the marks when it commits, so
only processed records are ever committed: at-least-once.
"""

from __future__ import annotations

from llog_client._models import TopicPartitionKey
from llog_client._prefetch import Prefetch
from llog_client._records import PartitionBatch, RecordView

Key = TopicPartitionKey


class Progress:
    def __init__(self, prefetch: Prefetch) -> None:
        self._prefetch = prefetch
        self.marks: dict[Key, tuple[int, int]] = {}  # key -> (tag, last offset processed)
        # The record the iteration handed out and the program works on: every record
        # before it is processed. Written by the caller's thread alone, read at once.
        self.current: RecordView | None = None
        self.handed: list[PartitionBatch] = []  # the last poll's, processed at the next
        self.committed: dict[Key, int] = {}

    def mark(self, batch: PartitionBatch, offset: int) -> None:
        """Records of ``batch`` up to ``offset`` are processed."""
        self.marks[batch.key] = (batch.tag, offset)

    def mark_handed(self) -> None:
        """The batches of the last poll are processed."""
        for batch in self.handed:
            self.mark(batch, batch.last_offset)
        self.handed = []

    def forget(self, keys: set[Key] | None = None) -> None:
        """Drop the marks and commits of ``keys`` (every partition: None)."""
        for table in (self.marks, self.committed):
            for key in list(table) if keys is None else keys:
                table.pop(key, None)

    def due(self) -> dict[Key, int]:
        """The last offset processed of each partition still read with the tag it was
        processed under, where it is not committed yet."""
        marks = {k: o for k, (tag, o) in self.marks.items()
                 if self._prefetch.tags.get(k) == tag}
        current = self.current
        if current is not None and self._prefetch.current(current.batch) \
                and current.offset > current.batch.first_offset:
            marks[current.batch.key] = current.offset - 1
        return {k: o for k, o in marks.items() if self.committed.get(k) != o}
