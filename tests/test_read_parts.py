"""The reader's parts that hold state of their own, each alone over fakes: the index
walk (app/storage/index_walk.py), the fetcher of units (app/storage/span_fetch.py) and
the room a call's earlier plans leave (app/storage/read_plan.py). The reader over the
real Oxia and MinIO is tests/test_reader_bounds.py and tests/test_engine.py."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.lowlevel
import pytest

from app.errors import LlogError, LogGap, ObjectMissing
from app.storage import codec
from app.storage.blob_lookups import BlobLookups
from app.storage.index_walk import IndexWalk
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control, IndexEntry
from app.storage.object_cache import ObjectCache
from app.storage.read_ahead import ReadAhead
from app.storage.read_plan import (
    PlannedRoom,
    ReadPlan,
    ReadRequest,
    SpanFetch,
    bytes_to_fetch,
    trim_to_total,
    units_for,
)
from app.storage.span_fetch import SpanFetcher
from app.storage.spans import Span
from app.storage.wal_objects import WalObjects
from app.stores.oxia.store import Record

TP = TopicPartition("t", 0)
LAYOUT = KeyLayout("llog", "bucket")


class FakeIndex:
    """Oxia as the walk reads it: sorted keys, each scan recorded."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.scans: list[tuple[str, str]] = []

    def put(self, end: int, entry: IndexEntry) -> None:
        self.values[LAYOUT.index(TP, end)] = entry.to_json()

    async def range_scan(self, lo: str, hi: str, partition_key: str, *,
                         limit: int | None = None) -> list[Record]:
        self.scans.append((lo, hi))
        keys = sorted(k for k in self.values if lo <= k < hi)[:limit]
        return [Record(k, self.values[k], 1) for k in keys]

    async def get(self, key: str, partition_key: str) -> Record | None:
        return None


def _walk(index: FakeIndex) -> tuple[IndexWalk, BlobLookups]:
    blobs = BlobLookups(LAYOUT, lambda: 0.0)
    return IndexWalk(index, LAYOUT, blobs), blobs  # type: ignore[arg-type]


def _wal(count: int, key: str = "wal/a") -> IndexEntry:
    return IndexEntry("WAL", count, LAYOUT.uri(key), byte_offset=0, byte_length=count)


def _compacted(count: int) -> IndexEntry:
    return IndexEntry("COMPACTED", count, LAYOUT.uri("compacted/1"))


async def test_the_walk_skips_strays_below_the_cursor_and_remembers_the_blob() -> None:
    index = FakeIndex()
    index.put(3, _wal(3))  # a stray: compaction covered 1..6 after it was written
    index.put(6, _compacted(6))
    index.put(8, _wal(2))
    walk, blobs = _walk(index)
    control = Control(sequence_counter=8)
    spans = await walk.resolve(TP, 1, control, None, None, stray_floor=7)
    assert [(s.start, s.end) for s in spans] == [(1, 6), (7, 8)]
    # The walk ended in a WAL entry: no compacted blob to read on in.
    assert blobs.covering(TP, 7) is None
    spans = await walk.resolve(TP, 4, control, None, 2, stray_floor=7)
    assert [(s.start, s.end) for s in spans] == [(1, 6)]
    assert blobs.covering(TP, 5) is not None  # where a catch-up reads on


async def test_the_walk_reports_a_hole_as_a_gap() -> None:
    index = FakeIndex()
    index.put(2, _wal(2))
    index.put(9, _wal(2))  # 3..7 covered by nothing
    walk, _ = _walk(index)
    with pytest.raises(LogGap, match="offset 3"):
        await walk.resolve(TP, 3, Control(sequence_counter=9), None, None, stray_floor=1)


async def test_the_walk_learns_how_many_offsets_a_window_of_entries_covers() -> None:
    index = FakeIndex()
    for end in range(100, 3300, 100):  # 100 records an entry
        index.put(end, _wal(100))
    walk, _ = _walk(index)
    guessed = walk.window_end(TP, 1, 16)
    spans = [s async for s in walk.spans_from(TP, 1, 3200)]
    assert len(spans) == 32
    learned = walk.window_end(TP, 1, 16)
    assert learned is not None and guessed is not None and learned > guessed
    assert learned == 1 + 16 * 100


