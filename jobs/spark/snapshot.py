"""A topic-partition's Oxia records, read so that its set of references is complete
(see :func:`read_snapshot`), and the references it holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.errors import CorruptData, InvalidRequest
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Compaction, CompactionCursor, Control, IndexEntry
from app.stores.oxia.store import OxiaStore, Record
from jobs.spark.record_checks import (
    compaction_problems,
    control_problems,
    cursor_problems,
    index_entry_problems,
    pending_problems,
)

INDEX_PAGE = 1000
SNAPSHOT_ATTEMPTS = 5
REFERENCE_COLUMNS = "key string, data_key string, topic string, partition int, kind string"


@dataclass
class IndexRow:
    key: str
    end: int | None  # None: not a well-formed index key of this partition
    entry: IndexEntry | None  # None: the value does not parse
    version: int
    # Set when the key or value is unreadable (record_checks); the entry, when it
    # parsed, still counts as a reference but is not used to check the index.
    error: str | None = None

    @property
    def start(self) -> int | None:
        if self.end is None or self.entry is None:
            return None
        return self.end - self.entry.msg_count + 1


@dataclass
class PartitionSnapshot:
    tp: TopicPartition
    control: Control | None = None
    control_present: bool = False
    control_version: int | None = None
    # meta/control read again after the index scan: entries of appends committed during
    # the scan end above the first read's high watermark, but not above this one's.
    control_after: Control | None = None
    cursor: int = 1
    cursor_present: bool = False
    compaction: Compaction | None = None
    compaction_version: int | None = None
    index: list[IndexRow] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # (kind, message)
    stable: bool = True
    attempts: int = 1
    # data keys seen by earlier, unstable attempts, by the compaction record read
    # before the index scan and by unreadable records: references too, for vacuum.
    extra_refs: set[str] = field(default_factory=set)
    # unreadable records seen only by earlier, unstable attempts
    unreadable_earlier: list[str] = field(default_factory=list)

    @property
    def high_watermark(self) -> int:
        return 0 if self.control is None else self.control.sequence_counter

    @property
    def high_watermark_after(self) -> int:
        if self.control_after is None:
            return self.high_watermark
        return max(self.high_watermark, self.control_after.sequence_counter)

    def add_error(self, kind: str, message: str) -> None:
        if (kind, message) not in self.errors:
            self.errors.append((kind, message))

    def unreadable(self) -> list[str]:
        """Every record of the partition this release could not fully read. Any one of
        them may name objects no other record names: vacuum keeps everything then."""
        out = [f"{kind}: {message}" for kind, message in self.errors]
        out += [f"{row.key}: {row.error}" for row in self.index if row.error is not None]
        return out + [e for e in self.unreadable_earlier if e not in out]

    def references(self) -> list[tuple[str, str]]:
        """``(data_key, kind)`` of every reference: pending, every index entry (strays
        and unreadable ones included) and the compaction record."""
        out: list[tuple[str, str]] = []
        for control in (self.control, self.control_after):
            if control is not None and control.pending is not None:
                out.append((control.pending.data_key, "pending"))
        for row in self.index:
            if row.entry is not None and isinstance(row.entry.data_key, str):
                out.append((row.entry.data_key, "index"))
        if self.compaction is not None:
            out.append((self.compaction.data_key, "compaction"))
        seen: set[str] = set()
        unique = []
        for key, kind in out:
            if key not in seen:
                seen.add(key)
                unique.append((key, kind))
        unique += [(key, "earlier_read") for key in sorted(self.extra_refs - seen)]
        return unique


def _index_row(tp: TopicPartition, layout: KeyLayout, record: Record) -> IndexRow:
    offset = layout.index_end_offset(tp, record.key)
    if offset is None:
        return IndexRow(record.key, None, None, record.version_id,
                        "not a 20-digit index key")
    try:
        entry = IndexEntry.from_json(record.value)
    except CorruptData as exc:
        return IndexRow(record.key, offset, None, record.version_id, str(exc))
    problems = index_entry_problems(entry)
    if not problems and offset - entry.msg_count + 1 < 1:
        problems.append(f"msg_count {entry.msg_count} reaches below offset 1")
    return IndexRow(record.key, offset, entry, record.version_id,
                    "; ".join(problems) or None)


async def scan_index(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                     page: int = INDEX_PAGE) -> list[IndexRow]:
    """Every key under the partition's ``index/``, paged (``page`` keys per request)."""
    rows: list[IndexRow] = []
    start = layout.index(tp, 0)
    end = layout.index_scan_end(tp)
    while True:
        records = await oxia.range_scan(start, end, tp.partition_key, limit=page)
        page_rows = [_index_row(tp, layout, record) for record in records]
        rows += page_rows
        if len(records) < page:
            return rows
        ends = [row.end for row in page_rows if row.end is not None]
        if not ends:
            raise CorruptData(f"{tp}: a page of {page} malformed index keys; scan stopped")
        start = layout.index(tp, ends[-1] + 1)


R = TypeVar("R", Control, CompactionCursor, Compaction)


