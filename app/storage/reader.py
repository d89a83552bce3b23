"""The reader: records of a partition from an offset, as the read protocol says.

Index entries are found with one CEILING lookup (prefix-checked: a CEILING answer can
belong to a neighbouring partition on the same shard) and a forward ``range_scan``; the
tail may still be the ``pending`` append of ``meta/control``. Bytes come from S3 range
GETs for shared-blob slices and whole GETs for compacted and legacy objects, each object
fetched at most once per call. A gap or a missing object is an error, never a skip.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from app.errors import (
    CorruptData,
    LlogError,
    LogGap,
    ObjectMissing,
    OffsetOutOfRange,
    StorageUnavailable,
)
from app.storage import codec
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.oxia_store import OxiaStore
from app.storage.records import Control, IndexEntry, Pending
from app.storage.s3 import S3Store

# How many index entries one forward scan asks for beyond the first.
_SCAN_BATCH = 64


@dataclass(frozen=True)
class Entry:
    """A resolved index or pending entry covering ``[start, end]``."""

    start: int
    end: int
    data_key: str
    msg_count: int
    byte_offset: int | None
    byte_length: int | None
    crc32c: int | None

    @classmethod
    def from_index(cls, end: int, e: IndexEntry) -> Entry:
        return cls(end - e.msg_count + 1, end, e.data_key, e.msg_count, e.byte_offset,
                   e.byte_length, e.crc32c)

    @classmethod
    def from_pending(cls, p: Pending) -> Entry:
        return cls(p.start_offset, p.end_offset, p.data_key, p.msg_count, p.byte_offset,
                   p.byte_length, p.crc32c)

    @property
    def approx_bytes(self) -> int:
        return self.byte_length if self.byte_length is not None else 0


@dataclass
class ReadResult:
    tp: TopicPartition
    records: list[tuple[int, bytes]]
    high_watermark: int
    next_offset: int

    @property
    def size(self) -> int:
        return sum(len(v) for _, v in self.records)


@dataclass(frozen=True)
class ReadRequest:
    tp: TopicPartition
    offset: int
    max_records: int | None = None
    max_bytes: int | None = None


@dataclass
class _Plan:
    offset: int
    high_watermark: int
    entries: list[Entry]


Records = list[bytes]


class ObjectCache:
    """Whole objects (compacted and legacy ones, which are read whole), verified and
    decoded once and kept across reads, least recently used first out, bounded by
    bytes. Objects are immutable, so a cached copy is never stale; without it a consumer
    catching up through a large compacted object would download, check and decode all
    of it for every fetch."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._items: OrderedDict[str, tuple[Records, int]] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0

    @property
    def size(self) -> int:
        return self._size

    def get(self, key: str) -> Records | None:
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: str, records: Records) -> None:
        size = sum(len(r) for r in records) + 64 * len(records)  # + per-object overhead
        if size > self._max // 2 or key in self._items:
            return
        self._items[key] = (records, size)
        self._size += size
        while self._size > self._max:
            _, (_, old) = self._items.popitem(last=False)
            self._size -= old