class FakeS3:
    """Objects by key; counts downloads and how many are under way at once."""

    bucket = "bucket"

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[tuple[str, int, int | None]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def _download(self, key: str, start: int, length: int | None) -> bytes:
        self.gets.append((key, start, length))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await anyio.lowlevel.checkpoint()  # another download may start meanwhile
        self.in_flight -= 1
        if key not in self.objects:
            raise ObjectMissing(f"s3://bucket/{key}: missing")
        data = self.objects[key]
        return data[start:] if length is None else data[start:start + length]

    async def get(self, key: str) -> bytes:
        return await self._download(key, 0, None)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        return await self._download(key, start, length)

    async def get_range_buffer(self, key: str, start: int, length: int) -> bytearray:
        # A bytearray, as the lean path reads a body into.
        return bytearray(await self._download(key, start, length))

    async def get_head_buffer(self, key: str, length: int) -> bytearray:
        return bytearray(await self._download(key, 0, length))

    async def get_range_cut(self, key: str, start: int, spans: Sequence[tuple[int, int]]
                            ) -> list[bytes]:
        data = await self._download(key, start, spans[-1][1])
        return [data[offset:end] for offset, end in spans]


def _fetcher(s3: FakeS3, *, process_limit: int = 64) -> SpanFetcher:
    objects = ObjectCache(1 << 20)
    wal = WalObjects(s3, objects, 0)  # type: ignore[arg-type]  # every slice by its range
    return SpanFetcher(s3, LAYOUT, objects, wal, ReadAhead(0),  # type: ignore[arg-type]
                       fetch_concurrency=8, max_concurrent_fetches=process_limit)


def _slices(key: str, *batches: list[bytes]) -> tuple[bytes, list[SpanFetch]]:
    """A blob of ``batches`` one after the other, and a unit for each."""
    blob, units, end = b"", [], 0
    for records in batches:
        body = codec.encode_batch(records)
        end += len(records)
        entry = IndexEntry("WAL", len(records), LAYOUT.uri(key), byte_offset=len(blob),
                           byte_length=len(body), crc32c=codec.crc32c(body))
        units.append(SpanFetch(Span(end, entry), end - len(records) + 1))
        blob += body
    return blob, units


async def test_slices_of_one_blob_share_one_ranged_get_and_fail_alone() -> None:
    blob, units = _slices("wal/a", [b"a", b"b"], [b"c"])
    _, lost = _slices("wal/gone", [b"x"])
    s3 = FakeS3({"wal/a": blob})
    await _fetcher(s3).fetch([*units, *lost])
    assert [list(u.records or ()) for u in units] == [[b"a", b"b"], [b"c"]]
    assert [k for k, _, _ in s3.gets].count("wal/a") == 1
    assert isinstance(lost[0].error, ObjectMissing) and lost[0].records is None
    assert all(u.error is None for u in units)


async def test_a_whole_object_is_downloaded_once_then_served_from_the_cache() -> None:
    body = codec.encode_batch([b"a", b"b", b"c"])
    s3 = FakeS3({"compacted/1": body})
    fetcher = _fetcher(s3)
    for _ in range(2):
        unit = SpanFetch(Span(3, IndexEntry("COMPACTED", 3, LAYOUT.uri("compacted/1"))), 1)
        await fetcher.fetch([unit])
        assert list(unit.records or ()) == [b"a", b"b", b"c"]
    assert len(s3.gets) == 1


async def test_the_process_limit_bounds_downloads_across_calls() -> None:
    objects = {}
    calls = []
    for i in range(4):
        blob, units = _slices(f"wal/{i}", [b"r"])
        objects[f"wal/{i}"] = blob
        calls.append(units)
    s3 = FakeS3(objects)
    fetcher = _fetcher(s3, process_limit=1)
    async with anyio.create_task_group() as tg:
        for units in calls:
            tg.start_soon(fetcher.fetch, units)
    assert len(s3.gets) == 4
    assert s3.most_in_flight == 1


def _plan(units: int, size: int) -> ReadPlan:
    entry = IndexEntry("WAL", 1, LAYOUT.uri("wal/a"), byte_offset=0, byte_length=size)
    return ReadPlan(ReadRequest(TP, 1), 1, 1,
                    units=[SpanFetch(Span(i + 1, entry), i + 1) for i in range(units)])


async def test_a_plan_has_room_only_once_the_plans_before_it_left_some() -> None:
    room = PlannedRoom(3, max_bytes=100)
    answers: list[bool] = []

    async def third() -> None:
        answers.append(await room.left(2))

    async with anyio.create_task_group() as tg:
        tg.start_soon(third)
        await anyio.wait_all_tasks_blocked()
        assert answers == []  # waits for the plans before it
        room.planned(0, _plan(1, 60))
        await anyio.wait_all_tasks_blocked()
        assert answers == []
        room.planned(1, LogGap("no entry"))  # a failed plan takes no room
        await anyio.wait_all_tasks_blocked()
    assert answers == [True]
    assert await room.left(0)
    room.planned(2, _plan(1, 40))
    later = PlannedRoom(2, max_bytes=100)
    later.planned(0, _plan(2, 50))
    assert not await later.left(1)
    assert await PlannedRoom(2, max_bytes=None).left(1)


def _chunked(key: str, chunks: int, records: int = 100, size: int = 1000) -> Span:
    """A compacted blob of ``chunks`` chunks of ``records`` records, ``size`` bytes each."""
    rows = [[i * records, 4 + i * size, 0] for i in range(chunks)]
    entry = IndexEntry("COMPACTED", chunks * records, LAYOUT.uri(key),
                       object_bytes=4 + chunks * size, chunks=rows)
    return Span(chunks * records, entry)


def _resuming(key: str, budget: int | None = 1500) -> ReadPlan:
    """A partition read again from inside the chunk its previous answer ended in."""
    span = _chunked(key, 8)
    return ReadPlan(ReadRequest(TP, 151, max_bytes=budget), 151, 800,
                    units=units_for([span], 151, budget=budget or 4000))


def _held(unit: SpanFetch, chunk: int) -> bool:
    return chunk == 1  # where each partition's previous answer ended


def test_chunks_kept_from_the_previous_read_leave_the_budget_to_later_partitions() -> None:
    plans: list[ReadPlan | LlogError] = [_resuming(f"compacted/{p}") for p in range(4)]
    assert all(isinstance(p, ReadPlan) and p.units[0].chunk_range == (1, 2) for p in plans)
    trim_to_total(plans, 4 * 1500, lambda unit: bytes_to_fetch(unit, _held))
    assert all(isinstance(p, ReadPlan) and p.units for p in plans)  # every partition reads
    # Counted whole (what each unit would fetch were nothing kept), the last one got none.
    counted_whole: list[ReadPlan | LlogError] = [_resuming(f"compacted/{p}")
                                                 for p in range(4)]
    trim_to_total(counted_whole, 4 * 1500)
    assert [bool(p.units) for p in counted_whole if isinstance(p, ReadPlan)] == [
        True, True, True, False]


def test_a_partition_without_a_budget_of_its_own_still_takes_what_it_answers() -> None:
    # Read in request order, the first partition answers the whole budget: what it
    # keeps from its last read makes no room for the next one to fetch for nothing.
    plans: list[ReadPlan | LlogError] = [_resuming(f"compacted/{p}", None) for p in range(2)]
    first = plans[0]
    assert isinstance(first, ReadPlan) and first.units[0].chunk_range == (1, 4)
    trim_to_total(plans, 4000, lambda unit: bytes_to_fetch(unit, _held))
    assert [bool(p.units) for p in plans if isinstance(p, ReadPlan)] == [True, False]
    # Many small budgets are counted by what they fetch: no more partitions than fit.
    small: list[ReadPlan | LlogError] = [_resuming(f"compacted/{p}", 10) for p in range(8)]
    trim_to_total(small, 4000, lambda unit: bytes_to_fetch(unit, lambda u, c: False))
    assert [bool(p.units) for p in small if isinstance(p, ReadPlan)].count(True) == 4


def test_a_wal_slice_of_a_kept_object_costs_no_fetch() -> None:
    (unit,) = _slices("wal/a", [b"a" * 100])[1]
    assert bytes_to_fetch(unit, lambda u, part: part == -1) == 0
    assert bytes_to_fetch(unit, lambda u, part: False) == unit.span.cost_from(1) > 0
