"""The file tail cache's parts that hold state of their own, each alone: the indexes
of partition directories (app/tailcache/partition_index.py) and the byte budget one
process keeps (app/tailcache/segment_budget.py). The cache as a whole, shared by
processes, is tests/test_tailcache.py."""

from __future__ import annotations

import os
from pathlib import Path

from app.storage.keys import TopicPartition
from app.tailcache.partition_index import PartitionIndex, PartitionIndexes
from app.tailcache.segment import segment_name
from app.tailcache.segment_budget import SegmentBudget
from app.tailcache.segment_files import partition_dir

TP, TP1, TP2 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


def _touch(root: Path, tp: TopicPartition, start: int, end: int) -> None:
    directory = partition_dir(str(root), tp)
    os.makedirs(directory, exist_ok=True)
    Path(directory, segment_name(start, end)).write_bytes(b"")


def test_an_index_is_listed_once_and_the_least_recently_used_forgotten(
        tmp_path: Path) -> None:
    _touch(tmp_path, TP, 1, 3)
    _touch(tmp_path, TP, 4, 9)
    indexes = PartitionIndexes(str(tmp_path), max_partitions=2)
    assert indexes(TP).segments == [(1, 3), (4, 9)]
    assert indexes(TP).find(5) == (4, 9) and indexes(TP).find(10) is None
    _touch(tmp_path, TP, 10, 12)  # not listed again: the index is held
    assert indexes(TP).segments == [(1, 3), (4, 9)]
    indexes(TP1)
    indexes(TP)  # used most recently
    indexes(TP2)  # one too many: TP1 goes
    assert indexes.held(TP1) is None and indexes.held(TP) is not None
    indexes.forget(TP)
    assert indexes(TP).segments == [(1, 3), (4, 9), (10, 12)]  # listed afresh


def test_an_index_is_listed_again_when_its_directory_changed(tmp_path: Path) -> None:
    _touch(tmp_path, TP, 1, 3)
    indexes = PartitionIndexes(str(tmp_path), max_partitions=8)
    idx = indexes(TP)
    _touch(tmp_path, TP, 4, 6)  # another worker's segment
    assert indexes.relist_if_changed(TP, idx, 4)
    assert idx.find(4) == (4, 6)
    idx.listed_at_ns = os.stat(partition_dir(str(tmp_path), TP)).st_mtime_ns + 2 * 10**9
    assert not indexes.relist_if_changed(TP, idx, 7)  # settled and unchanged: one stat


def test_overlapping_segments_and_the_high_watermark() -> None:
    idx = PartitionIndex()
    for seg in [(1, 5), (3, 8), (9, 9), (12, 20)]:
        idx.add(seg)
    assert sorted(idx.overlapping(4, 9)) == [(1, 5), (3, 8), (9, 9)]
    assert idx.overlapping(10, 11) == []
    assert idx.records() == 5 + 6 + 1 + 9
    assert idx.raise_hw(20) and not idx.raise_hw(19) and idx.high_watermark == 20


def test_the_budget_evicts_own_oldest_writes_but_not_a_name_written_again() -> None:
    budget = SegmentBudget(1000, full_scan_interval_ns=10**12)
    for i in range(5):
        budget.wrote(f"p/{i}", TP, (i, i), 200)
    budget.wrote("p/0", TP, (0, 0), 100)  # the name written again: that copy stays
    assert budget.over and budget.estimate == 1100
    old = budget.own_oldest()
    assert [w.path for w in old] == ["p/1"]  # the first write of p/0 only counted off
    assert budget.estimate == 700 <= budget.target
    assert not budget.over


def test_a_scan_makes_the_budget_exact_and_keeps_only_writes_still_on_disk() -> None:
    budget = SegmentBudget(1000, full_scan_interval_ns=10**12)
    assert budget.scan_due  # never scanned
    for i in range(4):
        budget.wrote(f"p/{i}", TP, (i, i), 300)
    budget.scanned(700, {TP: {(2, 2), (3, 3)}})  # another process evicted 0 and 1
    assert budget.estimate == 700 and not budget.scan_due
    budget.wrote("p/4", TP, (4, 4), 400)
    assert [w.path for w in budget.own_oldest()] == ["p/2", "p/3"]
    assert SegmentBudget(1000, full_scan_interval_ns=0).scan_due
