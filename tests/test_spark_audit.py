"""The audit Spark job against real Oxia and MinIO (local[2]): the index, objects and
orphans, retention, the topic catalog and every encoding."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import Control, IndexEntry
from app.storage.retention import move_log_start, trim_index
from app.storage.topic_admin import TopicAdmin
from app.storage.topic_catalog import PARTITION_KEY, TopicCatalog
from app.storage.topic_deletion import TopicDeleter
from tests.helpers.compaction import make_compactor, set_topic_compression
from tests.helpers.spark_records import compact_entries, sample_records
from tests.helpers.spark_support import (
    SPARK_TESTS,
    UNREADABLE,
    Engine,
    append,
    compact,
    crash_after_commit,
    index_rows,
    read_summary,
    recreate_stray,
    run,
    stack_json,
    stack_settings,
    table,
    unique_root,
    unreadable_metadata,
)
from tests.helpers.stored_slices import compress_slice

pytestmark = SPARK_TESTS


def _audit(spark: Any, settings: Any, report: Path, **options: Any) -> Any:
    from jobs.spark.audit import AuditOptions, run_audit
    from jobs.spark.report import Report

    return run_audit(spark, settings, AuditOptions(**options), Report(report))


def _rec(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def test_clean_store_passes_and_strays_are_not_corruption(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    a, b, c = (TopicPartition(topic, p) for p in range(3))

    async def build(e: Engine) -> dict[str, Any]:
        # Shared blobs holding several partitions, then single-partition appends of `a`.
        for i in range(3):
            await append(e, [(a, _rec(f"a{i}", 3)), (b, _rec(f"b{i}", 2)), (c, _rec(f"c{i}", 1))])
        solo = [(await append(e, [(a, _rec(f"a-solo{i}", 2))]))[0] for i in range(3)]
        await crash_after_commit(e, c, _rec("c-pending", 2))  # pending only, fresh
        # Compact a's offsets 1..15 and let a delayed create re-make one WAL entry in it.
        rows = {end: entry for end, entry, _ in await index_rows(e, a)}
        stray_end = solo[1].end_offset
        await compact(e, a, solo[2].end_offset)
        await recreate_stray(e, a, stray_end, rows[stray_end])
        return {
            "stray_end": stray_end,
            "orphans": {e.layout.parse_uri(solo[i].wal_uri)[1] for i in (0, 2)},
        }

    built = run(settings, build)
    outcome = _audit(spark, settings, tmp_path / "deep", deep=True)
    summary = read_summary(tmp_path / "deep")
    assert outcome.exit_code == 0, summary
    assert summary["status"] == "ok"
    assert summary["findings_by_severity"]["corruption"] == 0
    assert summary["partitions"] == 3
    assert summary["records"] == 15 + 6 + 5
    assert summary["records_verified"] >= 15 + 6 + 5
    findings = table(tmp_path / "deep", "findings")
    strays = [f for f in findings if f["kind"] == "stray"]
    assert [(f["topic"], f["partition"], f["last_offset"]) for f in strays] == [
        (topic, 0, built["stray_end"])]
    assert "below the compaction cursor" in strays[0]["message"]
    # The compaction left the blobs of a's own appends unreferenced, except the one the
    # stray still points at (strays count as references).
    orphans = table(tmp_path / "deep", "orphans")
    assert {o["key"] for o in orphans} == built["orphans"]
    assert all(o["age_ms"] >= 0 and o["size"] > 0 for o in orphans)
    parts = {r["partition"]: r for r in table(tmp_path / "deep", "partitions")}
    assert parts[0]["strays"] == 1 and parts[0]["cursor"] == 16
    assert parts[2]["pending_materialised"] is False

    # --delete-strays removes the stray (conditionally); the next audit sees none.
    _audit(spark, settings, tmp_path / "fix", delete_strays=True)
    fixed = table(tmp_path / "fix", "findings")
    assert sorted(f["kind"] for f in fixed if f["kind"].startswith("stray")) == [
        "stray", "stray_deleted"]
    again = _audit(spark, settings, tmp_path / "again")
    assert again.exit_code == 0
    assert again.summary["strays"] == 0
    assert again.summary["orphans"]["count"] == 3  # the stray's blob is an orphan now


def test_audit_finds_each_injected_fault(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path, s3_client: Any) -> None:
    settings = stack_settings(stack)
    bucket = settings.s3_bucket
    tps = [TopicPartition(topic, p) for p in range(6)]
    missing, truncated, gap, stale, flipped, clean = tps

    async def build(e: Engine) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for tp in tps:
            if tp != stale:
                out[tp.partition] = [
                    (await append(e, [(tp, _rec(f"{tp.partition}-{i}", 4))]))[0]
                    for i in range(3)]
        await append(e, [(stale, _rec("s", 2))])
        # A writer that died two hours ago, right after its commit.
        await crash_after_commit(e, stale, _rec("s-late", 2))
        record = await e.oxia.get(e.layout.control(stale), stale.partition_key)
        control = Control.from_json(record.value)
        assert control.pending is not None
        control.pending.created_at_ms -= 2 * 3_600_000
        await e.oxia.put(e.layout.control(stale), control.to_json(), stale.partition_key,
                         expected_version=record.version_id)
        # An index gap: the middle append's entry disappears.
        await e.oxia.delete(e.layout.index(gap, 8), gap.partition_key)
        return out

    appended = run(settings, build)

    def key(res: Any) -> str:
        return str(res.wal_uri.split("/", 3)[3])

    # A deleted object, a truncated object, a flipped byte (same size: only --deep sees it).
    s3_client.delete_object(Bucket=bucket, Key=key(appended[missing.partition][1]))
    t_key = key(appended[truncated.partition][2])
    body = s3_client.get_object(Bucket=bucket, Key=t_key)["Body"].read()
    s3_client.put_object(Bucket=bucket, Key=t_key, Body=body[:-5])
    f_key = key(appended[flipped.partition][0])
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=f_key)["Body"].read())
    body[-1] ^= 0x01
    s3_client.put_object(Bucket=bucket, Key=f_key, Body=bytes(body))
    # Orphans: in wal-shared/ and in a partition's data/.
    root = settings.root_prefix
    orphan_keys = {f"{root}/wal-shared/{uuid.uuid4().hex}",
                   f"{root}/{topic}/partitions/5/data/compacted/{uuid.uuid4().hex}"}
    for k in orphan_keys:
        s3_client.put_object(Bucket=bucket, Key=k, Body=b"orphan bytes")

    outcome = _audit(spark, settings, tmp_path / "plain")
    assert outcome.exit_code == 1
    assert outcome.summary["status"] == "corruption"
    findings = table(tmp_path / "plain", "findings")
    bad = {(f["partition"], f["kind"], f["first_offset"], f["last_offset"])
           for f in findings if f["severity"] == "corruption"}
    assert bad == {
        (missing.partition, "missing_object", 5, 8),
        (truncated.partition, "slice_out_of_bounds", 9, 12),
        (gap.partition, "gap", 5, 8),
    }
    stale_rows = [f for f in findings if f["kind"] == "stale_pending"]
    assert [(f["partition"], f["first_offset"], f["last_offset"]) for f in stale_rows] == [
        (stale.partition, 3, 4)]
    assert stale_rows[0]["age_ms"] >= 2 * 3_600_000
    assert stale_rows[0]["severity"] == "info"
    orphans = {o["key"]: o for o in table(tmp_path / "plain", "orphans")}
    # The blob only the deleted index entry referenced is an orphan too.
    gap_blob = key(appended[gap.partition][1])
    assert set(orphans) == orphan_keys | {gap_blob}
    assert all(o["size"] == len(b"orphan bytes") for k, o in orphans.items() if k != gap_blob)
    assert outcome.summary["orphans"]["count"] == 3

    deep = _audit(spark, settings, tmp_path / "deep", deep=True)
    deep_bad = {(f["partition"], f["kind"])
                for f in table(tmp_path / "deep", "findings") if f["severity"] == "corruption"}
    assert (flipped.partition, "corrupt_data") in deep_bad
    assert not any(p == clean.partition for p, _ in deep_bad)
    assert deep.summary["partitions_with_corruption"] == 4


def test_metadata_this_release_cannot_read_is_corruption(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    broken = {how: TopicPartition(topic, p) for p, how in enumerate(UNREADABLE)}
    clean = TopicPartition(topic, len(UNREADABLE))

    async def build(e: Engine) -> None:
        for tp in [*broken.values(), clean]:
            for i in range(2):
                await append(e, [(tp, _rec(f"{tp.partition}-{i}", 2))])
        for how, tp in broken.items():
            await unreadable_metadata(e, tp, how)

    run(settings, build)
    outcome = _audit(spark, settings, tmp_path / "r")
    assert outcome.exit_code == 1, outcome.summary
    found = {(f["partition"], f["kind"]): f["message"]
             for f in table(tmp_path / "r", "findings") if f["severity"] == "corruption"}
    expected = {(tp.partition, "bad_control" if how.startswith("pending") else
                 "bad_index_entry") for how, tp in broken.items()}
    assert expected <= set(found)
    assert not [k for k in found if k[0] == clean.partition]
    assert "bytes-batch-v9" in found[(broken["index_newer_encoding"].partition,
                                      "bad_index_entry")]
    assert "bytes-batch-v9" in found[(broken["pending_newer_encoding"].partition,
                                      "bad_control")]
    assert outcome.summary["partitions_with_corruption"] == len(broken)


def test_cli_runs_a_job_with_an_llog_dev_stack_json(stack: LocalStack, spark: Any,
                                                    tmp_path: Path) -> None:
    from jobs.spark.cli import main

    code = main(["audit", "--report", str(tmp_path / "r"), "--stack-json",
                 str(stack_json(stack, tmp_path / "stack.json")), "--root-prefix", unique_root(),
                 "--progress-interval", "0", "--metrics-file", str(tmp_path / "audit.prom")])
    assert code == 0
    summary = read_summary(tmp_path / "r")
    assert (summary["status"], summary["partitions"], summary["objects_listed"]) == ("ok", 0, 0)
    assert set(summary["tables"]) == {"objects", "findings", "partitions", "references",
                                      "orphans"}
    # The outcome for node_exporter's textfile collector, which the alert rules read.
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families((tmp_path / "audit.prom").read_text())
               for s in f.samples}
    assert samples[("llog_job_exit_code", (("job_name", "audit"),))] == 0
    assert samples[("llog_audit_findings", (("finding_severity", "corruption"),))] == 0
    assert samples[("llog_job_last_run_timestamp_seconds", (("job_name", "audit"),))] == \
        summary["finished_ms"] / 1000


def test_retention_and_the_topic_catalog(stack: LocalStack, spark: Any, topic: str,
                                         tmp_path: Path, s3_client: Any) -> None:
    settings = stack_settings(stack)
    kept, gapped, trimmed = (TopicPartition(topic, p) for p in range(3))
    gone, short, wide = (f"{topic}-{n}" for n in ("gone", "short", "wide"))

    async def build(e: Engine) -> dict[str, Any]:
        results = {}
        for tp in (kept, gapped, trimmed):  # five appends of three: 1..3, ..., 13..15
            results[tp] = [(await append(e, [(tp, _rec(f"{tp.partition}-{i}", 3))]))[0]
                           for i in range(5)]
        # kept: the log start inside the third append (7..9), nothing trimmed yet.
        await move_log_start(e.oxia, e.layout, kept, 8, None)
        # gapped: a partial trim below the log start, and an entry lost above it.
        await move_log_start(e.oxia, e.layout, gapped, 7, None)
        for end in (3, 12):
            await e.oxia.delete(e.layout.index(gapped, end), gapped.partition_key)
        # trimmed: retention applied as compaction does (the log start, then the trim).
        await move_log_start(e.oxia, e.layout, trimmed, 10, None)
        control = await e.reader.read_control(trimmed)
        assert control is not None
        assert await trim_index(e.oxia, e.layout, trimmed, control)
        # Topics: one deleted, one whose catalog count is short of its data, one with
        # more partitions than data, and a catalog record that does not parse.
        catalog = TopicCatalog(e.oxia, e.layout)
        gone_blob = (await append(e, [(TopicPartition(gone, 0), _rec(gone, 2))]))[0]
        for p in range(3):
            await append(e, [(TopicPartition(short, p), _rec(short, 2))])
        await TopicDeleter(TopicAdmin(e.oxia, e.layout, e.reader, catalog),
                               by="test").delete_here(gone)
        registered = await catalog.get(short)
        assert registered is not None and registered.partitions == 3
        shrunk = dataclasses.replace(registered, partitions=1)
        await e.oxia.put(e.layout.topic_record(short), shrunk.to_json(), PARTITION_KEY)
        await catalog.create(wide, 4)
        await append(e, [(TopicPartition(wide, 0), _rec("w", 2))])
        await e.oxia.put(e.layout.topic_record("broken"), b"{not json", PARTITION_KEY)
        def blob(result: Any) -> str:
            return str(e.layout.parse_uri(result.wal_uri)[1])

        return {
            # The blob of an entry wholly below kept's log start goes missing.
            "lost": blob(results[kept][0]),
            # Unreferenced: trimmed's entries below its log start, gapped's two deleted
            # entries, the deleted topic's append.
            "orphans": {blob(r) for r in results[trimmed][:3]} | {
                blob(results[gapped][0]), blob(results[gapped][3]), blob(gone_blob)},
        }

    built = run(settings, build)
    lost = built["lost"]
    s3_client.delete_object(Bucket=settings.s3_bucket, Key=lost)
    outcome = _audit(spark, settings, tmp_path / "r")
    assert outcome.exit_code == 1, outcome.summary
    findings = table(tmp_path / "r", "findings")
    assert {(f["topic"], f["partition"], f["kind"], f["first_offset"], f["last_offset"])
            for f in findings if f["severity"] == "corruption"} == {
        (topic, gapped.partition, "gap", 10, 12),
        (short, 1, "uncatalogued_partition", 1, 2),
        (short, 2, "uncatalogued_partition", 1, 2),
        ("broken", None, "bad_topic_record", None, None),
    }
    others = {(f["topic"], f["partition"], f["kind"]): f for f in findings
              if f["severity"] != "corruption"}
    assert set(others) == {
        (topic, kept.partition, "below_log_start"),
        (topic, kept.partition, "trimmable_object_missing"),
        (topic, gapped.partition, "below_log_start"),
        (gone, 0, "uncatalogued_empty_partition"),
    }
    below = others[(topic, kept.partition, "below_log_start")]
    assert (below["severity"], below["first_offset"], below["last_offset"]) == ("info", 1, 6)
    assert others[(topic, kept.partition, "trimmable_object_missing")]["severity"] == "warning"
    parts = {(p["topic"], p["partition"]): p for p in table(tmp_path / "r", "partitions")}
    assert [(parts[(topic, p)]["log_start"], parts[(topic, p)]["trimmable"])
            for p in range(3)] == [(8, 2), (7, 1), (10, 0)]
    assert [parts[(short, p)]["catalogued"] for p in range(3)] == [True, False, False]
    summary = outcome.summary
    assert (summary["trimmable_entries"], summary["partitions_uncatalogued"]) == (3, 3)
    assert summary["catalog"] == {"topics": 3, "partitions": 3 + 1 + 4, "bad_records": 1}
    assert {o["key"] for o in table(tmp_path / "r", "orphans")} == built["orphans"]


def test_deep_audit_decodes_every_encoding(stack: LocalStack, spark: Any, topic: str,
                                           tmp_path: Path) -> None:
    settings = stack_settings(stack)
    tp, plain = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def build(e: Engine) -> None:
        # One blob per flush holds tp's body (v3 or v2 in turn) beside plain's (v3).
        for i in range(8):
            records = sample_records(f"r{i}", 4) if i % 2 else _rec(f"p{i}", 3)
            await append(e, [(tp, records), (plain, _rec(f"q{i}", 2))])
        await compact_entries(e, tp, 4)  # a v2 compacted body, in chunks
        await compact_entries(e, plain, 4)  # no headers: bytes-batch-v3-chunked

    run(settings, build)
    rows = run(settings, lambda e: index_rows(e, tp))
    assert {(entry.type, entry.encoding) for _, entry, _ in rows} == {
        ("COMPACTED", "bytes-batch-v2"), ("WAL", "bytes-batch-v3"), ("WAL", "bytes-batch-v2")}
    assert {(entry.type, entry.encoding) for _, entry, _ in run(
        settings, lambda e: index_rows(e, plain))} == {
        ("COMPACTED", "bytes-batch-v3-chunked"), ("WAL", "bytes-batch-v3")}
    clean = _audit(spark, settings, tmp_path / "clean", deep=True)
    assert clean.exit_code == 0, clean.summary
    assert clean.summary["records_verified"] == clean.summary["records"] == 12 + 16 + 16

    # v3 bodies whose entries say bytes-batch-v2: the CRC still matches, so only
    # decoding each body by its entry's encoding tells.
    async def mislabel(e: Engine) -> list[int]:
        changed = []
        for end, entry, version in rows:
            if entry.encoding == "bytes-batch-v3" and len(changed) < 2:
                wrong = dataclasses.replace(entry, encoding="bytes-batch-v2",
                                            extra=dict(entry.extra))
                await e.oxia.put(e.layout.index(tp, end), wrong.to_json(), tp.partition_key,
                                 expected_version=version)
                changed.append(end)
        return changed

    changed = run(settings, mislabel)
    assert len(changed) == 2
    shallow = _audit(spark, settings, tmp_path / "shallow")
    assert shallow.exit_code == 0, shallow.summary
    deep = _audit(spark, settings, tmp_path / "deep", deep=True)
    assert deep.exit_code == 1
    bad = table(tmp_path / "deep", "findings")
    assert sorted((f["partition"], f["kind"], f["last_offset"]) for f in bad
                  if f["severity"] == "corruption") == [(0, "corrupt_data", e) for e in changed]


def _events(tag: str, n: int) -> list[bytes]:
    """JSON events: records that compress."""
    return [json.dumps({"tag": tag, "seq": i, "path": "/api/v1/orders", "status": 200,
                        "agent": "Mozilla/5.0 (X11; Linux x86_64)"}).encode()
            for i in range(n)]


def test_deep_audit_passes_on_a_store_of_raw_and_compressed_objects(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    """Raw and zstd WAL slices, raw and zstd compacted objects, in one store."""
    settings = stack_settings(stack)
    plain, packed = TopicPartition(f"{topic}-raw", 0), TopicPartition(f"{topic}-zstd", 0)

    async def build(e: Engine) -> None:
        await set_topic_compression(e, packed.topic, "zstd")
        for i in range(9):
            await append(e, [(plain, _events(f"p{i}", 20)), (packed, _events(f"z{i}", 20))])
        # Compressed slices inside the range compaction reads, and after it; the last
        # append (whose pending record still names its raw slice) stays as written.
        for end in (40, 60, 140, 160):
            await compress_slice(e, packed, end)
        for tp in (plain, packed):
            compactor = make_compactor(e, min_entry_age_ms=0, max_entries=4, chunk_bytes=512)
            assert (await compactor.compact_once(tp)).action == "compacted"

    run(settings, build)
    stored = {tp: {(entry.type, entry.codec) for _, entry, _ in run(
        settings, lambda e, tp=tp: index_rows(e, tp))} for tp in (plain, packed)}
    assert stored == {plain: {("COMPACTED", None), ("WAL", None)},
                      packed: {("COMPACTED", "zstd"), ("WAL", "zstd"), ("WAL", None)}}
    clean = _audit(spark, settings, tmp_path / "clean", deep=True)
    assert clean.exit_code == 0, clean.summary
    assert clean.summary["records_verified"] == clean.summary["records"] == 2 * 9 * 20

    # A compressed slice whose entry no longer says so (as a release before compression
    # would write it) is corruption, never records.
    async def strip_codec(e: Engine) -> None:
        key = e.layout.index(packed, 160)
        found = await e.oxia.get(key, packed.partition_key)
        assert found is not None
        entry = IndexEntry.from_json(found.value)
        await e.oxia.put(key, dataclasses.replace(entry, codec=None, raw_length=None,
                                                  extra=dict(entry.extra)).to_json(),
                         packed.partition_key, expected_version=found.version_id)

    run(settings, strip_codec)
    deep = _audit(spark, settings, tmp_path / "deep", deep=True)
    assert deep.exit_code == 1
    bad = table(tmp_path / "deep", "findings")
    assert [(f["topic"], f["kind"], f["last_offset"]) for f in bad
            if f["severity"] == "corruption"] == [(packed.topic, "corrupt_data", 160)]
