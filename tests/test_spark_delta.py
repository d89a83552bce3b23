"""export --format delta against real Oxia and MinIO: a Delta table on the store's S3
that each run extends with exactly the records past its high-water offsets, also after a
run that crashed between writing its data files and committing them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.retention import move_log_start
from jobs.spark.delta_table import app_id
from jobs.spark.export_read import resume_bounds
from tests.helpers.spark_records import export_row, sample_records
from tests.helpers.spark_support import (
    SPARK_TESTS,
    Engine,
    append,
    read_summary,
    run,
    stack_json,
    stack_settings,
)

Written = dict[tuple[int, int], tuple[Payload, int]]
pytestmark = SPARK_TESTS


def test_resume_bounds_start_past_the_table_and_count_what_retention_took() -> None:
    held = {TopicPartition("a", 0): 10, TopicPartition("a", 1): 2}
    bounds = [("a", 0, 1, 15), ("a", 1, 6, 9), ("a", 2, 1, 0), ("a", 3, 4, 3)]
    resumed, lost = resume_bounds(bounds, held)
    # a-0 resumes at 11; a-1 held 1..2 but retention starts the log at 6: 3..5 are gone;
    # a-2 is empty; a-3 is empty with its log start past offsets never written.
    assert resumed == [("a", 0, 11, 15), ("a", 1, 6, 9), ("a", 2, 1, 0), ("a", 3, 4, 3)]
    assert lost == 3 + 3
    # --from-offset: offsets below it are skipped on purpose, not lost.
    assert resume_bounds([("a", 0, 1, 15)], {}, from_offset=12) == ([("a", 0, 12, 15)], 0)


def test_table_locations_and_foreign_tables_are_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from jobs.spark.delta_location import table_location
    from jobs.spark.delta_table import open_table, table_schema

    settings = Settings(s3_endpoint="http://127.0.0.1:9000", s3_access_key="k",
                        s3_secret_key="s")
    s3 = table_location("s3a://lake/llog/events/", settings.s3, settings.store)
    assert (s3.uri, s3.base_path) == ("s3://lake/llog/events", "lake/llog/events")
    assert s3.storage_options["aws_conditional_put"] == "etag"
    assert s3.storage_options["AWS_ALLOW_HTTP"] == "true"
    inside = f"s3://{settings.s3_bucket}/{settings.root_prefix}/lake"
    for bad in ("s3://lake", "s3://lake/", "gs://lake/events", "http://x/y", inside):
        with pytest.raises(ValueError, match="--table"):
            table_location(bad, settings.s3, settings.store)
    other = tmp_path / "other"
    write_deltalake(str(other), pa.table({"topic": ["a"], "append_date": ["x"], "n": [1]}),
                    partition_by=["topic", "append_date"])
    with pytest.raises(ValueError, match="columns are not the export's"):
        open_table(table_location(str(other), settings.s3, settings.store))
    expiring = tmp_path / "expiring"
    DeltaTable.create(str(expiring), table_schema(), partition_by=["topic", "append_date"],
                      configuration={"delta.setTransactionRetentionDuration": "interval 1 day"})
    with pytest.raises(ValueError, match="setTransactionRetentionDuration"):
        open_table(table_location(str(expiring), settings.s3, settings.store))
    created = open_table(table_location(str(tmp_path / "new"), settings.s3, settings.store))
    assert created.version() == 0 and open_table(
        table_location(str(tmp_path / "new"), settings.s3, settings.store)).version() == 0


def test_options_of_the_other_format_are_refused(spark: Any, tmp_path: Path) -> None:
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    settings, report = Settings(), Report(tmp_path / "r")
    for options, message in [
        (ExportOptions(format="delta"), "needs --table"),
        (ExportOptions(format="delta", table="t", output="o"), "for --format parquet"),
        (ExportOptions(format="delta", table="t", verify_output=True), "--format parquet"),
        (ExportOptions(output="o", table="t"), "--table is for --format delta"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_export(spark, settings, options, report)
    assert not (tmp_path / "t").exists()


def test_spark_reads_pack_small_files_and_skip_files_by_partition_values() -> None:
    import datetime

    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, IsNull

    from jobs.spark.delta_source import DataFile, _matches, pack

    day = datetime.date(2026, 11, 1)
    files = [DataFile(f"f{i}", 40, "a" if i < 3 else "b", day + datetime.timedelta(i % 2),
                      i % 2) for i in range(5)]
    assert [[f.path for f in g.files] for g in pack(files, 100)] == [
        ["f0", "f1"], ["f2", "f3"], ["f4"]]
    assert [f.path for f in files if _matches(EqualTo(("topic",), "a"), f)] == [
        "f0", "f1", "f2"]
    assert [f.path for f in files if _matches(In(("partition",), (1,)), f)] == ["f1", "f3"]
    later = GreaterThanOrEqual(("append_date",), day + datetime.timedelta(1))
    assert [f.path for f in files if _matches(later, f)] == ["f1", "f3"]
    # Other columns and other kinds of filter never skip a file.
    assert all(_matches(EqualTo(("offset",), 7), f) for f in files)
    assert all(_matches(IsNull(("topic",)), f) for f in files)


def _produce(settings: Settings, topic: str, tag: str, written: Written) -> None:
    async def go(e: Engine) -> None:
        for p in (0, 1):
            for i in range(3):
                records = sample_records(f"{tag}-{p}-{i}", 3 + p)
                (result,) = await append(e, [(TopicPartition(topic, p), records)])
                for offset, record in enumerate(records, result.start_offset):
                    written[(p, offset)] = (record, result.append_time_ms)

    run(settings, go)


def _export(spark: Any, settings: Settings, table: str, tmp_path: Path, name: str,
            topic: str) -> dict[str, Any]:
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    outcome = run_export(spark, settings, ExportOptions(
        format="delta", table=table, topics=(topic,), range_records=5),
        Report(tmp_path / name))
    assert outcome.exit_code == 0, outcome.summary
    return outcome.summary


def _open(settings: Settings, table: str) -> Any:
    from deltalake import DeltaTable

    from jobs.spark.delta_location import table_location

    location = table_location(table, settings.s3, settings.store)
    return DeltaTable(location.uri, storage_options=location.storage_options)


def _rows(table: Any) -> list[dict[str, Any]]:
    rows = table.to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _expected(topic: str, written: Written) -> list[dict[str, Any]]:
    return [export_row(topic, p, o, record, at)
            for (p, o), (record, at) in sorted(written.items())]


def _without_date(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from jobs.spark.export_read import append_date

    for row in rows:
        assert str(row.pop("append_date")) == append_date(row["append_time_ms"])
    return rows


def _plain(value: Any) -> Any:
    """A Spark row's value as pyarrow gives it (bytes, dicts, lists)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _spark_rows(spark: Any, stack: LocalStack, tmp_path: Path, table: str,
                version: int | None = None, where: str = "true") -> list[dict[str, Any]]:
    """The table read back by Spark (the llog_delta data source), sorted by offset."""
    from jobs.spark.delta_source import register

    register(spark)
    reader = spark.read.format("llog_delta").option(
        "stackJson", str(stack_json(stack, tmp_path / "read-stack.json")))
    if version is not None:
        reader = reader.option("version", version)
    rows = [_plain(r.asDict(recursive=True)) for r in reader.load(table).where(where).collect()]
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _table_uri(settings: Settings) -> str:
    return f"s3://{settings.s3_bucket}/{settings.root_prefix}-lake/events"


