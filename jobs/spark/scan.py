"""What audit and vacuum share: object listings, partition snapshots and references.

Listing is cut into key ranges (``wal-shared/{hex}`` prefixes and one ``data/`` prefix
per partition) so that it runs in Spark tasks; a partition snapshot reads a
topic-partition's Oxia records in the order that makes its set of references complete
(see :func:`read_snapshot`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from app.errors import CorruptData, InvalidRequest, LlogError
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.oxia_store import OxiaStore, Record
from app.storage.records import Compaction, CompactionCursor, Control, IndexEntry
from jobs.spark.common import Stores, open_stores, task_identity, task_logger

T = TypeVar("T")
HEX = "0123456789abcdef"
INDEX_PAGE = 1000
SNAPSHOT_ATTEMPTS = 5

OBJECT_COLUMNS = "key string, size long, last_modified_ms long, area string, " \
                 "topic string, partition int"
REFERENCE_COLUMNS = "key string, data_key string, topic string, partition int, kind string"


# -- running async producers inside a Spark task ---------------------------------------


class _ConsumerGone(Exception):
    """The Spark task stopped reading before the producer finished."""


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


def stream_from_async(
    produce: Callable[[Callable[[list[T]], Awaitable[None]]], Awaitable[None]],
    *, max_batches: int = 4,
) -> Iterator[T]:
    """Run ``produce(emit)`` under ``anyio.run`` in a helper thread and yield what it emits.

    ``emit`` takes a batch (list) and blocks while ``max_batches`` are waiting, so a
    task streams its rows to Spark with bounded memory. Errors re-raise in the consumer;
    a consumer that stops early makes the next ``emit`` fail, which ends the producer.
    """
    q: queue.Queue[object] = queue.Queue(max_batches)
    closed = threading.Event()

    def put(item: object) -> None:
        while not closed.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
        raise _ConsumerGone()

    async def emit(batch: list[T]) -> None:
        if batch:
            await anyio.to_thread.run_sync(put, batch)

    async def main() -> None:
        try:
            await produce(emit)
        except BaseException as exc:
            if not closed.is_set():
                await anyio.to_thread.run_sync(put, _Failure(exc))
            return
        await anyio.to_thread.run_sync(put, _DONE)

    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True,
                              name="llog-task-loop")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            assert isinstance(item, list)
            yield from item
    finally:
        closed.set()
        thread.join(timeout=60)


# -- object listing --------------------------------------------------------------------


@dataclass(frozen=True)
class ListingUnit:
    """One prefix to list: a slice of ``wal-shared/`` or one partition's ``data/``."""

    area: str  # "wal-shared" | "data"
    prefix: str
    topic: str | None = None
    partition: int | None = None


def listing_units(layout: KeyLayout, partitions: Iterable[TopicPartition],
                  fanout: int) -> list[ListingUnit]:
    """``wal-shared/`` cut into ``fanout`` (1, 16 or 256) hex prefixes, plus ``data/``.

    Shared blob names are ``uuid4().hex`` (lowercase hex), so the hex prefixes cover all
    of them; an object under ``wal-shared/`` whose name starts with anything else is
    never listed, hence never reported or deleted.
    """
    base = f"{layout.root}/wal-shared/"
    if fanout <= 1:
        heads = [""]
    elif fanout <= 16:
        heads = list(HEX)
    else:
        heads = [a + b for a in HEX for b in HEX]
    units = [ListingUnit("wal-shared", base + h) for h in heads]
    units += [ListingUnit("data", layout.partition_prefix(tp) + "data/", tp.topic,
                          tp.partition) for tp in sorted(set(partitions))]
    return units


