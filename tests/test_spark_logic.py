"""The pure rules of the Spark jobs (no Spark, no servers): audit's index analysis,
vacuum's deletion rule, backfill's resume rule, export's range plan, the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from app.storage.idempotency import IDEMPOTENCY_FIELD, IDEMPOTENCY_WINDOW
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Compaction, Control, IndexEntry, Pending
from jobs.spark import cli
from jobs.spark.backfill_appends import chunk_key, resume_decision
from jobs.spark.export import plan_ranges
from jobs.spark.findings import CORRUPTION, INFO
from jobs.spark.index_analysis import analyse
from jobs.spark.listing import listing_units
from jobs.spark.runner import parse_duration_ms
from jobs.spark.snapshot import IndexRow, PartitionSnapshot
from jobs.spark.vacuum import decide

TP = TopicPartition("orders", 3)
LAYOUT = KeyLayout("llog", "bucket")
NOW = 10_000_000


def _wal(end: int, n: int, key: str = "s3://bucket/llog/wal-shared/b1", **kw: Any) -> IndexRow:
    entry = IndexEntry(type="WAL", msg_count=n, data_key=key, byte_offset=8 + end,
                       byte_length=4 + 5 * n, **kw)
    return IndexRow(LAYOUT.index(TP, end), end, entry, 1)


def _compacted(end: int, n: int) -> IndexRow:
    entry = IndexEntry(type="COMPACTED", msg_count=n,
                       data_key="s3://bucket/llog/orders/partitions/3/data/compacted/c1")
    return IndexRow(LAYOUT.index(TP, end), end, entry, 1)


def _snap(hw: int, rows: list[IndexRow], *, pending: Pending | None = None, cursor: int = 1,
          compaction: Compaction | None = None, log_start: int | None = None
          ) -> PartitionSnapshot:
    control = Control("OPEN", hw, pending, log_start_offset=log_start)
    return PartitionSnapshot(TP, control=control, control_present=True, cursor=cursor,
                             cursor_present=True, compaction=compaction, index=rows)


def _kinds(snap: PartitionSnapshot, stale_after_ms: int = 600_000) -> list[tuple[Any, ...]]:
    return sorted((f.kind, f.severity, f.first_offset, f.last_offset)
                  for f in analyse(snap, NOW, stale_after_ms).findings)


def test_a_tiled_index_with_pending_is_clean() -> None:
    pending = Pending("p1", 7, 9, 3, "s3://bucket/llog/wal-shared/b2", created_at_ms=NOW)
    assert _kinds(_snap(9, [_wal(3, 3), _wal(6, 3)], pending=pending)) == []


def test_gaps_overlaps_and_entries_beyond_the_head_are_corruption() -> None:
    rows = [_wal(3, 3), _wal(5, 3), _wal(9, 2), _wal(12, 1)]
    assert _kinds(_snap(10, rows)) == [
        ("beyond_high_watermark", CORRUPTION, 12, 12),
        ("gap", CORRUPTION, 6, 7),
        ("gap", CORRUPTION, 10, 10),
        ("overlap", CORRUPTION, 3, 3),
    ]


def test_an_entry_appended_during_the_scan_is_not_beyond_the_head() -> None:
    snap = _snap(6, [_wal(3, 3), _wal(6, 3), _wal(8, 2)])
    snap.control_after = Control("OPEN", 8, None)
    assert _kinds(snap) == []


def test_strays_inside_compacted_ranges_are_warnings() -> None:
    compaction = Compaction("c", "DELETING_OLD", 11, 20, 10, "s3://bucket/x", 16,
                            created_at_ms=NOW)
    rows = [_wal(4, 2), _compacted(10, 10), _wal(15, 5), _compacted(20, 10), _wal(22, 2)]
    analysis = analyse(_snap(22, rows, cursor=11, compaction=compaction), NOW, 600_000)
    strays = [(f.last_offset, f.message) for f in analysis.findings if f.kind == "stray"]
    assert strays == [(4, "WAL entry is a stray: below the compaction cursor"),
                      (15, "WAL entry is a stray: left by the compaction in flight "
                           "(DELETING_OLD)")]
    assert [r.end for r in analysis.deletable_strays] == [4]
    assert not [f for f in analysis.findings if f.severity == CORRUPTION]


def test_a_wal_entry_below_the_cursor_and_uncompacted_breaks_invariant_4() -> None:
    assert ("wal_below_cursor", CORRUPTION, 1, 3) in _kinds(_snap(6, [_wal(3, 3), _wal(6, 3)],
                                                               cursor=4))


def test_stale_pending_and_compaction_records_are_reported_with_age() -> None:
    pending = Pending("p1", 4, 4, 1, "s3://bucket/k", created_at_ms=NOW - 700_000)
    compaction = Compaction("c", "WRITING_COMPACTED_INDEX", 1, 3, 3, "s3://bucket/c", 3,
                            created_at_ms=NOW - 900_000)
    found = analyse(_snap(4, [_wal(3, 3)], pending=pending, compaction=compaction), NOW,
                    600_000).findings
    ages = {f.kind: (f.severity, f.age_ms) for f in found}
    assert ages == {"stale_pending": ("info", 700_000),
                    "stale_compaction": ("warning", 900_000)}


def test_a_materialised_pending_is_not_counted_twice() -> None:
    pending = Pending("p1", 4, 6, 3, "s3://bucket/llog/wal-shared/b1")
    rows = [_wal(3, 3), _wal(6, 3, append_id="p1")]
    assert _kinds(_snap(6, rows, pending=pending)) == []
    rows = [_wal(3, 3), _wal(6, 3, append_id="other")]
    assert ("overlap", CORRUPTION, 4, 6) in _kinds(_snap(6, rows, pending=pending))


def test_entries_below_the_log_start_are_trimmable_not_gaps() -> None:
    # Log start 8: entries ending at 3 and 6 are trimmable, the one holding 7..9
    # straddles it, and a hole below the log start (4 is missing) is no gap.
    rows = [_wal(2, 2), _wal(6, 2), _wal(9, 3), _wal(12, 3)]
    snap = _snap(12, rows, log_start=8, cursor=7)
    analysis = analyse(snap, NOW, 600_000)
    assert sorted((f.kind, f.severity, f.first_offset, f.last_offset)
                  for f in analysis.findings) == [("below_log_start", INFO, 1, 6)]
    assert [r.end for r in analysis.trimmable] == [2, 6]
    assert sorted((u.kind, u.last) for u in analysis.uses) == [
        ("index", 9), ("index", 12), ("trimmable", 2), ("trimmable", 6)]
    # From the log start on, coverage is checked as before.
    assert ("gap", CORRUPTION, 10, 12) in _kinds(_snap(12, rows[:3], log_start=8, cursor=7))
    # A WAL entry wholly below the log start and the cursor is not invariant 4's.
    assert _kinds(_snap(12, rows, log_start=8, cursor=7)) == [
        ("below_log_start", INFO, 1, 6)]


def test_a_log_emptied_by_retention_needs_no_coverage() -> None:
    pending = Pending("p1", 10, 12, 3, "s3://bucket/llog/wal-shared/b2", created_at_ms=NOW)
    assert _kinds(_snap(12, [_wal(9, 3)], pending=pending, log_start=13, cursor=13)) == [
        ("below_log_start", INFO, 7, 9)]
    assert ("log_start_beyond_head", CORRUPTION, None, None) in _kinds(
        _snap(12, [], pending=pending, log_start=14))


def test_partitions_with_data_must_be_in_the_catalog() -> None:
    from jobs.spark.catalog_checks import catalog_finding

    data = _snap(6, [_wal(6, 6)])
    assert catalog_finding(data, 4) is None  # partition 3 of 4
    for count in (0, 3):
        found = catalog_finding(data, count)
        assert found is not None
        assert (found.kind, found.severity, found.first_offset, found.last_offset) == (
            "uncatalogued_partition", CORRUPTION, 1, 6)
    # A deleted topic's partition: an empty log and its control record.
    emptied = catalog_finding(_snap(6, [], log_start=7), 0)
    assert emptied is not None
    assert (emptied.kind, emptied.severity) == ("uncatalogued_empty_partition", INFO)
    # Index keys without a control record are data too; no keys at all are not.
    orphaned = PartitionSnapshot(TP, index=[_wal(3, 3)])
    assert catalog_finding(orphaned, 0) is not None
    assert catalog_finding(PartitionSnapshot(TP), 0) is None


@pytest.mark.parametrize(
    ("referenced", "complete", "modified", "delete", "reason"),
    [
        (True, True, 0, False, "referenced"),
        (False, False, 0, False, "reference_scan_incomplete"),
        (False, True, 100_000, False, "created_after_scan_start"),
        (False, True, 100_500, False, "created_after_scan_start"),
        (False, True, 100_000 - 60_000, False, "younger_than_retry_horizon"),
        (False, True, 100_000 - 61_000, False, "younger_than_retry_horizon"),  # 1 s slack
        (False, True, 100_000 - 61_001, True, "orphan_older_than_retry_horizon"),
    ],
)
def test_vacuum_rule(referenced: bool, complete: bool, modified: int, delete: bool,
                     reason: str) -> None:
    assert decide(referenced=referenced, complete=complete, last_modified_ms=modified,
                  scan_started_ms=100_000, retry_horizon_ms=60_000) == (delete, reason)


def _control(keys: dict[str, list[Any]]) -> Control:
    return Control("OPEN", 0, None, extra={IDEMPOTENCY_FIELD: keys})


def test_resume_rule() -> None:
    key = chunk_key("job", 7)
    assert resume_decision(None, key, 0) == ("not_committed", None)
    assert resume_decision(_control({key: [11, 20, "s3://b/k"]}), key, 10) == (
        "committed", (11, 20))
    few = {f"other/{i}": [i * 10 + 1, i * 10 + 10, "k"] for i in range(10)}
    assert resume_decision(_control(few), key, 0) == ("not_committed", None)
    # A full window whose oldest entry starts after the bound may have forgotten our key.
    full = {f"other/{i}": [1000 + i * 10, 1009 + i * 10, "k"]
            for i in range(IDEMPOTENCY_WINDOW)}
    assert resume_decision(_control(full), key, 500) == ("ambiguous", None)
    assert resume_decision(_control(full), key, 1000) == ("not_committed", None)


def test_export_ranges() -> None:
    assert plan_ranges([("t", 1, 1, 0), ("t", 0, 1, 25)], 1, None, 10) == [
        ("t", 0, 1, 10), ("t", 0, 11, 20), ("t", 0, 21, 25)]
    assert plan_ranges([("t", 0, 1, 25)], 5, 12, 100) == [("t", 0, 5, 12)]
    # Nothing below the log start; a log emptied by retention has no range at all.
    assert plan_ranges([("t", 0, 8, 25), ("t", 1, 26, 25)], 1, 12, 100) == [
        ("t", 0, 8, 12)]


def test_listing_units_cover_wal_shared_and_each_data_prefix() -> None:
    units = listing_units(LAYOUT, [TP], 16)
    assert [u.prefix for u in units[:2]] == ["llog/wal-shared/0", "llog/wal-shared/1"]
    assert units[-1].prefix == "llog/orders/partitions/3/data/"
    assert len(listing_units(LAYOUT, [], 256)) == 256
    assert [u.prefix for u in listing_units(LAYOUT, [], 1)] == ["llog/wal-shared/"]


def test_partition_keys_and_durations() -> None:
    assert LAYOUT.parse_partition_key("llog/orders/partitions/3/index/" + "0" * 20) == TP
    assert LAYOUT.parse_partition_key("llog/orders/partitions/03/meta/control") is None
    assert LAYOUT.parse_partition_key("llog/orders/partitions/3/data/x") is None
    assert parse_duration_ms("1h") == 3_600_000
    assert parse_duration_ms("90") == 90_000
    assert parse_duration_ms("250ms") == 250
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration_ms("soon")


def test_cli_dispatch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    assert "backfill" in capsys.readouterr().out
    assert cli.main(["compact"]) == 2
    if cli.spark_available():
        assert cli.main(["audit", "--help"]) == 0
        assert "--deep" in capsys.readouterr().out
        assert cli.main(["vacuum", "--report", str(tmp_path), "--retry-horizon", "x"]) == 2


def test_records_this_release_does_not_fully_understand_have_problems() -> None:
    from jobs.spark.record_checks import index_entry_problems, pending_problems

    good = IndexEntry(type="WAL", msg_count=2, data_key="s3://bucket/llog/wal-shared/b1",
                      byte_offset=8, byte_length=10)
    assert index_entry_problems(good) == []
    assert index_entry_problems(IndexEntry.from_dict(
        {**good.to_dict(), "codec": "zstd", "raw_length": 90})) == []
    for change, words in [
        ({"encoding": "bytes-batch-v9"}, "bytes-batch-v9"),
        ({"type": "SNAPSHOT"}, "SNAPSHOT"),
        ({"data_key": "llog/wal-shared/b1"}, "data_key"),
        ({"byte_offset": "8"}, "byte_offset"),
        ({"msg_count": 2.5}, "msg_count"),
        ({"crc32c": 2**32}, "crc32c"),
        ({"codec": "lz5"}, "lz5"),
        ({"raw_length": "9"}, "raw_length"),
    ]:
        entry = IndexEntry.from_dict({**good.to_dict(), **change})
        assert any(words in p for p in index_entry_problems(entry)), change
    pending = Pending("p1", 4, 6, 3, "s3://bucket/k", entry_type="COMPACTED")  # type: ignore[arg-type]
    assert pending_problems(pending) == ["entry_type 'COMPACTED' is not 'WAL'"]


def test_a_control_record_with_a_log_start_this_release_cannot_use_has_problems() -> None:
    from jobs.spark.record_checks import control_problems

    assert control_problems(Control("OPEN", 9, None, log_start_offset=4, appended_bytes=90,
                                    log_start_bytes=30)) == []
    for change, words in [({"log_start_offset": "4"}, "log_start_offset"),
                          ({"log_start_offset": 0}, "log_start_offset"),
                          ({"appended_bytes": 1.5}, "appended_bytes")]:
        control = Control.from_dict({"log_state": "OPEN", "sequence_counter": 9,
                                     "pending": None, **change})
        assert any(words in p for p in control_problems(control)), change