@pytest.mark.timeout(180)
def test_incremental_exports_hold_every_record_once(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    settings = stack_settings(stack)
    table_uri, written = _table_uri(settings), Written()
    _produce(settings, topic, "a", written)
    first = _export(spark, settings, table_uri, tmp_path, "r1", topic)
    assert first["records_exported"] == len(written) == 21 and first["table_version"] == 1
    after_first = dict(written)
    _produce(settings, topic, "b", written)
    second = _export(spark, settings, table_uri, tmp_path, "r2", topic)
    assert second["records_exported"] == 21 and second["table_version"] == 2
    idle = _export(spark, settings, table_uri, tmp_path, "r3", topic)
    assert idle["records_exported"] == 0 and idle["table_version"] == 2
    assert not idle["committed"]

    table = _open(settings, table_uri)
    assert _without_date(_rows(table)) == _expected(topic, written)
    assert _without_date(_spark_rows(spark, stack, tmp_path, table_uri)) == _expected(
        topic, written)
    assert _without_date(_spark_rows(spark, stack, tmp_path, table_uri, version=1)) == \
        _expected(topic, after_first)
    one = _spark_rows(spark, stack, tmp_path, table_uri,
                      where=f"topic = '{topic}' AND partition = 1 AND offset > 20")
    assert [(r["partition"], r["offset"]) for r in one] == [(1, o) for o in range(21, 25)]
    assert table.metadata().partition_columns == ["topic", "append_date"]
    # The high-water offsets live in the table, committed with the data.
    assert table.transaction_version(app_id(TopicPartition(topic, 0))) == 18
    assert table.transaction_version(app_id(TopicPartition(topic, 1))) == 24
    # Time travel: version 1 is the first export, exactly.
    table.load_as_version(1)
    assert _without_date(_rows(table)) == _expected(topic, after_first)
    assert [h["operation"] for h in _open(settings, table_uri).history()] == [
        "WRITE", "WRITE", "CREATE TABLE"]


@pytest.mark.timeout(180)
def test_a_crash_before_the_commit_is_re_run_without_duplicates(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs.spark.export_delta as export_delta
    from jobs.spark.delta_files import delta_task

    settings = stack_settings(stack)
    table_uri, written = _table_uri(settings), Written()
    _produce(settings, topic, "a", written)
    _export(spark, settings, table_uri, tmp_path, "r1", topic)
    _produce(settings, topic, "b", written)

    def crash(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("the driver died after the data files were written")

    monkeypatch.setattr(export_delta, "commit", crash)
    with pytest.raises(RuntimeError, match="driver died"):
        _export(spark, settings, table_uri, tmp_path, "crashed", topic)
    monkeypatch.undo()
    assert delta_task is export_delta.delta_task  # the files were written for real
    assert len(_rows(_open(settings, table_uri))) == 21  # nothing of the crashed run

    # Retention moves partition 1's log start into what the table holds: no effect.
    run(settings, lambda e: move_log_start(e.oxia, e.layout, TopicPartition(topic, 1), 5,
                                          None))
    # The re-run through the command line, as an operator would run it.
    from jobs.spark.export import main

    assert main(["--report", str(tmp_path / "r2"), "--root-prefix", settings.root_prefix,
                 "--stack-json", str(stack_json(stack, tmp_path / "stack.json")),
                 "--format", "delta", "--table", table_uri, "--topic", topic,
                 "--range-records", "5"]) == 0
    rerun = read_summary(tmp_path / "r2")
    assert rerun["records_exported"] == 21 and rerun["records_lost_to_retention"] == 0
    assert rerun["table_version"] == 2 and rerun["committed"]
    table = _open(settings, table_uri)
    assert _without_date(_rows(table)) == _expected(topic, written)
    assert _without_date(_spark_rows(spark, stack, tmp_path, table_uri)) == _expected(
        topic, written)
    assert _orphans(settings, table_uri, table) > 0  # left for Delta's VACUUM


def _orphans(settings: Settings, table_uri: str, table: Any) -> int:
    """Data files under the table that its log does not reference."""
    import pyarrow.fs

    from jobs.spark.delta_location import filesystem, table_location

    location = table_location(table_uri, settings.s3, settings.store)
    fs = filesystem(location, settings)
    listed = {i.path[len(location.base_path) + 1:] for i in fs.get_file_info(
        pyarrow.fs.FileSelector(location.base_path, recursive=True))
        if i.path.endswith(".parquet") and "/_delta_log/" not in i.path}
    prefix = table.table_uri.rstrip("/") + "/"
    referenced = {uri[len(prefix):] for uri in table.file_uris()}
    assert referenced <= listed
    return len(listed - referenced)



def test_a_commit_never_lands_on_a_table_another_export_moved(stack: LocalStack) -> None:
    from deltalake.exceptions import CommitFailedError

    from jobs.spark.delta_location import table_location
    from jobs.spark.delta_table import commit, open_table

    settings = stack_settings(stack)
    location = table_location(_table_uri(settings), settings.s3, settings.store)
    first, second = open_table(location), open_table(location)
    tp = TopicPartition("t", 0)
    assert commit(first, [], {tp: 5}, {}) == 1
    # The second read the table before the first committed: its plan is stale, so its
    # commit is refused (conditional PUT of version 1), not retried onto version 2.
    with pytest.raises(CommitFailedError):
        commit(second, [], {tp: 7}, {})
    assert _open(settings, _table_uri(settings)).transaction_version(app_id(tp)) == 5


def test_a_failed_range_commits_nothing_of_the_run(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path, s3_client: Any) -> None:
    settings = stack_settings(stack)
    table_uri, written = _table_uri(settings), Written()
    _produce(settings, topic, "a", written)
    _export(spark, settings, table_uri, tmp_path, "r1", topic)
    lost_tp, kept_tp = TopicPartition(topic, 1), TopicPartition(topic, 0)

    async def more(e: Engine) -> str:
        await append(e, [(kept_tp, sample_records("k", 4))])
        (result,) = await append(e, [(lost_tp, sample_records("l", 4))])
        return str(result.wal_uri.split("/", 3)[3])

    # The new blob of partition 1 disappears: its range cannot be read.
    s3_client.delete_object(Bucket=settings.s3_bucket, Key=run(settings, more))
    with pytest.raises(Exception, match=f"{lost_tp} offsets 13..16: ObjectMissing"):
        _export(spark, settings, table_uri, tmp_path, "r2", topic)
    table = _open(settings, table_uri)
    # Partition 0's range was written, but nothing of the failed run is in the table.
    assert table.version() == 1 and len(_rows(table)) == 21
    assert table.transaction_version(app_id(kept_tp)) == 9