def _understood(snap: PartitionSnapshot, kind: str, raw: Record | None, parse: Callable[[bytes], R],
                problems: Callable[[R], list[str]]) -> R | None:
    """The record if this release fully understands it; otherwise the problem goes to
    ``snap.errors``, a data key it names to the references, and None is returned."""
    if raw is None:
        return None
    try:
        record = parse(raw.value)
    except CorruptData as exc:
        snap.add_error(kind, str(exc))
        return None
    found = problems(record)
    if isinstance(record, Control) and record.pending is not None:
        pending = pending_problems(record.pending)
        if pending:
            # The control record stays usable; its pending record does not.
            snap.add_error(kind, "pending: " + "; ".join(pending))
            _keep_data_key(snap, record.pending.data_key)
            record.pending = None
    if found:
        snap.add_error(kind, "; ".join(found))
        _keep_data_key(snap, getattr(record, "data_key", None))
        return None
    return record


def _keep_data_key(snap: PartitionSnapshot, data_key: object) -> None:
    if isinstance(data_key, str):
        snap.extra_refs.add(data_key)


@dataclass
class _Reads:
    """The raw records of one snapshot attempt, in the order they were read."""

    cursor_before: Record | None
    compaction_before: Record | None
    control: Record | None
    index: list[IndexRow]
    control_after: Record | None
    cursor_after: Record | None
    compaction_after: Record | None

    @property
    def stable(self) -> bool:
        def version(r: Record | None) -> int | None:
            return None if r is None else r.version_id

        return (version(self.cursor_before) == version(self.cursor_after)
                and version(self.compaction_before) == version(self.compaction_after))


async def _read_once(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition) -> _Reads:
    pk = tp.partition_key
    cursor_before = await oxia.get(layout.compaction_cursor(tp), pk)
    compaction_before = await oxia.get(layout.compaction(tp), pk)
    control = await oxia.get(layout.control(tp), pk)
    index = await scan_index(oxia, layout, tp)
    control_after = await oxia.get(layout.control(tp), pk)
    cursor_after = await oxia.get(layout.compaction_cursor(tp), pk)
    compaction_after = await oxia.get(layout.compaction(tp), pk)
    return _Reads(cursor_before, compaction_before, control, index, control_after,
                  cursor_after, compaction_after)


def _snapshot_of(tp: TopicPartition, reads: _Reads, attempt: int) -> PartitionSnapshot:
    snap = PartitionSnapshot(tp, attempts=attempt, index=reads.index, stable=reads.stable)
    snap.control_present = reads.control is not None
    snap.control = _understood(snap, "bad_control", reads.control, Control.from_json,
                               control_problems)
    snap.control_version = None if reads.control is None else reads.control.version_id
    snap.control_after = _understood(snap, "bad_control", reads.control_after,
                                     Control.from_json, control_problems)
    cursor = _understood(snap, "bad_cursor", reads.cursor_after, CompactionCursor.from_json,
                         cursor_problems)
    snap.cursor_present = reads.cursor_after is not None
    snap.cursor = cursor.offset if cursor is not None else 1
    snap.compaction = _understood(snap, "bad_compaction_record", reads.compaction_after,
                                  Compaction.from_json, compaction_problems)
    snap.compaction_version = (None if reads.compaction_after is None
                               else reads.compaction_after.version_id)
    earlier = _understood(snap, "bad_compaction_record", reads.compaction_before,
                          Compaction.from_json, compaction_problems)
    if earlier is not None:
        snap.extra_refs.add(earlier.data_key)
    return snap


async def read_snapshot(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                        *, attempts: int = SNAPSHOT_ATTEMPTS) -> PartitionSnapshot:
    """A partition's records, read so that no reference can slip through unseen.

    Order per attempt: cursor and ``meta/compaction``, then ``meta/control``, then the
    whole ``index/``, then ``meta/control``, cursor and ``meta/compaction`` again.

    - control before index: a pending append is moved to the index (create) before it
      leaves control (CAS), so it is seen in one place or the other;
    - compaction around the index scan: a compacted blob is named by ``meta/compaction``
      from before its index entry is written until after it is, so a compaction that
      swaps index keys during the scan is seen either way; if the cursor or the
      compaction record changed, the scan is repeated (all data keys seen in any
      attempt count as references, and so do the unreadable records of every attempt);
    - appends committed after the control read reference blobs that were PUT at most
      the writers' retry horizon earlier: vacuum never deletes objects that young.
    """
    refs: set[str] = set()
    unreadable: list[str] = []
    for attempt in range(1, attempts + 1):
        snap = _snapshot_of(tp, await _read_once(oxia, layout, tp), attempt)
        if snap.stable or attempt == attempts:
            break
        refs |= {key for key, _ in snap.references()}
        unreadable += snap.unreadable()
    current = snap.unreadable()
    snap.unreadable_earlier = [e for e in dict.fromkeys(unreadable) if e not in current]
    snap.extra_refs |= refs
    return snap


def object_key(layout: KeyLayout, data_key: str) -> str | None:
    """The object key of ``data_key`` when it lies in this deployment's bucket."""
    try:
        bucket, key = layout.parse_uri(data_key)
    except InvalidRequest:
        return None
    return key if bucket == layout.bucket else None


def reference_rows(layout: KeyLayout, snap: PartitionSnapshot) -> list[tuple[Any, ...]]:
    """Rows of :data:`REFERENCE_COLUMNS` for a snapshot."""
    rows = []
    for data_key, kind in snap.references():
        key = object_key(layout, data_key)
        rows.append((key, data_key, snap.tp.topic, snap.tp.partition, kind))
    return rows