def list_objects_task(payload: Mapping[str, str], job: str,
                      units: Iterable[ListingUnit]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: rows of :data:`OBJECT_COLUMNS` for every object."""
    todo = list(units)
    logger = task_logger(job)

    async def produce(emit: Callable[[list[tuple[Any, ...]]], Awaitable[None]]) -> None:
        async with open_stores(payload, task_identity(job)) as stores:
            listed = 0
            for unit in todo:
                page: list[tuple[Any, ...]] = []
                async for info in stores.s3.list(unit.prefix):
                    page.append((info.key, info.size, info.last_modified_ms, unit.area,
                                 unit.topic, unit.partition))
                    if len(page) >= 1000:
                        listed += len(page)
                        await emit(page)
                        page = []
                listed += len(page)
                await emit(page)
            logger.info("listed %d objects under %d prefixes", listed, len(todo))

    return stream_from_async(produce)


# -- partition snapshots ---------------------------------------------------------------


@dataclass
class IndexRow:
    key: str
    end: int | None  # None: not a well-formed index key of this partition
    entry: IndexEntry | None  # None: the value does not parse
    version: int
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
    # data keys seen by earlier, unstable attempts (and the compaction record read
    # before the index scan): references too, for vacuum.
    extra_refs: set[str] = field(default_factory=set)

    @property
    def high_watermark(self) -> int:
        return 0 if self.control is None else self.control.sequence_counter

    @property
    def high_watermark_after(self) -> int:
        if self.control_after is None:
            return self.high_watermark
        return max(self.high_watermark, self.control_after.sequence_counter)

    def references(self) -> list[tuple[str, str]]:
        """``(data_key, kind)`` of every reference: pending, every index entry (strays
        included) and the compaction record."""
        out: list[tuple[str, str]] = []
        for control in (self.control, self.control_after):
            if control is not None and control.pending is not None:
                out.append((control.pending.data_key, "pending"))
        for row in self.index:
            if row.entry is not None:
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


async def _get_meta(oxia: OxiaStore, key: str, pk: str) -> Record | None:
    return await oxia.get(key, pk)


async def scan_index(oxia: OxiaStore, layout: KeyLayout, tp: TopicPartition,
                     page: int = INDEX_PAGE) -> list[IndexRow]:
    """Every key under the partition's ``index/``, paged (``page`` keys per request)."""
    rows: list[IndexRow] = []
    start = layout.index(tp, 0)
    end = layout.index_scan_end(tp)
    while True:
        records = await oxia.range_scan(start, end, tp.partition_key, limit=page)
        last_end: int | None = None
        for record in records:
            offset = layout.index_end_offset(tp, record.key)
            if offset is None:
                rows.append(IndexRow(record.key, None, None, record.version_id,
                                     "not a 20-digit index key"))
                continue
            last_end = offset
            try:
                entry: IndexEntry | None = IndexEntry.from_json(record.value)
                error = None
            except CorruptData as exc:
                entry, error = None, str(exc)
            rows.append(IndexRow(record.key, offset, entry, record.version_id, error))
        if len(records) < page:
            return rows
        if last_end is None:
            raise CorruptData(f"{tp}: a page of {page} malformed index keys; scan stopped")
        start = layout.index(tp, last_end + 1)


def _parse(kind: str, raw: Record | None, parse: Callable[[bytes], T],
           errors: list[tuple[str, str]]) -> T | None:
    if raw is None:
        return None
    try:
        return parse(raw.value)
    except CorruptData as exc:
        errors.append((kind, str(exc)))
        return None


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
      attempt count as references);
    - appends committed after the control read reference blobs that were PUT at most
      the writers' retry horizon earlier: vacuum never deletes objects that young.
    """
    pk = tp.partition_key
    extra: set[str] = set()
    snap = PartitionSnapshot(tp)
    for attempt in range(1, attempts + 1):
        snap = PartitionSnapshot(tp, attempts=attempt)
        cursor_before = await _get_meta(oxia, layout.compaction_cursor(tp), pk)
        compaction_before = await _get_meta(oxia, layout.compaction(tp), pk)
        control_raw = await _get_meta(oxia, layout.control(tp), pk)
        snap.index = await scan_index(oxia, layout, tp)
        control_after_raw = await _get_meta(oxia, layout.control(tp), pk)
        cursor_after = await _get_meta(oxia, layout.compaction_cursor(tp), pk)
        compaction_after = await _get_meta(oxia, layout.compaction(tp), pk)

        snap.control_present = control_raw is not None
        snap.control = _parse("bad_control", control_raw, Control.from_json, snap.errors)
        snap.control_version = None if control_raw is None else control_raw.version_id
        snap.control_after = _parse("bad_control", control_after_raw, Control.from_json, [])
        cursor = _parse("bad_cursor", cursor_after, CompactionCursor.from_json, snap.errors)
        snap.cursor_present = cursor_after is not None
        snap.cursor = cursor.offset if cursor is not None else 1
        snap.compaction = _parse("bad_compaction_record", compaction_after,
                                 Compaction.from_json, snap.errors)
        snap.compaction_version = (None if compaction_after is None
                                   else compaction_after.version_id)
        earlier = _parse("bad_compaction_record", compaction_before, Compaction.from_json, [])
        if earlier is not None:
            extra.add(earlier.data_key)

        def version(r: Record | None) -> int | None:
            return None if r is None else r.version_id

        snap.stable = (version(cursor_before) == version(cursor_after)
                       and version(compaction_before) == version(compaction_after))
        if snap.stable or attempt == attempts:
            break
        extra |= {key for key, _ in snap.references()}
    snap.extra_refs = extra
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


Tagged = tuple[str, tuple[Any, ...]]


class SnapshotHandler:
    """Turns one partition snapshot into tagged rows; one instance per Spark task."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores

    async def handle(self, snap: PartitionSnapshot) -> list[Tagged]:
        raise NotImplementedError

    def on_error(self, tp: TopicPartition, exc: BaseException) -> list[Tagged]:
        raise NotImplementedError


def snapshot_task(
    payload: Mapping[str, str], job: str, concurrency: int,
    make_handler: Callable[[Stores], SnapshotHandler],
    tps: Iterable[tuple[str, int]],
) -> Iterator[Tagged]:
    """Spark ``mapPartitions`` body: snapshot each partition and hand it to a handler.

    A partition whose snapshot or handling fails with a storage error yields the
    handler's ``on_error`` rows instead, so the job knows its scan was incomplete.
    """
    todo = [TopicPartition(t, p) for t, p in tps]
    logger = task_logger(job)
    results: list[Tagged] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(job)) as stores:
            handler = make_handler(stores)
            limiter = anyio.CapacityLimiter(max(1, concurrency))
            done = 0

            async def one(tp: TopicPartition) -> None:
                nonlocal done
                async with limiter:
                    try:
                        snap = await read_snapshot(stores.oxia, stores.layout, tp)
                        rows = await handler.handle(snap)
                    except (LlogError, OSError) as exc:
                        logger.warning("%s: %s", tp, exc)
                        rows = handler.on_error(tp, exc)
                    results.extend(rows)
                    done += 1
                    if done % 100 == 0:
                        logger.info("%d/%d partitions scanned", done, len(todo))

            async with anyio.create_task_group() as tg:
                for tp in todo:
                    tg.start_soon(one, tp)
        logger.info("scanned %d partitions", len(todo))

    anyio.run(run)
    return iter(results)



