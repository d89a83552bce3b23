"""The vacuum Spark job against real Oxia and MinIO (local[2])."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.retention import move_log_start, trim_index
from jobs.spark.vacuum import TIMESTAMP_SLACK_MS
from tests.helpers.spark_records import read_back
from tests.helpers.spark_support import (
    SPARK_TESTS,
    Engine,
    append,
    compact,
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

pytestmark = SPARK_TESTS

HORIZON_MS = 2000
# The test that tells young orphans from old ones runs its scans on a later S3 clock (the
# job's ``later``) instead of waiting for it: a horizon long enough that a young one is
# still young however long a loaded machine takes from its upload to the scan.
AGES_HORIZON_MS = 60_000


def _outgrown(anchored: int) -> int:
    """A scan start by which every object made before the anchor has outgrown
    HORIZON_MS: what waiting out the horizon would give, without the wait."""
    return anchored + HORIZON_MS + TIMESTAMP_SLACK_MS + 500


def _two(tag: str) -> list[bytes]:
    return [f"{tag}-0".encode(), f"{tag}-1".encode()]


def _listed_ms(s3_client: Any, bucket: str, key: str) -> int:
    """The object's LastModified as the vacuum's listing sees it (milliseconds)."""
    (found,) = s3_client.list_objects_v2(Bucket=bucket, Prefix=key)["Contents"]
    return int(found["LastModified"].timestamp() * 1000)


def _put_after(s3_client: Any, bucket: str, key: str, after_ms: int) -> int:
    """Put ``key`` with a LastModified later than ``after_ms``; that LastModified."""
    with_deadline = time.monotonic() + 30
    while True:
        s3_client.put_object(Bucket=bucket, Key=key, Body=b"young orphan")
        made = _listed_ms(s3_client, bucket, key)
        if made > after_ms:
            return made
        assert time.monotonic() < with_deadline, "the S3 clock did not move"
        time.sleep(0.01)


def _keys(s3_client: Any, bucket: str, prefix: str) -> set[str]:
    out: set[str] = set()
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                   Prefix=prefix):
        out |= {o["Key"] for o in page.get("Contents", [])}
    return out


def test_vacuum_deletes_only_old_orphans(stack: LocalStack, spark: Any, topic: str,
                                         tmp_path: Path, s3_client: Any) -> None:
    from jobs.spark.audit import AuditOptions, run_audit
    from jobs.spark.report import Report
    from jobs.spark.vacuum import VacuumOptions, run_vacuum

    settings = stack_settings(stack)
    root, bucket = settings.root_prefix, settings.s3_bucket
    a, b, c = (TopicPartition(topic, p) for p in range(3))

    async def build(e: Engine) -> dict[str, Any]:
        key = lambda res: e.layout.parse_uri(res.wal_uri)[1]  # noqa: E731
        shared = await append(e, [(a, [b"a0", b"a1"]), (b, [b"b0"]), (c, [b"c0", b"c1"])])
        solo = [(await append(e, [(a, [f"a-{i}".encode()] * 2)]))[0] for i in range(3)]
        await append(e, [(c, [b"c2"])])
        # b's last append: referenced only by the pending record of meta/control.
        pending_only = (await append(e, [(b, [b"b1", b"b2"])]))[0]
        # a compacted up to its last solo append; a delayed create re-makes a stray.
        rows = {end: entry for end, entry, _ in await index_rows(e, a)}
        compacted_a = await compact(e, a, solo[2].end_offset)
        await recreate_stray(e, a, solo[1].end_offset, rows[solo[1].end_offset])
        # c's compaction died after recording its intent: only meta/compaction names it.
        compacted_c = await compact(e, c, 3, keep_record=True)
        return {
            "referenced": {key(shared[0]), key(solo[1]), key(pending_only), compacted_a,
                           compacted_c},
            "orphans": {key(solo[0]), key(solo[2])},
        }

    built = run(settings, build)
    old_orphans = {f"{root}/wal-shared/{uuid.uuid4().hex}",
                   f"{root}/{topic}/partitions/1/data/compacted/{uuid.uuid4().hex}"}
    for k in old_orphans:
        s3_client.put_object(Bucket=bucket, Key=k, Body=b"old orphan")
    expected = built["orphans"] | old_orphans
    newest_old = max(_listed_ms(s3_client, bucket, k) for k in old_orphans)
    young = f"{root}/wal-shared/{uuid.uuid4().hex}"
    made = _put_after(s3_client, bucket, young, newest_old)
    everything = _keys(s3_client, bucket, root + "/")
    assert built["referenced"] | expected | {young} <= everything

    # Scans as if they started just as the young orphan outgrows nothing: everything made
    # before it is older than the horizon, and it is not (its age is the bound itself).
    def just_young(made_ms: int) -> Any:
        return lambda anchored: made_ms + AGES_HORIZON_MS + TIMESTAMP_SLACK_MS

    options = VacuumOptions(retry_horizon_ms=AGES_HORIZON_MS, unsafe_short_horizon=True)
    dry = run_vacuum(spark, settings, options, Report(tmp_path / "dry"),
                     later=just_young(made))
    assert dry.exit_code == 0, dry.summary
    assert dry.summary["dry_run"] is True
    decisions = {d["key"]: d for d in table(tmp_path / "dry", "decisions")}
    assert {k for k, d in decisions.items() if d["action"] == "would_delete"} == expected
    assert decisions[young]["action"] == "kept"
    assert decisions[young]["reason"] == "younger_than_retry_horizon"
    for k in built["referenced"]:
        assert (decisions[k]["action"], decisions[k]["reason"]) == ("kept", "referenced")
    assert _keys(s3_client, bucket, root + "/") == everything  # nothing deleted

    # A later scan: the first young orphan has outgrown the horizon; a new one has not.
    expected |= {young}
    young = f"{root}/wal-shared/{uuid.uuid4().hex}"
    made = _put_after(s3_client, bucket, young, made)
    everything.add(young)
    applied = run_vacuum(spark, settings, VacuumOptions(
        retry_horizon_ms=AGES_HORIZON_MS, unsafe_short_horizon=True, apply=True),
        Report(tmp_path / "apply"), later=just_young(made))
    assert applied.exit_code == 0, applied.summary
    summary = read_summary(tmp_path / "apply")
    assert summary["deleted"]["count"] == len(expected)
    assert summary["reference_scan_complete"] is True
    decisions = {d["key"]: d for d in table(tmp_path / "apply", "decisions")}
    assert {k for k, d in decisions.items() if d["action"] == "deleted"} == expected
    assert decisions[young]["reason"] == "younger_than_retry_horizon"
    assert _keys(s3_client, bucket, root + "/") == everything - expected

    # Nothing any entry, pending record or compaction record names has gone.
    audit = run_audit(spark, settings, AuditOptions(deep=True), Report(tmp_path / "audit"))
    assert audit.exit_code == 0, audit.summary
    assert audit.summary["orphans"]["count"] == 1  # the young one


def test_vacuum_refuses_a_horizon_shorter_than_the_writers(stack: LocalStack, spark: Any,
                                                           tmp_path: Path) -> None:
    from jobs.spark.report import Report
    from jobs.spark.vacuum import VacuumOptions, run_vacuum

    settings = stack_settings(stack)  # LLOG_RETRY_HORIZON_MS: the default hour
    with pytest.raises(ValueError, match="unsafe-short-horizon"):
        run_vacuum(spark, settings, VacuumOptions(retry_horizon_ms=60_000),
                   Report(tmp_path / "r"))
    # Shorter than what the writers are configured with, though longer than any floor.
    settings = stack_settings(stack, retry_horizon_ms=3 * 3_600_000)
    with pytest.raises(ValueError, match="unsafe-short-horizon"):
        run_vacuum(spark, settings, VacuumOptions(retry_horizon_ms=2 * 3_600_000),
                   Report(tmp_path / "r2"))


def test_vacuum_takes_its_horizon_from_the_writers_setting(
        stack: LocalStack, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.spark.cli import main

    monkeypatch.setenv("LLOG_RETRY_HORIZON_MS", str(2 * 3_600_000))
    common = ["--stack-json", str(stack_json(stack, tmp_path / "stack.json")),
              "--root-prefix", unique_root(), "--progress-interval", "0"]
    assert main(["vacuum", "--report", str(tmp_path / "default"), *common]) == 0
    summary = read_summary(tmp_path / "default")
    assert summary["options"]["retry_horizon_ms"] is None  # not given: the setting's
    assert summary["retry_horizon_ms"] == 2 * 3_600_000

    assert main(["vacuum", "--report", str(tmp_path / "short"), "--retry-horizon", "1h",
                 *common]) == 2
    refused = read_summary(tmp_path / "short")
    assert refused["status"] == "failed"
    assert "--unsafe-short-horizon" in refused["error"]
    assert main(["vacuum", "--report", str(tmp_path / "long"), "--retry-horizon", "3h",
                 *common]) == 0
    assert read_summary(tmp_path / "long")["retry_horizon_ms"] == 3 * 3_600_000


@pytest.mark.parametrize("how", ["index_not_json", "index_newer_encoding",
                                 "pending_newer_encoding"])
def test_vacuum_deletes_nothing_while_metadata_does_not_parse(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path, s3_client: Any,
        how: str) -> None:
    from jobs.spark.report import Report
    from jobs.spark.vacuum import VacuumOptions, run_vacuum

    settings = stack_settings(stack)
    root, bucket = settings.root_prefix, settings.s3_bucket
    clean, bad = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def build(e: Engine) -> None:
        # The first and the last append of `bad` are the only names of their blobs: one
        # in its first index entry, one in the pending record of its meta/control.
        await append(e, [(bad, [b"first"])])
        for i in range(2):
            await append(e, [(clean, [b"c%d" % i]), (bad, [b"b%d" % i])])
        await append(e, [(bad, [b"last"])])
        await unreadable_metadata(e, bad, how)

    run(settings, build)
    orphans = {f"{root}/wal-shared/{uuid.uuid4().hex}",
               f"{root}/{topic}/partitions/1/data/compacted/{uuid.uuid4().hex}"}
    for k in orphans:
        s3_client.put_object(Bucket=bucket, Key=k, Body=b"orphan")
    everything = _keys(s3_client, bucket, root + "/")

    outcome = run_vacuum(spark, settings, VacuumOptions(
        retry_horizon_ms=HORIZON_MS, unsafe_short_horizon=True, apply=True),
        Report(tmp_path / "r"), later=_outgrown)  # the orphans have outgrown the horizon
    assert _keys(s3_client, bucket, root + "/") == everything  # nothing deleted
    assert outcome.exit_code == 3, outcome.summary
    summary = read_summary(tmp_path / "r")
    assert summary["status"] == "unreadable_metadata"
    assert summary["reference_scan_complete"] is False
    assert summary["deleted"]["count"] == 0
    named = summary["unreadable_partitions"]
    assert [(p["topic"], p["partition"]) for p in named] == [(topic, 1)]
    assert named[0]["errors"]
    decisions = {d["key"]: d for d in table(tmp_path / "r", "decisions")}
    assert {decisions[k]["reason"] for k in orphans} == {"reference_scan_incomplete"}
    partitions = {p["partition"]: p for p in table(tmp_path / "r", "partitions")}
    assert partitions[1]["errors"] and not partitions[0]["errors"]


def test_a_partition_that_lost_its_control_record_still_protects_its_objects(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path, s3_client: Any) -> None:
    from jobs.spark.report import Report
    from jobs.spark.vacuum import VacuumOptions, run_vacuum

    settings = stack_settings(stack)
    root, bucket = settings.root_prefix, settings.s3_bucket
    tp = TopicPartition(topic, 0)

    async def build(e: Engine) -> set[str]:
        results = [(await append(e, [(tp, [b"r%d" % i])]))[0] for i in range(3)]
        # meta/control gone: only the index names the first two blobs (the third was
        # named by the pending record alone).
        await e.oxia.delete(e.layout.control(tp), tp.partition_key)
        return {e.layout.parse_uri(r.wal_uri)[1] for r in results[:2]}

    indexed = run(settings, build)
    outcome = run_vacuum(spark, settings, VacuumOptions(
        retry_horizon_ms=HORIZON_MS, unsafe_short_horizon=True, apply=True),
        Report(tmp_path / "r"), later=_outgrown)
    assert outcome.exit_code == 0, outcome.summary
    assert outcome.summary["partitions"] == 1
    decisions = {d["key"]: d for d in table(tmp_path / "r", "decisions")}
    assert {decisions[k]["reason"] for k in indexed} == {"referenced"}
    assert indexed <= _keys(s3_client, bucket, root + "/")


def test_vacuum_after_retention_frees_only_what_no_partition_needs(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path, s3_client: Any) -> None:
    from jobs.spark.audit import AuditOptions, run_audit
    from jobs.spark.report import Report
    from jobs.spark.vacuum import VacuumOptions, run_vacuum

    settings = stack_settings(stack)
    root, bucket = settings.root_prefix, settings.s3_bucket
    a, b = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def build(e: Engine) -> dict[str, Any]:
        def key(result: Any) -> str:
            return str(e.layout.parse_uri(result.wal_uri)[1])

        # Six flushes hold both partitions (two records each); two more hold only a.
        shared = [await append(e, [(a, _two(f"a{i}")), (b, _two(f"b{i}"))]) for i in range(4)]
        solo = [(await append(e, [(a, _two(f"a-solo{i}"))]))[0] for i in range(2)]
        shared += [await append(e, [(a, _two(f"a{i}")), (b, _two(f"b{i}"))])
                   for i in range(4, 6)]
        # a keeps only its last two shared flushes; b starts inside its third (offset 6).
        for tp, start in ((a, shared[4][0].start_offset), (b, 6)):
            await move_log_start(e.oxia, e.layout, tp, start, None)
            control = await e.reader.read_control(tp)
            assert control is not None and control.log_start == start
            assert await trim_index(e.oxia, e.layout, tp, control)
        return {
            # Only the trimmed ranges named these: both partitions' first two flushes
            # and a's own appends.
            "freed": {key(s[0]) for s in shared[:2]} | {key(r) for r in solo},
            # Still named by b (flushes 3 and 4, the third holding b's log start) or by
            # both partitions (the last two).
            "kept": {key(s[0]) for s in shared[2:]},
            "log_starts": {a.partition: shared[4][0].start_offset, b.partition: 6},
        }

    built = run(settings, build)
    everything = _keys(s3_client, bucket, root + "/")
    assert built["freed"] | built["kept"] == everything
    # Waited out on the S3 clock itself here (the other tests run on a later one).
    time.sleep((HORIZON_MS + TIMESTAMP_SLACK_MS + 500) / 1000)  # everything outgrows it

    outcome = run_vacuum(spark, settings, VacuumOptions(
        retry_horizon_ms=HORIZON_MS, unsafe_short_horizon=True, apply=True),
        Report(tmp_path / "r"))
    assert outcome.exit_code == 0, outcome.summary
    decisions = {d["key"]: d for d in table(tmp_path / "r", "decisions")}
    assert {k for k, d in decisions.items() if d["action"] == "deleted"} == built["freed"]
    assert {decisions[k]["reason"] for k in built["kept"]} == {"referenced"}
    assert _keys(s3_client, bucket, root + "/") == built["kept"]

    async def read(e: Engine) -> dict[int, list[tuple[int, bytes]]]:
        return {tp.partition: [(o, v) for o, v, _ in await read_back(
            e, tp, built["log_starts"][tp.partition])] for tp in (a, b)}

    log = run(settings, read)
    first_a = built["log_starts"][a.partition]
    assert log[a.partition] == list(zip(range(first_a, first_a + 4),
                                        _two("a4") + _two("a5"), strict=True))
    assert log[b.partition] == list(zip(range(6, 13), _two("b2")[1:] + [
        v for i in range(3, 6) for v in _two(f"b{i}")], strict=True))
    audit = run_audit(spark, settings, AuditOptions(deep=True), Report(tmp_path / "audit"))
    assert audit.exit_code == 0, audit.summary
    assert (audit.summary["trimmable_entries"], audit.summary["orphans"]["count"]) == (0, 0)
