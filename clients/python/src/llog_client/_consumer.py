"""A member of a consumer group that reads its partitions and commits what it
processed: at-least-once, through any broker.

    with llog.group_consumer("billing", ["orders"]) as consumer:
        for record in consumer:
            handle(record)          # committed once the loop asks for the next record

It joins on entering and leaves on exit (its partitions move to the other members at
once). It heartbeats between fetches (a long-poll never outlasts the heartbeat
interval), follows rebalances (a partition it gains is read from the group's committed
offset; one it loses is dropped, and what it processed there but did not commit is
processed again by the new owner), and joins again when its session ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from llog_client._errors import (
    OffsetOutOfRange,
    PartitionNotAssigned,
    StaleGeneration,
    UnknownMember,
)
from llog_client._models import (
    ConsumedRecord,
    Fetched,
    GroupMembership,
    Position,
    Resume,
    TopicPartitionKey,
)
from llog_client._params import DEFAULT_FETCH_BYTES, DEFAULT_WAIT_MS

if TYPE_CHECKING:
    from llog_client._sync import LlogClient


class GroupConsumer:
    """See the module. ``poll`` returns the next records of the member's partitions;
    calling ``poll`` again, ``commit`` or ``close`` declares them processed (iterating
    declares each record processed when the loop asks for the next one)."""

    def __init__(self, client: LlogClient, group: str, topics: Sequence[str], *,
                 client_id: str | None = None, session_timeout_ms: int | None = None,
                 auto_offset_reset: Position = "earliest",
                 max_wait_ms: int = DEFAULT_WAIT_MS, max_bytes: int = DEFAULT_FETCH_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self.group = group
        self._topics = list(topics)
        self._client_id = client_id
        self._session_timeout_ms = session_timeout_ms
        self._reset = auto_offset_reset
        self._max_wait_ms = max_wait_ms
        self._max_bytes = max_bytes
        self._clock = clock
        self.membership: GroupMembership | None = None
        self._positions: dict[TopicPartitionKey, Resume] = {}
        self._processed: dict[TopicPartitionKey, int] = {}
        self._committed: dict[TopicPartitionKey, int] = {}
        self._handed: dict[TopicPartitionKey, int] = {}
        self._next_heartbeat = 0.0

    def __enter__(self) -> GroupConsumer:
        self.join()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def join(self) -> GroupMembership:
        """Join (again): a new member id; every partition resumes from the committed
        offsets."""
        self._processed.clear()
        self._committed.clear()
        self._handed.clear()
        self._positions.clear()
        membership = self._client.join_group(self.group, self._topics,
                                             client_id=self._client_id,
                                             session_timeout_ms=self._session_timeout_ms)
        self._adopt(membership)
        return membership

    def poll(self) -> list[ConsumedRecord]:
        """The records of the previous poll are processed: commit them, heartbeat when
        due, and fetch what follows on this member's partitions (waiting up to the
        time left before the next heartbeat)."""
        self.commit()
        self._heartbeat_if_due()
        wait_ms = max(0, int((self._next_heartbeat - self._clock()) * 1000))
        if not self._positions:  # nothing assigned now: wait for the next heartbeat
            time.sleep(wait_ms / 1000)
            return []
        answers = self._client.fetch_group(
            self.group, dict(self._positions), auto_offset_reset=self._reset,
            max_wait_ms=min(self._max_wait_ms, wait_ms), max_bytes=self._max_bytes)
        records: list[ConsumedRecord] = []
        for key, answer in zip(list(self._positions), answers, strict=True):
            if isinstance(answer, Fetched):
                self._positions[key] = answer.next_offset
                records.extend(answer.records)
            elif isinstance(answer, OffsetOutOfRange):
                self._positions[key] = "committed"  # retention passed it: resume anew
            elif not answer.retriable:
                raise answer
        self._handed = {(r.topic, r.partition): r.offset for r in records}
        return records

    def __iter__(self) -> Iterator[ConsumedRecord]:
        while True:
            records = self.poll()
            self._handed = {}  # marked one at a time below
            for record in records:
                yield record
                self._processed[(record.topic, record.partition)] = record.offset

    def commit(self) -> None:
        """Commit what was processed and not yet committed, in this generation; after
        a rebalance, only what this member still owns."""
        self._processed.update(self._handed)
        self._handed = {}
        membership = self.membership
        due = {k: o for k, o in self._processed.items()
               if self._committed.get(k) != o and k in self._positions}
        if membership is None or not due:
            return
        try:
            self._client.commit_offsets(self.group, due, member=membership)
        except (StaleGeneration, PartitionNotAssigned):
            self._heartbeat()  # learn the new assignment; commit what is still ours
            moved = self.membership is not None and (
                self.membership.generation != membership.generation)
            return self.commit() if moved else None
        except UnknownMember:
            self.join()
            return None
        self._committed.update(due)
        return None

    def close(self) -> None:
        """Commit what was processed, then leave the group."""
        try:
            self.commit()
        finally:
            if self.membership is not None:
                member_id, self.membership = self.membership.member_id, None
                self._client.leave_group(self.group, member_id)

    def _heartbeat_if_due(self) -> None:
        if self.membership is None:
            self.join()
        elif self._clock() >= self._next_heartbeat:
            self._heartbeat()

    def _heartbeat(self) -> None:
        assert self.membership is not None
        try:
            membership = self._client.heartbeat(self.group, self.membership.member_id)
        except UnknownMember:
            self.join()
            return
        self._adopt(membership)

    def _adopt(self, membership: GroupMembership) -> None:
        """Follow the assignment: drop lost partitions, read gained ones from the
        committed offsets, keep the positions of the others."""
        owned = set(membership.assignment)
        for key in [k for k in self._positions if k not in owned]:
            del self._positions[key]
            self._processed.pop(key, None)
            self._committed.pop(key, None)
        for key in membership.assignment:
            self._positions.setdefault(key, "committed")
        self.membership = membership
        self._next_heartbeat = self._clock() + membership.heartbeat_interval_ms / 1000
