"""backfill and export Spark jobs against real Oxia and MinIO (local[2])."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio

from app.errors import StorageUnavailable
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload, payload_value
from app.storage.topic_catalog import PARTITION_KEY
from tests.helpers.compaction import index_entries
from tests.helpers.spark_records import read_back, same_fields, sample_records
from tests.helpers.spark_support import (
    SPARK_TESTS,
    TEST_JVM_OPTIONS,
    Engine,
    index_rows,
    open_engine,
    read_summary,
    run,
    stack_json,
    stack_settings,
    table,
)

pytestmark = SPARK_TESTS
REPO = Path(__file__).resolve().parents[1]


def _backfill(spark: Any, settings: Settings, report: Path, **options: Any) -> Any:
    from jobs.spark.backfill import BackfillOptions, run_backfill
    from jobs.spark.report import Report

    return run_backfill(spark, settings, BackfillOptions(**options), Report(report))


def _export(spark: Any, settings: Settings, report: Path, output: Path, **options: Any
            ) -> dict[tuple[str, int], list[tuple[int, bytes, str | None]]]:
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    outcome = run_export(spark, settings, ExportOptions(output=str(output), **options),
                         Report(report))
    assert outcome.exit_code == 0, outcome.summary
    out: dict[tuple[str, int], list[tuple[int, bytes, str | None]]] = {}
    for r in spark.read.parquet(str(output)).collect():
        out.setdefault((r["topic"], r["partition"]), []).append(
            (r["offset"], bytes(r["value"]), r["value_utf8"]))
    return {k: sorted(v) for k, v in out.items()}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _fence_after_one_record(settings: Settings, tp: TopicPartition) -> None:
    """``tp`` holds the record ``b"before"`` and refuses appends until unfenced."""

    async def fence(e: Engine) -> None:
        await e.writer.append_shared([AppendGroup(tp, [b"before"])])
        await e.writer.fence(tp)

    run(settings, fence)


async def _read_all(e: Engine, tp: TopicPartition) -> list[tuple[int, bytes]]:
    hw = await e.reader.high_watermark(tp)
    if hw == 0:
        return []
    return (await e.reader.read(tp, 1)).records


def test_backfill_then_export_round_trip(stack: LocalStack, spark: Any, topic: str,
                                         tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    settings = stack_settings(stack)
    # JSON Lines in two files, three partitions interleaved.
    expected: dict[tuple[str, int], list[bytes]] = {}
    files = []
    for f in range(2):
        rows = []
        for i in range(330):
            p = i % 3
            value = f"{topic}/{p}/f{f}/{i}/" + "é" * (i % 7)
            rows.append({"topic": topic, "partition": p, "value": value})
            expected.setdefault((topic, p), []).append(value.encode())
        path = tmp_path / f"in-{f}.jsonl"
        _write_jsonl(path, rows)
        files.append(str(path))

    async def zstd_topic(e: Engine) -> None:  # backfilled slices rest as its appends would
        await e.oxia.put(e.layout.topic_record(topic), json.dumps(
            {"topic": topic, "partitions": 3, "created_at_ms": 0, "compression": "zstd",
             "compression_level": 1}).encode(), PARTITION_KEY)

    run(settings, zstd_topic)
    first = _backfill(spark, settings, tmp_path / "bf-json", inputs=tuple(files),
                      topic_column="topic", partition_column="partition",
                      chunk_records=40, marker_every=3)
    assert first.exit_code == 0, first.summary
    assert first.summary["records_appended"] == 660
    chunks = table(tmp_path / "bf-json", "chunks")
    assert {c["status"] for c in chunks} == {"appended"}
    per_blob: dict[str, set[int]] = {}
    for c in chunks:
        per_blob.setdefault(c["blob_key"], set()).add(c["partition"])
    assert max(len(v) for v in per_blob.values()) >= 2  # several partitions per blob
    assert len(per_blob) < len(chunks)

    async def codecs(e: Engine) -> set[str | None]:
        return {entry.codec for _, entry in
                await index_entries(e, TopicPartition(topic, 0))}

    assert run(settings, codecs) == {"zstd"}

    # Parquet with binary values (not all UTF-8), one topic for every row.
    bin_topic = topic + "-bin"
    values = [bytes([i % 256, 0xFF, i // 256]) if i % 2 else f"ok-{i}".encode()
              for i in range(300)]
    pq.write_table(pa.table({"payload": pa.array(values, pa.binary())}),
                   tmp_path / "bin.parquet")
    expected[(bin_topic, 0)] = values
    out = _backfill(spark, settings, tmp_path / "bf-bin", inputs=(str(tmp_path / "bin.parquet"),),
                    value_column="payload", topic=bin_topic, chunk_records=64)
    assert out.exit_code == 0, out.summary

    # CSV with a header, base64 values, topic from the arguments, partition 4.
    csv_topic = topic + "-csv"
    import base64

    raw = [f"csv,{i},\"quoted\"".encode() for i in range(120)]
    with open(tmp_path / "in.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "b64"])
        for i, v in enumerate(raw):
            w.writerow([i, base64.b64encode(v).decode()])
    expected[(csv_topic, 4)] = raw
    out = _backfill(spark, settings, tmp_path / "bf-csv", inputs=(str(tmp_path / "in.csv"),),
                    value_column="b64", value_encoding="base64", topic=csv_topic,
                    partition=4, chunk_records=50)
    assert out.exit_code == 0, out.summary

    exported = _export(spark, settings, tmp_path / "export", tmp_path / "out.parquet",
                       range_records=100, verify_output=True)
    assert set(exported) == set(expected)
    for key, values in expected.items():
        rows = exported[key]
        assert [o for o, _, _ in rows] == list(range(1, len(values) + 1)), key
        assert [v for _, v, _ in rows] == values, key
        for _, v, text in rows:
            try:
                assert text == v.decode()
            except UnicodeDecodeError:
                assert text is None
    summary = read_summary(tmp_path / "export")
    assert summary["records_exported"] == sum(len(v) for v in expected.values())
    assert summary["duplicate_offsets"] == 0
    parts = table(tmp_path / "export", "files")
    assert sorted(f["file"] for f in parts) == [f"part-{i:05d}.parquet" for i in range(14)]
    assert summary["ranges"] == 14

    # A second run of the same backfill finds everything done: nothing is appended.
    again = _backfill(spark, settings, tmp_path / "bf-json-2", inputs=tuple(files),
                      topic_column="topic", partition_column="partition",
                      chunk_records=40, marker_every=3)
    assert again.exit_code == 0, again.summary
    assert again.summary["job_id"] == first.summary["job_id"]
    assert again.summary["records_appended"] == 0
    assert set(again.summary["statuses"]) == {"skipped_marker"}
    tps = [TopicPartition(topic, p) for p in range(3)]

    async def hws(e: Engine) -> list[int]:
        return [await e.reader.high_watermark(tp) for tp in tps]

    assert run(settings, hws) == [220, 220, 220]


def test_backfill_concurrent_with_live_producer(stack: LocalStack, spark: Any, topic: str,
                                                tmp_path: Path) -> None:
    settings = stack_settings(stack)
    tps = [TopicPartition(topic, p) for p in range(2)]
    rows = [{"topic": topic, "partition": i % 2, "value": f"bf-{i % 2}-{i // 2}"}
            for i in range(1200)]
    _write_jsonl(tmp_path / "in.jsonl", rows)
    stop = threading.Event()
    acked: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def producer() -> None:
        async def main() -> None:
            async with open_engine(settings) as e:
                i = 0
                while not stop.is_set() or i < 20:
                    groups = [AppendGroup(tp, [f"live-{tp.partition}-{i}-{k}".encode()
                                               for k in range(3)]) for tp in tps]
                    for g, res in zip(groups, await e.writer.append_shared(groups),
                                      strict=True):
                        assert isinstance(res, AppendResult), res
                        acked[g.tp.partition].extend(
                            zip(range(res.start_offset, res.end_offset + 1), g.records,
                                strict=True))
                    i += 1
                    await anyio.sleep(0.01)

        try:
            anyio.run(main)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        outcome = _backfill(spark, settings, tmp_path / "bf", inputs=(str(tmp_path / "in.jsonl"),),
                            topic_column="topic", partition_column="partition",
                            chunk_records=20, marker_every=4)
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    assert outcome.exit_code == 0, outcome.summary

    async def read(e: Engine) -> dict[int, list[tuple[int, bytes]]]:
        return {tp.partition: await _read_all(e, tp) for tp in tps}

    log = run(settings, read)
    for p in (0, 1):
        offsets = [o for o, _ in log[p]]
        assert offsets == list(range(1, len(offsets) + 1))
        backfilled = [v for _, v in log[p] if v.startswith(b"bf-")]
        assert backfilled == [f"bf-{p}-{i}".encode() for i in range(600)]
        live = [(o, v) for o, v in log[p] if v.startswith(b"live-")]
        assert live == acked[p]
        assert len(offsets) == 600 + len(acked[p])
    # Both writers really interleaved.
    chunk_rows = table(tmp_path / "bf", "chunks")
    assert any(c["start_offset"] > 1 + 20 * c["chunk"] for c in chunk_rows)


def test_backfill_killed_midway_and_rerun_leaves_no_duplicates(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    settings = stack_settings(stack)
    tps = [TopicPartition(topic, p) for p in range(4)]
    n = 1500
    pq.write_table(pa.table({
        "topic": [topic] * (4 * n),
        "partition": [i % 4 for i in range(4 * n)],
        "value": [f"v-{i % 4}-{i // 4}" for i in range(4 * n)],
    }), tmp_path / "in.parquet")
    args = ["--report", str(tmp_path / "killed"), "--master", "local[2]",
            "--input", str(tmp_path / "in.parquet"), "--topic-column", "topic",
            "--partition-column", "partition", "--job-id", "crashme",
            "--chunk-records", "25", "--marker-every", "8",
            "--max-records-per-second", "300", "--progress-interval", "1",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
            "--stack-json", str(tmp_path / "stack.json"),
            "--root-prefix", settings.root_prefix]
    # Connection settings as `llog dev` describes its stack (no LLOG_* environment).
    stack_json(stack, tmp_path / "stack.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLOG_")}

    async def total(e: Engine) -> int:
        return sum([await e.reader.high_watermark(tp) for tp in tps])

    def committed_so_far(last: int) -> int:
        """What the backfill committed, as last seen when this look cannot reach Oxia
        (a connection timing out on a loaded machine): the deadline bounds the wait."""
        try:
            return int(run(settings, total))
        except StorageUnavailable:
            return last

    with open(tmp_path / "killed.log", "w") as log_fh:
        # The JVM of the tests' own session: quicker to start, lighter to run.
        jvm = ["--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"]
        proc = subprocess.Popen([sys.executable, "-m", "jobs.spark.backfill", *args, *jvm],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log_fh,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            committed = 0
            while (committed := committed_so_far(committed)) < 1600:
                assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the backfill never got going"
                time.sleep(0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # driver and JVM: a crash, mid-append
            proc.wait(30)
    assert committed < 4 * n, "killed too late to test a resume"
    # The orphaned Python workers die with their daemon; wait until nothing moves.
    before, stable_since = run(settings, total), time.monotonic()
    while time.monotonic() - stable_since < 2:
        time.sleep(0.5)
        now = run(settings, total)
        if now != before:
            before, stable_since = now, time.monotonic()
    assert before < 4 * n

    from jobs.spark.backfill import main

    rerun = tmp_path / "rerun"
    code = main([a if a != str(tmp_path / "killed") else str(rerun) for a in args
                 if a not in ("--max-records-per-second", "300")])
    assert code == 0
    summary = read_summary(rerun)
    assert summary["records_done"] == 4 * n
    assert summary["records_appended"] == 4 * n - before
    skipped = {k: v["records"] for k, v in summary["statuses"].items()
               if k.startswith("skipped")}
    assert sum(skipped.values()) == before
    assert skipped.get("skipped_marker", 0) > 0

    async def read(e: Engine) -> dict[int, list[tuple[int, bytes]]]:
        return {tp.partition: await _read_all(e, tp) for tp in tps}

    log = run(settings, read)
    for p in range(4):
        assert [o for o, _ in log[p]] == list(range(1, n + 1))
        assert [v for _, v in log[p]] == [f"v-{p}-{i}".encode() for i in range(n)]


def test_a_failed_chunk_stops_its_partition_and_a_rerun_completes_it(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    fenced, open_tp = TopicPartition(topic, 0), TopicPartition(topic, 1)
    rows = [{"topic": topic, "partition": i % 2, "value": f"r-{i % 2}-{i // 2}"}
            for i in range(400)]
    _write_jsonl(tmp_path / "in.jsonl", rows)

    _fence_after_one_record(settings, fenced)
    options = dict(inputs=(str(tmp_path / "in.jsonl"),), topic_column="topic",
                   partition_column="partition", chunk_records=20, tasks=1)
    first = _backfill(spark, settings, tmp_path / "first", **options)
    assert first.exit_code == 1
    chunks = sorted((c["partition"], c["chunk"], c["status"])
                    for c in table(tmp_path / "first", "chunks"))
    assert chunks == [(0, 0, "failed")] + [(0, c, "not_attempted") for c in range(1, 10)] + [
        (1, c, "appended") for c in range(10)]

    async def unfence(e: Engine) -> None:
        await e.writer.unfence(fenced)

    run(settings, unfence)
    second = _backfill(spark, settings, tmp_path / "second", **options)
    assert second.exit_code == 0, second.summary
    assert second.summary["records_appended"] == 200

    async def read(e: Engine) -> dict[int, list[tuple[int, bytes]]]:
        return {tp.partition: await _read_all(e, tp) for tp in (fenced, open_tp)}

    log = run(settings, read)
    assert [v for _, v in log[0]] == [b"before"] + [f"r-0-{i}".encode() for i in range(200)]
    assert [v for _, v in log[1]] == [f"r-1-{i}".encode() for i in range(200)]


def _rich_rows(topic: str, partition: int, n: int, plain: bool) -> list[dict[str, Any]]:
    rows = []
    for i, record in enumerate(sample_records(f"bf{partition}", n)):
        if plain:
            record = payload_value(record)
        value, key, headers, timestamp = same_fields(record)
        rows.append({"topic": topic, "partition": partition, "value": value, "key": key,
                     "headers": [{"name": n, "value": v} for n, v in headers] or (
                         None if i % 2 else []),
                     "timestamp_ms": timestamp})
    return rows


async def _entry_encodings(e: Engine, tp: TopicPartition) -> set[str]:
    control = await e.reader.read_control(tp)
    assert control is not None
    pending = {control.pending.encoding} if control.pending is not None else set()
    return {entry.encoding for _, entry, _ in await index_rows(e, tp)} | pending


def test_backfill_of_rich_records_is_exactly_once_and_round_trips_through_export(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    settings = stack_settings(stack)
    mixed, plain = TopicPartition(topic, 0), TopicPartition(topic, 1)
    rows = _rich_rows(topic, 0, 60, plain=False) + _rich_rows(topic, 1, 40, plain=True)
    header = pa.struct([("name", pa.string()), ("value", pa.binary())])
    pq.write_table(pa.table({
        "topic": pa.array([r["topic"] for r in rows], pa.string()),
        "partition": pa.array([r["partition"] for r in rows], pa.int32()),
        "value": pa.array([r["value"] for r in rows], pa.binary()),
        "key": pa.array([r["key"] for r in rows], pa.binary()),
        "headers": pa.array([r["headers"] for r in rows], pa.list_(header)),
        "timestamp_ms": pa.array([r["timestamp_ms"] for r in rows], pa.int64()),
    }), tmp_path / "in.parquet")

    _fence_after_one_record(settings, mixed)
    options = dict(inputs=(str(tmp_path / "in.parquet"),), topic_column="topic",
                   partition_column="partition", chunk_records=7, marker_every=2)
    first = _backfill(spark, settings, tmp_path / "first", **options)
    assert first.exit_code == 1  # the fenced partition's chunks did not commit
    assert first.summary["records_appended"] == 40
    run(settings, lambda e: e.writer.unfence(mixed))
    second = _backfill(spark, settings, tmp_path / "second", **options)
    assert second.exit_code == 0, second.summary
    assert second.summary["records_appended"] == 60
    assert second.summary["statuses"]["skipped_marker"]["records"] == 40
    third = _backfill(spark, settings, tmp_path / "third", **options)
    assert (third.exit_code, third.summary["records_appended"]) == (0, 0)

    async def read(e: Engine) -> dict[int, list[tuple[int, Payload, int]]]:
        return {tp.partition: await read_back(e, tp, 1) for tp in (mixed, plain)}

    log = run(settings, read)
    assert [same_fields(p) for _, p, _ in log[0]] == [same_fields(b"before")] + [
        (r["value"], r["key"], tuple((h["name"], h["value"]) for h in r["headers"] or ()),
         r["timestamp_ms"]) for r in rows[:60]]
    # Rows without key, headers or timestamp stay plain values, in bytes-batch-v3 bodies.
    assert [p for _, p, _ in log[1]] == [r["value"] for r in rows[60:]]
    assert all(isinstance(p, bytes) for _, p, _ in log[1])
    assert run(settings, lambda e: _entry_encodings(e, plain)) == {"bytes-batch-v3"}
    assert "bytes-batch-v2" in run(settings, lambda e: _entry_encodings(e, mixed))

    # The export's output is a backfill input: the same records land in another topic.
    copy = topic + "-copy"
    _export(spark, settings, tmp_path / "export", tmp_path / "out", topics=(topic,))
    again = _backfill(spark, settings, tmp_path / "copy", inputs=(str(tmp_path / "out"),),
                      topic=copy, partition_column="partition", chunk_records=9)
    assert again.exit_code == 0, again.summary

    async def read_copy(e: Engine) -> dict[int, list[tuple[int, Payload, int]]]:
        return {p: await read_back(e, TopicPartition(copy, p), 1) for p in (0, 1)}

    copied = run(settings, read_copy)
    for p in (0, 1):
        assert [(o, same_fields(r)) for o, r, _ in copied[p]] == [
            (o, same_fields(r)) for o, r, _ in log[p]]


def test_backfill_reads_record_fields_from_json_and_refuses_what_it_cannot_encode(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    import pytest

    settings = stack_settings(stack)
    tp = TopicPartition(topic, 0)
    # As the HTTP API spells records: string keys, headers with a value or base64.
    rows = [{"value": "plain"},
            {"value": "keyed", "k": "customer-7", "timestamp_ms": 1_760_000_000_000},
            {"value": "headed", "headers": [{"name": "trace", "value": "4bf9"},
                                            {"name": "bin", "base64": "AAH/"}]}]
    _write_jsonl(tmp_path / "in.jsonl", rows)
    out = _backfill(spark, settings, tmp_path / "bf", inputs=(str(tmp_path / "in.jsonl"),),
                    topic=topic, key_column="k")
    assert out.exit_code == 0, out.summary
    log = run(settings, lambda e: read_back(e, tp, 1))
    assert [same_fields(p) for _, p, _ in log] == [
        (b"plain", None, (), None),
        (b"keyed", b"customer-7", (), 1_760_000_000_000),
        (b"headed", None, (("trace", b"4bf9"), ("bin", b"\x00\x01\xff")), None)]

    _write_jsonl(tmp_path / "bad.jsonl", [
        {"value": "a", "headers": [{"name": "h"}]},  # no value
        {"value": "b", "headers": [{"name": "ok", "value": "v"}]},
        {"value": "c", "timestamp_ms": -5}])
    with pytest.raises(ValueError, match="input refused") as refused:
        _backfill(spark, settings, tmp_path / "bad", inputs=(str(tmp_path / "bad.jsonl"),),
                  topic=topic + "-bad")
    assert "header without a name or value" in str(refused.value)
    assert "negative timestamp_ms" in str(refused.value)
    with pytest.raises(ValueError, match="'nokey' not in the input"):
        _backfill(spark, settings, tmp_path / "bad2", inputs=(str(tmp_path / "in.jsonl"),),
                  topic=topic + "-bad", key_column="nokey")
