"""Pure unit tests of the tail cache (app/tailcache): no servers, files under tmp_path.

The one property every test guards: whatever the cache answers is exactly what was put
at those offsets -- a miss is always allowed, a wrong record never.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.tailcache import (
    CacheHit,
    FileTailCache,
    MemoryTailCache,
    SharedTailCache,
    TailCache,
    TailCacheStats,
    open_tail_cache,
    segment,
    store_id_of,
)
from app.tailcache import files as file_cache
from app.tailcache.files import FORMAT_DIR, HW_FILE, STALE_TMP_NS, TMP_PREFIX
from app.tailcache.shared import MIN_PENDING_BYTES

TP = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
OTHER = TopicPartition("payments.v2-x_y", 7)
STORE = "bucket.llog-3f2a"

PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILE_PROPS = settings(max_examples=60, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


def value(offset: int, salt: int = 0) -> bytes:
    """A record whose bytes and length depend on its offset: mix-ups cannot go unseen."""
    return f"{salt}:{offset}:".encode() + bytes([offset % 251]) * (offset % 13)


def values(start: int, count: int, salt: int = 0) -> list[bytes]:
    return [value(o, salt) for o in range(start, start + count)]


def offsets(hit: CacheHit | None) -> list[int]:
    assert hit is not None
    return [o for o, _ in hit.records]


def partition_dir(root: Path, tp: TopicPartition) -> Path:
    return root / STORE / FORMAT_DIR / tp.topic / str(tp.partition)


def segment_files(root: Path, tp: TopicPartition = TP) -> list[Path]:
    d = partition_dir(root, tp)
    return sorted(p for p in d.iterdir() if segment.parse_segment_name(p.name) is not None)


def disk_bytes(root: Path, store_id: str = STORE) -> int:
    return sum(p.stat().st_size for p in (root / store_id / FORMAT_DIR).rglob("*.seg"))


class CaughtUp(SharedTailCache):
    """A shared cache whose writes behind have always caught up (the contract seen by
    a worker once its queue is written; tests below cover the lag)."""

    def put(self, tp: TopicPartition, start_offset: int, records: Any,
            append_time_ms: int = 0) -> None:
        super().put(tp, start_offset, records, append_time_ms)
        self.flush()

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        super().note_high_watermark(tp, high_watermark)
        self.flush()


@pytest.fixture(params=["memory", "files", "shared"])
def make_cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[
        Callable[[int], TailCache]]:
    """Builds caches of each kind with a given budget (each file cache in a fresh dir)."""
    made: list[TailCache] = []

    def make(max_bytes: int) -> TailCache:
        directory = tmp_path / f"c{len(made)}"
        cache: TailCache
        if request.param == "memory":
            cache = MemoryTailCache(max_bytes)
        elif request.param == "files":
            cache = FileTailCache(directory, max_bytes, store_id=STORE)
        else:
            cache = CaughtUp(MemoryTailCache(max_bytes),
                             FileTailCache(directory, max_bytes, store_id=STORE),
                             max_pending_bytes=max_bytes)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


# -- the contract, for both implementations ----------------------------------------------


def test_factory_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(open_tail_cache(None, 10, store_id=STORE), MemoryTailCache)
    assert isinstance(open_tail_cache(tmp_path, 10, store_id=STORE), SharedTailCache)


def test_put_then_get_contiguous(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.put(TP, 1, values(1, 3))
    cache.put(TP, 4, values(4, 2))
    hit = cache.get(TP, 1, None, None)
    assert hit == CacheHit([(o, value(o)) for o in range(1, 6)], 5, 6)
    hit = cache.get(TP, 3, None, None)
    assert hit == CacheHit([(o, value(o)) for o in range(3, 6)], 5, 6)
    assert cache.high_watermark(TP) == 5
    assert cache.high_watermark(TP1) is None
    assert cache.get(TP1, 1, None, None) is None  # unknown partition


def test_budgets_and_first_record_always(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    records = [b"a" * 10, b"b" * 10, b"c" * 10, b"d" * 10]
    cache.put(TP, 1, records)
    assert offsets(cache.get(TP, 1, 2, None)) == [1, 2]
    assert cache.get(TP, 1, 2, None) == CacheHit([(1, records[0]), (2, records[1])], 4, 3)
    assert offsets(cache.get(TP, 1, None, 25)) == [1, 2]
    assert offsets(cache.get(TP, 1, None, 20)) == [1, 2]
    assert offsets(cache.get(TP, 2, 10, 30)) == [2, 3, 4]
    # The first record goes even if alone it exceeds the byte budget.
    for budget in (0, 1, 9):
        hit = cache.get(TP, 3, None, budget)
        assert hit == CacheHit([(3, records[2])], 4, 4)


def test_known_empty_at_the_tail(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.put(TP, 1, values(1, 3))
    assert cache.get(TP, 4, None, None) == CacheHit([], 3, 4)
    assert cache.get(TP, 5, None, None) is None  # beyond the tail: not ours to judge
    assert cache.get(TP, 0, None, None) is None  # "from the first" is the reader's job
    assert cache.get(TP, 1, 0, None) is None


def test_note_high_watermark(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.note_high_watermark(TP, 0)
    assert cache.get(TP, 1, None, None) == CacheHit([], 0, 1)
    cache.note_high_watermark(TP, 7)
    assert cache.high_watermark(TP) == 7
    assert cache.get(TP, 8, None, None) == CacheHit([], 7, 8)
    assert cache.get(TP, 7, None, None) is None  # committed, but not cached
    assert cache.get(TP, 1, None, None) is None
    cache.note_high_watermark(TP, 3)  # never lowers
    assert cache.high_watermark(TP) == 7
    cache.put(TP, 8, values(8, 2))
    assert cache.get(TP, 8, None, None) == CacheHit([(8, value(8)), (9, value(9))], 9, 10)
    cache.note_high_watermark(TP, 12)  # a remote write: records then hw beyond them
    assert cache.get(TP, 8, None, None) == CacheHit([(8, value(8)), (9, value(9))], 12, 10)
    assert cache.get(TP, 10, None, None) is None
    assert cache.get(TP, 13, None, None) == CacheHit([], 12, 13)
    with pytest.raises(ValueError):
        cache.note_high_watermark(TP, -1)
    with pytest.raises(ValueError):
        cache.put(TP, 0, [b"x"])


def test_gap_is_never_bridged(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.put(TP, 1, values(1, 3))
    cache.put(TP, 10, values(10, 3))
    assert offsets(cache.get(TP, 10, None, None)) == [10, 11, 12]
    for offset in range(4, 10):
        assert cache.get(TP, offset, None, None) is None
    hit = cache.get(TP, 1, None, None)  # memory dropped 1..3; files stop at the gap
    assert hit is None or (offsets(hit) == [1, 2, 3] and hit.next_offset == 4)


def test_overlap_with_different_bytes_drops_the_older(
        make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.put(TP, 1, values(1, 5))
    cache.put(TP, 3, values(3, 2, salt=1))
    assert cache.get(TP, 1, None, None) is None
    assert cache.get(TP, 5, None, None) is None
    assert cache.get(TP, 3, None, None) == CacheHit(
        [(3, value(3, 1)), (4, value(4, 1))], 5, 5)


def test_eviction_keeps_the_newest_within_budget(
        make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(4096)
    for offset in range(1, 201):
        cache.put(TP, offset, [bytes([offset % 256]) * 100])
        assert cache.statistics().bytes <= 4096
    stats = cache.statistics()
    assert stats.evictions > 0
    assert cache.get(TP, 1, None, None) is None
    hit = cache.get(TP, 200, None, None)
    assert hit == CacheHit([(200, bytes([200]) * 100)], 200, 201)
    hit = cache.get(TP, 190, None, None)
    assert hit is not None and offsets(hit) == list(range(190, 201))
    assert all(v == bytes([o % 256]) * 100 for o, v in hit.records)


def test_oversized_records_are_not_cached(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1000)
    cache.put(TP, 1, [b"x" * 10])
    cache.put(TP, 2, [b"y" * 5000])
    assert cache.high_watermark(TP) == 2
    assert cache.get(TP, 2, None, None) is None
    assert cache.get(TP, 3, None, None) == CacheHit([], 2, 3)
    hit = cache.get(TP, 1, None, None)  # still true, but never stitched to offset 3
    assert hit is None or hit == CacheHit([(1, b"x" * 10)], 2, 2)
    # A put bigger than the budget keeps its newest records.
    cache.put(TP, 3, [b"z" * 400] * 5)
    assert cache.get(TP, 3, None, None) is None
    hit = cache.get(TP, 7, None, None)
    assert hit == CacheHit([(7, b"z" * 400)], 7, 8)


def test_statistics_and_close(make_cache: Callable[[int], TailCache]) -> None:
    cache = make_cache(1 << 20)
    cache.put(TP, 1, values(1, 4))
    cache.put(OTHER, 1, values(1, 2))
    cache.get(TP, 1, None, None)
    cache.get(TP, 5, None, None)
    cache.get(TP, 9, None, None)
    stats = cache.statistics()
    assert isinstance(stats, TailCacheStats)
    assert (stats.partitions, stats.segments, stats.records) == (2, 2, 6)
    assert (stats.hits, stats.misses) == (2, 1)
    assert stats.bytes >= sum(len(v) for v in values(1, 4) + values(1, 2))
    cache.close()
    assert cache.get(TP, 1, None, None) is None
    cache.put(TP, 5, [b"late"])  # ignored, no error


# -- memory specifics ---------------------------------------------------------------------


def test_memory_joins_adjacent_and_repeated_puts() -> None:
    cache = MemoryTailCache(1 << 20)
    cache.put(TP, 4, values(4, 3))
    cache.put(TP, 1, values(1, 3))  # out of order but adjacent: one run
    cache.put(TP, 5, values(5, 4))  # a repeat with the same bytes, extending the run
    assert offsets(cache.get(TP, 1, None, None)) == list(range(1, 9))
    assert cache.get(TP, 1, None, None) == CacheHit([(o, value(o)) for o in range(1, 9)], 8, 9)


def test_memory_evicts_the_oldest_partition_first() -> None:
    cache = MemoryTailCache(300)
    cache.put(TP, 1, [b"a" * 100])
    cache.put(OTHER, 1, [b"b" * 100])
    cache.put(TP1, 1, [b"c" * 100])
    cache.put(OTHER, 2, [b"d" * 100])
    assert cache.get(TP, 1, None, None) is None
    assert offsets(cache.get(OTHER, 1, None, None)) == [1, 2]
    assert offsets(cache.get(TP1, 1, None, None)) == [1]
    assert cache.statistics().evictions == 1
    assert cache.statistics().bytes == 300


def test_memory_copies_mutable_records() -> None:
    cache = MemoryTailCache(1 << 20)
    buf = bytearray(b"abc")
    cache.put(TP, 1, [buf])  # type: ignore[list-item]
    buf[0] = ord("z")
    assert cache.get(TP, 1, None, None) == CacheHit([(1, b"abc")], 1, 2)


# -- the model-based property test ----------------------------------------------------------

put_op = st.tuples(st.just("put"), st.integers(1, 40),
                   st.lists(st.binary(max_size=12), max_size=8))
get_op = st.tuples(st.just("get"), st.integers(0, 50),
                   st.one_of(st.none(), st.integers(0, 10)),
                   st.one_of(st.none(), st.integers(0, 40)))
note_op = st.tuples(st.just("note"), st.integers(0, 50))
ops_st = st.lists(st.one_of(put_op, put_op, get_op, get_op, note_op), max_size=60)
budget_st = st.sampled_from([0, 10, 50, 200, 1 << 20])


class Model:
    """The truth: offset -> the bytes last put there, and the highest offset told.

    "Last put wins" is stronger than the broker needs (committed offsets never change),
    so a cache agreeing with it also never serves bytes of a log that was replaced.
    """

    def __init__(self) -> None:
        self.truth: dict[int, bytes] = {}
        self.hw: int | None = None

    def raise_hw(self, hw: int) -> None:
        self.hw = hw if self.hw is None else max(self.hw, hw)


def check_get(cache: TailCache, model: Model, offset: int, max_records: int | None,
              max_bytes: int | None, *, exact_hw: bool) -> None:
    hit = cache.get(TP, offset, max_records, max_bytes)
    answerable = offset >= 1 and (max_records is None or max_records > 0)
    if hit is None:
        if exact_hw and answerable and model.hw is not None and offset == model.hw + 1:
            pytest.fail(f"miss at the known tail {offset}")
        return
    assert answerable and model.hw is not None
    if exact_hw:
        assert hit.high_watermark == model.hw
    assert hit.high_watermark <= model.hw
    assert hit.next_offset == offset + len(hit.records)
    if not hit.records:
        assert offset == hit.high_watermark + 1
        return
    assert offsets(hit) == list(range(offset, hit.next_offset))
    for o, v in hit.records:
        assert v == model.truth[o], f"offset {o}: cached {v!r}, put {model.truth[o]!r}"
    assert hit.next_offset - 1 <= hit.high_watermark
    if max_records is not None:
        assert len(hit.records) <= max_records
    if max_bytes is not None and len(hit.records) > 1:
        assert sum(len(v) for _, v in hit.records) <= max_bytes


def run_against_model(cache: TailCache, max_bytes: int, ops: list[Any]) -> Model:
    model = Model()
    for op in ops:
        if op[0] == "put":
            _, start, records = op
            cache.put(TP, start, records)
            for i, r in enumerate(records):
                model.truth[start + i] = r
            if records:
                model.raise_hw(start + len(records) - 1)
                if sum(len(r) for r in records) * 2 + 64 <= max_bytes:
                    # Small enough to be cached whatever the overhead: it must be.
                    hit = cache.get(TP, start, None, None)
                    assert hit is not None
                    assert hit.records[: len(records)] == [
                        (start + i, r) for i, r in enumerate(records)]
        elif op[0] == "note":
            cache.note_high_watermark(TP, op[1])
            model.raise_hw(op[1])
        else:
            _, offset, max_records, max_bytes_get = op
            check_get(cache, model, offset, max_records, max_bytes_get, exact_hw=True)
    return model


@PROPS
@given(max_bytes=budget_st, ops=ops_st)
def test_memory_cache_agrees_with_a_model(max_bytes: int, ops: list[Any]) -> None:
    cache = MemoryTailCache(max_bytes)
    run_against_model(cache, max_bytes, ops)
    assert cache.statistics().bytes <= max_bytes


@FILE_PROPS
@given(max_bytes=budget_st, ops=ops_st)
def test_file_cache_agrees_with_a_model(max_bytes: int, ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        cache = FileTailCache(Path(d), max_bytes, store_id=STORE)
        model = run_against_model(cache, max_bytes, ops)
        assert disk_bytes(Path(d)) <= max_bytes
        # Another process's view of the same directory agrees too.
        other = FileTailCache(Path(d), max_bytes, store_id=STORE)
        for offset in range(0, 52):
            for max_records in (None, 1):
                check_get(other, model, offset, max_records, None, exact_hw=False)
                check_get(cache, model, offset, max_records, None, exact_hw=True)


# -- file cache: sharing, budget, damage -----------------------------------------------------


def test_two_instances_share_one_directory(tmp_path: Path) -> None:
    a = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    b = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    assert b.get(TP, 1, None, None) is None
    a.put(TP, 1, values(1, 3))
    assert b.get(TP, 1, None, None) == CacheHit([(o, value(o)) for o in range(1, 4)], 3, 4)
    assert b.get(TP, 4, None, None) == CacheHit([], 3, 4)
    b.put(TP, 4, values(4, 2))  # b's write, then a (whose index is stale) reads past it
    assert a.get(TP, 4, None, None) == CacheHit([(4, value(4)), (5, value(5))], 5, 6)
    assert a.get(TP, 1, None, None) == CacheHit([(o, value(o)) for o in range(1, 6)], 5, 6)
    a.put(TP, 6, values(6, 1))
    assert a.get(TP, 2, None, None) == CacheHit([(o, value(o)) for o in range(2, 7)], 6, 7)
    b.note_high_watermark(TP, 9)
    assert a.high_watermark(TP) == 9
    assert a.get(TP, 10, None, None) == CacheHit([], 9, 10)
    a.put(OTHER, 1, [b"o"])
    assert b.get(OTHER, 1, None, None) == CacheHit([(1, b"o")], 1, 2)


def test_relist_finds_segments_written_in_the_same_clock_tick(tmp_path: Path) -> None:
    a = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    b = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    for start in range(1, 60, 3):  # fast alternation: the directory mtime barely moves
        a.put(TP, start, values(start, 1))
        b.put(TP, start + 1, values(start + 1, 2))
        for reader in (a, b):
            hit = reader.get(TP, start, None, None)
            assert hit == CacheHit([(o, value(o)) for o in range(start, start + 3)],
                                   start + 2, start + 3)


def test_file_budget_bounds_the_directory(tmp_path: Path) -> None:
    cache = FileTailCache(tmp_path, 10_000, store_id=STORE)
    for offset in range(1, 301):
        cache.put(TP if offset % 2 else OTHER, offset, [value(offset) * 10])
        assert disk_bytes(tmp_path) <= 10_000
    assert cache.statistics().evictions > 0
    assert cache.get(TP, 299, None, None) == CacheHit([(299, value(299) * 10)], 299, 300)
    assert cache.get(TP, 1, None, None) is None
    # Reopening with a smaller budget trims what is there.
    FileTailCache(tmp_path, 2_000, store_id=STORE).close()
    assert disk_bytes(tmp_path) <= 2_000


def test_caches_of_two_stores_share_a_directory_but_no_records(tmp_path: Path) -> None:
    old = FileTailCache(tmp_path, 1 << 20, store_id="store-1")
    new = FileTailCache(tmp_path, 1 << 20, store_id="store-2")
    old.put(TP, 1, values(1, 3))
    old.note_high_watermark(TP, 5)
    # The same offsets of another store: nothing to serve, not even "known empty".
    assert new.get(TP, 1, None, None) is None
    assert new.get(TP, 6, None, None) is None
    assert new.high_watermark(TP) is None
    new.put(TP, 1, values(1, 2, salt=1))
    assert new.get(TP, 1, None, None) == CacheHit([(1, value(1, 1)), (2, value(2, 1))], 2, 3)
    assert old.get(TP, 1, None, None) == CacheHit([(o, value(o)) for o in range(1, 4)], 5, 4)
    # Each store's budget covers its own files only.
    FileTailCache(tmp_path, 0, store_id="store-2").close()
    assert new.get(TP, 1, None, None) is None
    reopened = FileTailCache(tmp_path, 1 << 20, store_id="store-1")
    assert reopened.get(TP, 1, None, None) == CacheHit(
        [(o, value(o)) for o in range(1, 4)], 5, 4)
    assert reopened.statistics().bytes == disk_bytes(tmp_path, "store-1") > 0


def test_store_ids_are_path_safe(tmp_path: Path) -> None:
    for bad in ("", ".", "..", "a/b", "../x", "a b", "caf\u00e9", "x" * 129, "a\0b"):
        with pytest.raises(ValueError):
            FileTailCache(tmp_path, 1 << 20, store_id=bad)
    for good in ("a", "...", "A.b-c_9", "x" * 128):
        FileTailCache(tmp_path, 1 << 20, store_id=good).put(TP, 1, [b"x"])
        assert (tmp_path / good / FORMAT_DIR / TP.topic).is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a", "...", "A.b-c_9", "x" * 128])
    # The memory cache takes a store id too, and needs none to be path safe.
    assert open_tail_cache(None, 10, store_id="").get(TP, 1, None, None) is None


def test_store_id_of_names_a_store_validly() -> None:
    ids = {store_id_of("bucket", "llog", "oxia-id-1"), store_id_of("bucket", "llog", "id-2"),
           store_id_of("bucket", "llog/oxia-id-1"), store_id_of("bucket")}
    assert len(ids) == 4
    assert store_id_of("bucket", "llog", "oxia-id-1") in ids
    for store_id in ids:
        assert file_cache.check_store_id(store_id) == store_id


def indexed_on_disk(root: Path, *tps: TopicPartition) -> tuple[int, int]:
    """Segments and records on disk in the given partitions."""
    segs = [segment.parse_segment_name(p.name) for tp in tps for p in segment_files(root, tp)]
    return len(segs), sum(end - start + 1 for start, end in filter(None, segs))


def test_index_forgets_segments_another_process_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_cache, "FULL_SCAN_INTERVAL_NS", 0)  # every eviction lists all
    budget = 20_000
    writer = FileTailCache(tmp_path, budget, store_id=STORE)
    other = FileTailCache(tmp_path, budget, store_id=STORE)
    for offset in range(1, 41):  # about half the budget: no full scan in the writer yet
        writer.put(TP, offset, [value(offset) * 20])
    for offset in range(1, 201):  # the other process's scans evict the writer's segments
        other.put(OTHER, offset, [value(offset) * 20])
    assert segment_files(tmp_path, TP) == []
    for offset in range(1, 201):  # the writer's own scans now find its files gone
        writer.put(TP1, offset, [value(offset) * 20])
    stats = writer.statistics()
    segments, records = indexed_on_disk(tmp_path, TP, TP1)
    assert stats.records == records
    assert stats.segments == segments
    assert stats.partitions == 1


def test_a_writer_evicts_its_own_oldest_segments_without_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    budget = 20_000
    cache = FileTailCache(tmp_path, budget, store_id=STORE)
    listings: list[int] = []
    real = FileTailCache._list_segments

    def counted(self: FileTailCache) -> list[Any]:
        listings.append(1)
        return real(self)

    monkeypatch.setattr(FileTailCache, "_list_segments", counted)
    for offset in range(1, 401):
        cache.put(TP, offset, [value(offset) * 20])
        assert disk_bytes(tmp_path) <= budget
    assert listings == []
    assert cache.get(TP, 400, None, None) is not None  # the newest stay
    assert cache.get(TP, 1, None, None) is None
    assert cache.statistics().evictions > 200
    # The same name written again is one file: evicting its older write keeps it.
    cache.put(TP, 400, [b"again"])
    for offset in range(401, 501):
        cache.put(TP1, offset, [value(offset) * 20])
    assert disk_bytes(tmp_path) <= budget


def test_a_segment_that_cannot_be_deleted_leaves_the_budget_true(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete refused (EACCES, EBUSY) while evicting its own oldest segments: the
    writer lists the directory at once, so the files still there count again and the
    directory stays within its budget."""
    budget = 20_000
    cache = FileTailCache(tmp_path, budget, store_id=STORE)
    real_unlink = os.unlink
    refused: list[str] = []

    def unlink_refusing_once(path: Any, *args: Any, **kwargs: Any) -> None:
        if not refused and str(path).endswith(".seg"):
            refused.append(str(path))
            raise PermissionError(13, "refused", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(file_cache.os, "unlink", unlink_refusing_once)
    for offset in range(1, 401):
        cache.put(TP, offset, [value(offset) * 20])
        assert disk_bytes(tmp_path) <= budget, offset
    assert refused
    assert cache.get(TP, 400, None, None) is not None


def test_index_of_one_partition_is_bounded(tmp_path: Path) -> None:
    bound = file_cache.MAX_SEGMENTS_PER_PARTITION
    last = bound + 100
    writer = FileTailCache(tmp_path, 1 << 30, store_id=STORE)
    for offset in range(1, last + 1):
        writer.put(TP, offset, [value(offset)])
    reader = FileTailCache(tmp_path, 1 << 30, store_id=STORE)
    tail = CacheHit([(o, value(o)) for o in range(last - 9, last + 1)], last, last + 1)
    for cache in (writer, reader):
        assert cache.get(TP, last - 9, None, None) == tail
        assert cache.statistics().records == bound
        assert cache.statistics().segments == bound
        # Older segments are not indexed: a miss, or the right records.
        hit = cache.get(TP, 1, 3, None)
        assert hit is None or hit.records == [(o, value(o)) for o in (1, 2, 3)]


def test_indexed_partitions_are_bounded_least_recently_used_first(tmp_path: Path) -> None:
    tps = [TopicPartition("orders", p) for p in range(5)]
    cache = FileTailCache(tmp_path, 1 << 20, store_id=STORE, max_partitions=2)
    for p, tp in enumerate(tps):
        cache.put(tp, 1, values(1, p + 1))  # partition p holds p + 1 records
    assert cache.statistics().partitions == 2
    cache.get(tps[3], 1, None, None)  # 3 is now used more recently than 4
    cache.get(tps[0], 1, None, None)  # indexing 0 drops 4
    assert (cache.statistics().partitions, cache.statistics().records) == (2, 4 + 1)
    for p, tp in enumerate(tps):  # every partition is still served from its files
        hit = CacheHit([(o, value(o)) for o in range(1, p + 2)], p + 1, p + 2)
        assert cache.get(tp, 1, None, None) == hit
    assert cache.statistics().partitions == 2
    with pytest.raises(ValueError):
        FileTailCache(tmp_path, 1 << 20, store_id=STORE, max_partitions=0)


def test_segment_and_hw_codecs_round_trip() -> None:
    records = [b"", b"a", b"\x00" * 300]
    data = segment.encode_segment(OTHER, 5, records, 1_760_000_000_000)
    assert segment.decode_segment(data, OTHER, 5, 7) == (records, 1_760_000_000_000)
    rich: list[Payload] = [b"plain", LogRecord(b"v", b"k", (("h", b"x"),), 7)]
    assert segment.decode_segment(segment.encode_segment(OTHER, 5, rich, 9), OTHER, 5, 6
                                  ) == (rich, 9)
    assert segment.decode_segment(data, OTHER, 5, 8) is None  # the name claims another range
    assert segment.decode_segment(data, OTHER, 4, 6) is None
    assert segment.decode_segment(data, TopicPartition(OTHER.topic, 8), 5, 7) is None
    assert segment.decode_segment(data, TopicPartition("payments.v2-x_Y", 7), 5, 7) is None
    hw = segment.encode_high_watermark(OTHER, 42)
    assert segment.decode_high_watermark(hw, OTHER) == 42
    assert segment.decode_high_watermark(hw, TP) is None
    assert segment.decode_high_watermark(hw[:-1], OTHER) is None
    assert segment.parse_segment_name(segment.segment_name(5, 7)) == (5, 7)
    for bad in ("x.seg", "00000000000000000005-00000000000000000004.seg", HW_FILE,
                ".tmp-1-ab", "00000000000000000000-00000000000000000001.seg"):
        assert segment.parse_segment_name(bad) is None


def _damage_cases(good: bytes) -> Iterator[tuple[str, bytes]]:
    for n in range(len(good)):
        yield f"truncated to {n}", good[:n]
    for i in range(len(good)):
        for bit in (0x01, 0x80):
            flipped = bytearray(good)
            flipped[i] ^= bit
            yield f"byte {i} ^ {bit:#x}", bytes(flipped)
    yield "garbage", os.urandom(len(good))
    yield "appended", good + b"\x00"


def test_damaged_segment_is_a_miss_never_wrong_data(tmp_path: Path) -> None:
    records = [b"alpha", b"", b"gamma" * 3]
    writer = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    writer.put(TP, 1, records)
    (path,) = segment_files(tmp_path)
    good = path.read_bytes()
    for what, data in _damage_cases(good):
        path.write_bytes(data)
        for reader in (writer, FileTailCache(tmp_path, 1 << 20, store_id=STORE)):
            path.write_bytes(data)
            for offset in (1, 2, 3):
                assert reader.get(TP, offset, None, None) is None, what
    # Rewritten intact, it is served again.
    writer.put(TP, 1, records)
    assert writer.get(TP, 1, None, None) == CacheHit(list(enumerate(records, 1)), 3, 4)


def test_foreign_files_are_ignored_or_missed(tmp_path: Path) -> None:
    writer = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    writer.put(TP, 1, values(1, 3))
    writer.put(OTHER, 4, values(4, 3, salt=9))
    d = partition_dir(tmp_path, TP)
    # Leftover temporary file of a crashed writer, junk, and a directory with a segment name.
    (d / f"{TMP_PREFIX}123-deadbeef").write_bytes(b"partial")
    (d / "notes.txt").write_text("hello")
    (d / segment.segment_name(10, 12)).mkdir()
    # Another partition's valid segment for 4..6 copied into this partition.
    (other_seg,) = segment_files(tmp_path, OTHER)
    (d / segment.segment_name(4, 6)).write_bytes(other_seg.read_bytes())
    # A valid segment of this partition renamed to claim another range.
    (d / segment.segment_name(20, 22)).write_bytes(segment_files(tmp_path)[0].read_bytes())
    writer.note_high_watermark(TP, 22)
    reader = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    for cache in (reader, writer):
        assert cache.get(TP, 1, None, None) == CacheHit(
            [(o, value(o)) for o in range(1, 4)], 22, 4)
        for offset in (4, 5, 10, 20, 21):
            assert cache.get(TP, offset, None, None) is None


def test_damaged_hw_file_means_unknown(tmp_path: Path) -> None:
    a = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    a.note_high_watermark(TP, 5)
    hw_path = partition_dir(tmp_path, TP) / HW_FILE
    hw_path.write_bytes(hw_path.read_bytes()[:-2])
    b = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    assert b.high_watermark(TP) is None
    assert b.get(TP, 6, None, None) is None
    b.note_high_watermark(TP, 6)
    reopened = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    assert reopened.get(TP, 7, None, None) == CacheHit([], 6, 7)


def test_stale_temporary_files_are_cleaned(tmp_path: Path) -> None:
    FileTailCache(tmp_path, 1 << 20, store_id=STORE).put(TP, 1, [b"x"])
    d = partition_dir(tmp_path, TP)
    old, fresh = d / f"{TMP_PREFIX}1-old", d / f"{TMP_PREFIX}1-new"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    past = (time.time_ns() - 2 * STALE_TMP_NS) / 1e9
    os.utime(old, (past, past))
    FileTailCache(tmp_path, 1 << 20, store_id=STORE).close()
    assert not old.exists()
    assert fresh.exists()


def test_vanished_segment_is_a_miss(tmp_path: Path) -> None:
    a = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    a.put(TP, 1, values(1, 2))
    assert a.get(TP, 1, None, None) is not None
    for p in segment_files(tmp_path):
        p.unlink()  # evicted by another worker
    assert a.get(TP, 1, None, None) is None
    assert a.get(TP, 3, None, None) == CacheHit([], 2, 3)


def test_unwritable_directory_never_fails_the_caller(tmp_path: Path) -> None:
    cache = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    (tmp_path / STORE / FORMAT_DIR / TP.topic).write_bytes(b"not a directory")
    cache.put(TP, 1, [b"x"])  # logged and ignored
    cache.note_high_watermark(TP, 3)
    assert cache.get(TP, 1, None, None) is None


# -- file cache: concurrent processes -------------------------------------------------------

BLOCK = 25
BLOCKS = 48
WRITERS = 3
LAST = BLOCK * BLOCKS
CONCURRENT_BUDGET = 48 * 1024
TIMEOUT_S = 120.0


def _expected(offset: int) -> bytes:
    return value(offset, salt=offset % 7) * (1 + offset % 5)


def _writer_process(directory: str, writer: int, start: Any, seed: int) -> None:
    """Writes blocks ``writer, writer + WRITERS, ...`` in random-sized contiguous puts."""
    if not start.wait(TIMEOUT_S):
        raise TimeoutError("start signal never came")
    cache = FileTailCache(Path(directory), CONCURRENT_BUDGET, store_id=STORE)
    rng = random.Random(seed)
    for block in range(writer, BLOCKS, WRITERS):
        at, end = block * BLOCK + 1, (block + 1) * BLOCK
        while at <= end:
            n = min(rng.randint(1, 8), end - at + 1)
            cache.put(TP, at, [_expected(o) for o in range(at, at + n)])
            at += n
    cache.close()


def _verify(hit: CacheHit | None, offset: int) -> int:
    """Checks one answer against the truth; returns how many records it held."""
    if hit is None:
        return 0
    assert 0 <= hit.high_watermark <= LAST
    assert hit.next_offset == offset + len(hit.records)
    if not hit.records:
        assert offset == hit.high_watermark + 1
        return 0
    assert hit.records[-1][0] <= hit.high_watermark
    for i, (o, v) in enumerate(hit.records):
        assert o == offset + i
        assert v == _expected(o), f"offset {o}: wrong bytes"
    return len(hit.records)


def _reader_process(directory: str, start: Any, stop: Any, seed: int) -> None:
    if not start.wait(TIMEOUT_S):
        raise TimeoutError("start signal never came")
    cache = FileTailCache(Path(directory), CONCURRENT_BUDGET, store_id=STORE)
    rng = random.Random(seed)
    deadline = time.monotonic() + TIMEOUT_S
    while not stop.is_set():
        if time.monotonic() > deadline:
            raise TimeoutError("never told to stop")
        offset = rng.randint(1, LAST + 1)
        _verify(cache.get(TP, offset, rng.choice([None, 1, 10]), rng.choice([None, 500])),
                offset)


def test_concurrent_processes_never_see_wrong_records(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, stop = ctx.Event(), ctx.Event()
    writers = [ctx.Process(target=_writer_process, args=(str(tmp_path), w, start, w))
               for w in range(WRITERS)]
    readers = [ctx.Process(target=_reader_process, args=(str(tmp_path), start, stop, 100 + r))
               for r in range(2)]
    procs = writers + readers
    for p in procs:
        p.start()
    try:
        cache = FileTailCache(tmp_path, CONCURRENT_BUDGET, store_id=STORE)
        rng = random.Random(7)
        start.set()
        served = 0
        deadline = time.monotonic() + TIMEOUT_S
        while any(w.is_alive() for w in writers):
            assert time.monotonic() < deadline, "writers did not finish"
            if rng.random() < 0.5:
                offset = rng.randint(1, LAST + 1)
            else:  # near the tail, where consumers are
                offset = max(1, (cache.high_watermark(TP) or 0) + 1 - rng.randint(0, 30))
            served += _verify(cache.get(TP, offset, rng.choice([None, 5]), None), offset)
        stop.set()
        for p in procs:
            p.join(TIMEOUT_S)
        assert [p.exitcode for p in procs] == [0] * len(procs)
        # Afterwards: every offset is either a miss or exactly right, and the tail is there.
        for offset in range(1, LAST + 2):
            served += _verify(cache.get(TP, offset, None, None), offset)
        hw = cache.high_watermark(TP)
        assert hw is not None and hw <= LAST
        assert served > 0
        assert disk_bytes(tmp_path) <= CONCURRENT_BUDGET * 2
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)


# -- a worker's cache over a shared directory: memory now, files behind ------------------


def shared_pair(root: Path, max_bytes: int = 1 << 20, pending: int = 1 << 20
                ) -> tuple[SharedTailCache, SharedTailCache]:
    """Two workers of one host over one directory."""
    def worker() -> SharedTailCache:
        return SharedTailCache(MemoryTailCache(max_bytes),
                               FileTailCache(root, max_bytes, store_id=STORE),
                               max_pending_bytes=pending)
    return worker(), worker()


def test_a_put_touches_no_file_until_written_behind(tmp_path: Path) -> None:
    a, b = shared_pair(tmp_path)
    a.put(TP, 1, values(1, 3))
    # The worker that wrote answers at once; the directory has nothing yet.
    assert offsets(a.get(TP, 1, None, None)) == [1, 2, 3]
    assert not partition_dir(tmp_path, TP).exists()
    assert b.get(TP, 1, None, None) is None
    assert a.statistics().pending_writes == 1
    a.flush()
    assert b.get(TP, 1, None, None) == CacheHit([(o, value(o)) for o in range(1, 4)], 3, 4)
    assert b.get(TP, 4, None, None) == CacheHit([], 3, 4)
    assert a.statistics().pending_writes == 0


def test_puts_written_together_raise_the_hw_file_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = shared_pair(tmp_path)
    writes: list[str] = []
    real = FileTailCache._write_atomic

    def counted(self: FileTailCache, directory: Path, name: str, data: bytes) -> None:
        writes.append(name)
        real(self, directory, name, data)

    monkeypatch.setattr(FileTailCache, "_write_atomic", counted)
    for start in range(1, 31, 3):
        a.put(TP, start, values(start, 3))
    a.note_high_watermark(TP1, 7)
    a.flush()
    assert writes.count(HW_FILE) == 2  # one per partition, not one per put
    assert len(writes) == 1 + 2  # and the contiguous puts in one segment
    assert offsets(b.get(TP, 1, None, None)) == list(range(1, 31))
    assert b.get(TP1, 8, None, None) == CacheHit([], 7, 8)


def test_a_full_queue_drops_the_oldest_writes_and_counts_them(tmp_path: Path) -> None:
    big = [b"x" * 1000] * 1000  # about 1 MB per put
    a = SharedTailCache(MemoryTailCache(64 << 20),
                        FileTailCache(tmp_path, 64 << 20, store_id=STORE),
                        max_pending_bytes=0)  # the floor: MIN_PENDING_BYTES
    puts = MIN_PENDING_BYTES // 1_000_000 + 3
    for i in range(puts):
        a.put(TP, 1 + i * 1000, big)
    stats = a.statistics()
    assert stats.dropped_writes >= 3 and stats.pending_writes + stats.dropped_writes == puts
    # What the worker wrote is still answered from its memory.
    assert len(offsets(a.get(TP, 1, None, None))) == puts * 1000
    a.flush()
    other = FileTailCache(tmp_path, 64 << 20, store_id=STORE)
    assert other.get(TP, 1, None, None) is None  # dropped: a miss, never wrong
    last = 1 + (puts - 1) * 1000
    assert offsets(other.get(TP, last, None, None)) == list(range(last, last + 1000))


def test_puts_joined_into_one_segment_keep_every_record_and_append_time(
        tmp_path: Path) -> None:
    from app.storage.batch import RecordBatch

    cache = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    plain = RecordBatch.of(values(1, 3))  # bytes-batch-v3
    rich = RecordBatch.of([LogRecord(b"v4", key=b"k", headers=(("h", b"1"),)),
                           LogRecord(b"v5", key=b"k5")])  # headers: bytes-batch-v2
    assert (plain.encoding, rich.encoding) == ("bytes-batch-v3", "bytes-batch-v2")
    cache.put_many([
        file_cache.PendingPut(TP, 1, plain, 100),
        file_cache.PendingPut(TP1, 1, values(1, 2), 100),
        file_cache.PendingPut(TP, 4, rich, 100),
        file_cache.PendingPut(TP, 6, values(6, 2), 200),  # a later flush: its own time
        file_cache.PendingPut(TP, 9, values(9, 1), 200),  # not contiguous: its own file
    ], {})
    assert [f.name for f in segment_files(tmp_path)] == [
        segment.segment_name(1, 5), segment.segment_name(6, 7), segment.segment_name(9, 9)]
    other = FileTailCache(tmp_path, 1 << 20, store_id=STORE)
    hit = other.get(TP, 1, None, None)
    assert hit is not None and hit.records == [
        *[(o, value(o)) for o in range(1, 4)], (4, rich[0]), (5, rich[1]),
        (6, value(6)), (7, value(7))]
    assert hit.append_times == [100] * 5 + [200] * 2
    assert offsets(other.get(TP1, 1, None, None)) == [1, 2]


def test_the_directory_never_says_empty_where_this_worker_knows_records(
        tmp_path: Path) -> None:
    a, b = shared_pair(tmp_path)
    a.put(TP, 1, values(1, 3))
    a.flush()
    # b committed 4..5 (its memory has them) and learned hw 5; its write behind is late.
    b.put(TP, 4, values(4, 2))
    b._memory.drop(TP)  # as if its memory evicted them
    b.note_high_watermark(TP, 5)
    # The directory alone would answer "known empty at 4" (its hw is 3): a miss instead.
    assert FileTailCache(tmp_path, 1 << 20, store_id=STORE).get(TP, 4, None, None) == (
        CacheHit([], 3, 4))
    assert b.get(TP, 4, None, None) is None
    b.flush()
    assert offsets(b.get(TP, 4, None, None)) == [4, 5]


async def test_writes_behind_run_in_the_background_and_never_hold_a_put(
        tmp_path: Path) -> None:
    import threading

    import anyio

    a, b = shared_pair(tmp_path)
    entered, release, written = threading.Event(), threading.Event(), threading.Event()
    real = FileTailCache.put_many

    def slow_disk(self: FileTailCache, puts: Any, notes: Any) -> None:
        entered.set()
        release.wait(30)
        real(self, puts, notes)
        hit = self.get(TP, 3, None, None)
        if hit is not None and hit.records:
            written.set()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FileTailCache, "put_many", slow_disk)
        async with anyio.create_task_group() as tg:
            await tg.start(a.write_behind)
            a.put(TP, 1, values(1, 2))
            assert await anyio.to_thread.run_sync(entered.wait, 10)  # the writer took it
            a.put(TP, 3, values(3, 2))  # and is stuck on the disk: puts go on
            assert offsets(a.get(TP, 1, None, None)) == [1, 2, 3, 4]
            assert b.get(TP, 1, None, None) is None
            release.set()
            assert await anyio.to_thread.run_sync(written.wait, 10)
            tg.cancel_scope.cancel()
    assert offsets(b.get(TP, 3, None, None)) == [3, 4]  # the other worker finds both puts
    assert offsets(b.get(TP, 1, None, None))[:2] == [1, 2]