class LogReader:
    def __init__(self, oxia: OxiaStore, s3: S3Store, layout: KeyLayout, *,
                 object_cache_bytes: int = 256 * 1024 * 1024) -> None:
        self._oxia = oxia
        self._s3 = s3
        self._layout = layout
        self.objects = ObjectCache(object_cache_bytes)

    async def read_control(self, tp: TopicPartition) -> Control | None:
        record = await self._oxia.get(self._layout.control(tp), tp.partition_key)
        return None if record is None else Control.from_json(record.value)

    async def high_watermark(self, tp: TopicPartition) -> int:
        control = await self.read_control(tp)
        return 0 if control is None else control.sequence_counter

    async def read(
        self,
        tp: TopicPartition,
        offset: int,
        *,
        max_records: int | None = None,
        max_bytes: int | None = None,
    ) -> ReadResult:
        """Records from ``offset`` (0 means the first) within the budgets.

        The first record is returned even if it alone exceeds ``max_bytes``, so a reader
        can never be stuck.
        """
        (result,) = await self.read_many([ReadRequest(tp, offset, max_records, max_bytes)])
        if isinstance(result, LlogError):
            raise result
        return result

    async def read_many(self, requests: Sequence[ReadRequest]) -> list[ReadResult | LlogError]:
        """Read several partitions at once; objects shared between them are fetched once.

        Each partition's failure is its own entry in the result list.
        """
        plans: list[_Plan | LlogError] = [StorageUnavailable("not attempted")] * len(requests)

        async def plan(i: int, request: ReadRequest) -> None:
            try:
                plans[i] = await self._plan(request)
            except LlogError as exc:
                plans[i] = exc

        async with anyio.create_task_group() as tg:
            for i, request in enumerate(requests):
                tg.start_soon(plan, i, request)

        bodies = await self._fetch_bodies(
            [e for p in plans if isinstance(p, _Plan) for e in p.entries]
        )
        results: list[ReadResult | LlogError] = []
        for request, p in zip(requests, plans, strict=True):
            if isinstance(p, LlogError):
                results.append(p)
                continue
            try:
                results.append(self._assemble(request, p, bodies))
            except LlogError as exc:
                results.append(exc)
        return results

    async def _plan(self, request: ReadRequest) -> _Plan:
        tp = request.tp
        control = await self.read_control(tp)
        hw = 0 if control is None else control.sequence_counter
        offset = max(request.offset, 1)
        if offset > hw + 1:
            raise OffsetOutOfRange(
                f"{tp}: offset {offset} is beyond the high watermark {hw} + 1"
            )
        if control is None or offset == hw + 1 or (
            request.max_records is not None and request.max_records <= 0
        ):
            return _Plan(offset, hw, [])
        try:
            entries = await self._resolve(tp, offset, hw, control.pending,
                                          request.max_records, request.max_bytes)
        except LogGap:
            # A compaction may have swapped keys between our lookups: look once more
            # with fresh metadata before calling it a gap.
            control = await self.read_control(tp)
            assert control is not None
            hw = control.sequence_counter
            entries = await self._resolve(tp, offset, hw, control.pending,
                                          request.max_records, request.max_bytes)
        return _Plan(offset, hw, entries)

    # -- index resolution --------------------------------------------------------------

    async def _resolve(
        self, tp: TopicPartition, offset: int, hw: int, pending: Pending | None,
        max_records: int | None, max_bytes: int | None,
    ) -> list[Entry]:
        """Entries covering ``offset`` onwards, contiguous, stopping near the budgets."""
        if pending is not None and pending.covers(offset):
            return [Entry.from_pending(pending)]
        first = await self._ceiling(tp, offset)
        if first is not None and first.start > offset:
            # Usually a gap; but a stray WAL entry left inside a compacted range (see
            # docs/protocol.md) also lands here: the compacted entry after it covers us.
            first = next((e for e in await self._scan(tp, offset, _SCAN_BATCH)
                          if e.start <= offset <= e.end), None)
        if first is None:
            raise LogGap(f"{tp}: no index entry covers offset {offset} (high watermark {hw})")
        entries = [first]
        want_records = max_records if max_records is not None else float("inf")
        want_bytes = max_bytes if max_bytes is not None else float("inf")

        def satisfied() -> bool:
            last = entries[-1]
            records = last.end - offset + 1
            size = sum(e.approx_bytes for e in entries)
            return records >= want_records or size >= want_bytes or last.end >= hw

        while not satisfied():
            nxt = entries[-1].end + 1
            if pending is not None and pending.covers(nxt):
                entries.append(Entry.from_pending(pending))
                break
            scanned = await self._scan(tp, nxt, _SCAN_BATCH)
            progressed = False
            for entry in scanned:
                if entry.end < nxt:
                    continue
                if entry.start > nxt:
                    # A stray (a later entry covers nxt) or a hole (none does, and the
                    # next read reports it): skip it either way.
                    continue
                entries.append(entry)
                nxt = entry.end + 1
                progressed = True
                if satisfied():
                    break
            if not progressed:
                if pending is not None and pending.covers(nxt):
                    entries.append(Entry.from_pending(pending))
                break
        return entries

    async def _ceiling(self, tp: TopicPartition, offset: int) -> Entry | None:
        record = await self._oxia.get_ceiling(self._layout.index(tp, offset), tp.partition_key)
        if record is None:
            return None
        end = self._layout.index_end_offset(tp, record.key)
        if end is None:  # a key of another partition or topic on the same shard
            return None
        return Entry.from_index(end, IndexEntry.from_json(record.value))

    async def _scan(self, tp: TopicPartition, from_offset: int, limit: int) -> list[Entry]:
        records = await self._oxia.range_scan(
            self._layout.index(tp, from_offset), self._layout.index_scan_end(tp),
            tp.partition_key, limit=limit,
        )
        out = []
        for record in records:
            end = self._layout.index_end_offset(tp, record.key)
            if end is not None:
                out.append(Entry.from_index(end, IndexEntry.from_json(record.value)))
        return out

    # -- bytes -------------------------------------------------------------------------

    async def _fetch_bodies(self, entries: Sequence[Entry]
                            ) -> dict[Entry, bytes | Records | LlogError]:
        """Fetch every entry's body, one request per object where that is not wasteful.

        Slices of one shared blob wanted by several partitions are fetched with a single
        range GET of their span when the span is at most twice what is wanted; compacted
        and legacy objects are fetched whole, once. A failure is recorded against the
        entries it concerns, so it only fails the partitions that need them.
        """
        by_key: dict[str, list[Entry]] = {}
        for entry in set(entries):
            by_key.setdefault(entry.data_key, []).append(entry)
        out: dict[Entry, bytes | Records | LlogError] = {}

        async def fetch_object(uri: str, group: list[Entry]) -> None:
            try:
                await fetch_into(uri, group)
            except LlogError as exc:
                for e in group:
                    out.setdefault(e, exc)

        async def fetch_into(uri: str, group: list[Entry]) -> None:
            _, key = self._layout.parse_uri(uri)
            slices = [e for e in group if e.byte_offset is not None]
            wholes = [e for e in group if e.byte_offset is None]
            if wholes:
                records = self.objects.get(key) if not slices else None
                if records is None:
                    data = await self._s3.get(key)
                    for e in slices:
                        out[e] = _cut(data, e, 0)
                    first = wholes[0]
                    codec.verify_body(data, first.crc32c)
                    records = codec.decode_batch(data, first.msg_count)
                    self.objects.put(key, records)
                for e in wholes:
                    if len(records) != e.msg_count:
                        raise CorruptData(f"{uri} holds {len(records)} records, "
                                          f"the index says {e.msg_count}")
                    out[e] = records
                return
            lo = min(e.byte_offset or 0 for e in slices)
            hi = max((e.byte_offset or 0) + (e.byte_length or 0) for e in slices)
            wanted = sum(e.byte_length or 0 for e in slices)
            if len(slices) > 1 and hi - lo <= 2 * wanted:
                data = await self._s3.get_range(key, lo, hi - lo)
                for e in slices:
                    out[e] = _cut(data, e, lo)
                return
            for e in slices:
                out[e] = await self._s3.get_range(key, e.byte_offset or 0, e.byte_length or 0)

        async with anyio.create_task_group() as tg:
            for uri, group in by_key.items():
                tg.start_soon(fetch_object, uri, group)
        return out

    def _assemble(self, request: ReadRequest, plan: _Plan,
                  bodies: dict[Entry, bytes | Records | LlogError]) -> ReadResult:
        out: list[tuple[int, bytes]] = []
        size = 0
        next_at = plan.offset
        max_records, max_bytes = request.max_records, request.max_bytes
        for entry in plan.entries:
            body = bodies[entry]
            if isinstance(body, LlogError):
                raise body
            if isinstance(body, list):  # a whole object, verified and decoded already
                values = body
            else:
                codec.verify_body(body, entry.crc32c)
                values = codec.decode_batch(body, entry.msg_count)
            if entry.start > next_at:
                break  # a hole after what we have: the next read reports it
            for i, value in enumerate(values):
                at = entry.start + i
                if at < next_at:
                    continue  # before the fetch offset, or overlapping a compacted range
                if out and (
                    (max_records is not None and len(out) >= max_records)
                    or (max_bytes is not None and size + len(value) > max_bytes)
                ):
                    return ReadResult(request.tp, out, plan.high_watermark, next_at)
                out.append((at, value))
                size += len(value)
                next_at = at + 1
        return ReadResult(request.tp, out, plan.high_watermark, next_at)


def _cut(data: bytes, entry: Entry, base: int) -> bytes:
    start = (entry.byte_offset or 0) - base
    length = entry.byte_length or 0
    piece = data[start:start + length]
    if len(piece) != length:
        raise ObjectMissing(f"{entry.data_key}: slice [{start + base}, +{length}) lies "
                            "outside the object (truncated?)")
    return piece
