"""export --format iceberg against real Oxia and MinIO: an Iceberg table (SQL catalog in
SQLite, data on the store's S3) that each run extends with exactly the records past its
high-water offsets, also after a run that crashed between writing its data files and
committing them (an exception in the test's process, and a SIGKILLed export process with
its Spark JVM). The table is read back with pyiceberg."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.retention import move_log_start
from jobs.spark.iceberg_table import high_water_key
from tests.helpers.spark_records import export_row, sample_records
from tests.helpers.spark_support import (
    SPARK_TESTS,
    TEST_JVM_OPTIONS,
    Engine,
    append,
    read_summary,
    run,
    stack_json,
    stack_settings,
)

Written = dict[tuple[int, int], tuple[Payload, int]]
pytestmark = SPARK_TESTS
TABLE = "llog.events"
REPO = Path(__file__).resolve().parents[1]


def test_catalog_properties_default_to_the_store_and_options_win(tmp_path: Path) -> None:
    from jobs.spark.iceberg_catalog import (
        PYARROW_FILE_IO,
        catalog_properties,
        file_io_properties,
        parse_properties,
        redacted,
    )

    settings = Settings(s3_endpoint="http://127.0.0.1:9000", s3_access_key="k",
                        s3_secret_key="s", s3_region="eu-west-1")
    uri = f"sqlite:///{tmp_path}/c.db"
    props = catalog_properties("t-none", settings, parse_properties([f"uri={uri}"]))
    assert props == {"py-io-impl": PYARROW_FILE_IO, "s3.region": "eu-west-1",
                     "s3.endpoint": "http://127.0.0.1:9000", "s3.access-key-id": "k",
                     "s3.secret-access-key": "s", "uri": uri}
    # A catalog with S3 settings of its own gets none of the store's.
    own = catalog_properties("t-none", settings, {"uri": uri, "client.region": "x"})
    assert own == {"py-io-impl": PYARROW_FILE_IO, "uri": uri, "client.region": "x"}
    assert file_io_properties({**props, "token": "t", "warehouse": "w"}) == {
        k: v for k, v in props.items() if k != "uri"}
    with pytest.raises(ValueError, match="no Iceberg catalog 't-none' is configured"):
        catalog_properties("t-none", settings, {})
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        parse_properties(["uri"])
    assert redacted(["s3.secret-access-key=s", "uri=postgresql://u:pw@h/db", "a=b=c"]) == [
        "s3.secret-access-key=<redacted>", "uri=postgresql://u:<redacted>@h/db", "a=b=c"]


def test_tables_inside_the_store_and_foreign_tables_are_refused(tmp_path: Path) -> None:
    import pyarrow as pa

    from jobs.spark.iceberg_catalog import check_location, open_catalog
    from jobs.spark.iceberg_table import identifier, open_table

    settings = Settings()
    catalog = open_catalog("t-local", settings, {"uri": f"sqlite:///{tmp_path}/c.db",
                                                 "warehouse": f"file://{tmp_path}/wh"})
    for bad in ("events", "llog.", ".events"):
        with pytest.raises(ValueError, match="NAMESPACE.NAME"):
            identifier(bad)
    inside = f"s3://{settings.s3_bucket}/{settings.root_prefix}/lake"
    with pytest.raises(ValueError, match="inside the store's root prefix"):
        check_location(TABLE, inside, settings.s3, settings.store)
    check_location(TABLE, f"s3://{settings.s3_bucket}/{settings.root_prefix}-lake",
                   settings.s3, settings.store)
    catalog.create_namespace("other")
    catalog.create_table("other.events", pa.schema([("topic", pa.string())]))
    with pytest.raises(ValueError, match="columns are not the export's"):
        open_table(catalog, "other.events")
    created = open_table(catalog, TABLE)
    assert created.current_snapshot() is None
    assert open_table(catalog, TABLE).metadata.table_uuid == created.metadata.table_uuid


def test_options_of_the_other_format_are_refused(spark: Any, tmp_path: Path) -> None:
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    settings, report = Settings(), Report(tmp_path / "r")
    for options, message in [
        (ExportOptions(format="iceberg"), "needs --table"),
        (ExportOptions(format="iceberg", table=TABLE, output="o"), "for --format parquet"),
        (ExportOptions(format="iceberg", table=TABLE, verify_output=True), "--format parquet"),
        (ExportOptions(output="o", table=TABLE), "--table is for --format delta or iceberg"),
        (ExportOptions(format="delta", table=str(tmp_path / "t"),
                       catalog_properties=("uri=x",)),
         "--catalog-property are for --format iceberg"),
        (ExportOptions(output="o", catalog="other"), "are for --format iceberg"),
    ]:
        with pytest.raises(ValueError, match=message):
            run_export(spark, settings, options, report)
    assert not (tmp_path / "t").exists()


def _produce(settings: Settings, topic: str, tag: str, written: Written) -> None:
    async def go(e: Engine) -> None:
        for p in (0, 1):
            for i in range(3):
                records = sample_records(f"{tag}-{p}-{i}", 3 + p)
                (result,) = await append(e, [(TopicPartition(topic, p), records)])
                for offset, record in enumerate(records, result.start_offset):
                    written[(p, offset)] = (record, result.append_time_ms)

    run(settings, go)


def _catalog_options(settings: Settings, tmp_path: Path) -> tuple[str, ...]:
    """A SQL catalog in a SQLite file; the table's files on the store's S3, beside (not
    inside) the test's root prefix."""
    return (f"uri=sqlite:///{tmp_path}/catalog.db",
            f"warehouse=s3://{settings.s3_bucket}/{settings.root_prefix}-lake")


def _export(spark: Any, settings: Settings, tmp_path: Path, name: str,
            topic: str) -> dict[str, Any]:
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    outcome = run_export(spark, settings, ExportOptions(
        format="iceberg", table=TABLE, topics=(topic,), range_records=5,
        catalog="llog-test", catalog_properties=_catalog_options(settings, tmp_path)),
        Report(tmp_path / name))
    assert outcome.exit_code == 0, outcome.summary
    return outcome.summary


def _open(settings: Settings, tmp_path: Path) -> Any:
    from jobs.spark.iceberg_catalog import open_catalog, parse_properties

    return open_catalog("llog-test", settings, parse_properties(
        _catalog_options(settings, tmp_path))).load_table(TABLE)


def _rows(table: Any, snapshot_id: int | None = None) -> list[dict[str, Any]]:
    """The table read back with pyiceberg, sorted by offset; each row's ``append_time``
    checked against its ``append_time_ms`` and dropped."""
    import datetime

    rows = table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    for row in rows:
        assert row.pop("append_time") == datetime.datetime.fromtimestamp(
            row["append_time_ms"] / 1000, datetime.UTC)
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _expected(topic: str, written: Written) -> list[dict[str, Any]]:
    return [export_row(topic, p, o, record, at)
            for (p, o), (record, at) in sorted(written.items())]


@pytest.mark.timeout(180)
def test_incremental_exports_hold_every_record_once(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    from pyiceberg.expressions import And, EqualTo, GreaterThan

    from jobs.spark.export_read import append_date

    settings = stack_settings(stack)
    written = Written()
    _produce(settings, topic, "a", written)
    first = _export(spark, settings, tmp_path, "r1", topic)
    assert first["records_exported"] == len(written) == 21 and first["committed"]
    after_first = dict(written)
    _produce(settings, topic, "b", written)
    second = _export(spark, settings, tmp_path, "r2", topic)
    assert second["records_exported"] == 21 and second["committed"]
    idle = _export(spark, settings, tmp_path, "r3", topic)
    assert idle["records_exported"] == 0 and not idle["committed"]
    assert idle["snapshot_id"] == second["snapshot_id"]

    table = _open(settings, tmp_path)
    assert _rows(table) == _expected(topic, written)
    # Time travel: the first snapshot is the first export, exactly.
    assert _rows(table, first["snapshot_id"]) == _expected(topic, after_first)
    # The high-water offsets live in the table, committed with the data.
    assert table.properties[high_water_key(TopicPartition(topic, 0))] == "18"
    assert table.properties[high_water_key(TopicPartition(topic, 1))] == "24"
    summary = table.current_snapshot().summary
    assert summary["llog.job"] == "export" and summary["operation"].value == "append"
    assert summary[high_water_key(TopicPartition(topic, 1))] == "24"
    assert [e.snapshot_id for e in table.history()] == [first["snapshot_id"],
                                                        second["snapshot_id"]]
    # Partitioned by topic and day: a filter on both plans only that partition's files.
    day = append_date(written[(1, 21)][1])
    files = list(table.scan(row_filter=And(EqualTo("topic", topic), GreaterThan(
        "append_time", f"{day}T00:00:00+00:00"))).plan_files())
    assert files and all(f.file.partition[0] == topic for f in files)
    one = table.scan(row_filter=And(EqualTo("partition", 1), GreaterThan("offset", 20))
                     ).to_arrow().to_pylist()
    assert sorted(r["offset"] for r in one) == [21, 22, 23, 24]
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("topic", "identity"), ("append_day", "day")]


@pytest.mark.timeout(180)
def test_a_crash_before_the_commit_is_re_run_without_duplicates(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash is the commit's: the data files of the crashed run are in the store
    (the commit was handed them), the table has nothing of that run, and the re-run
    leaves them unreferenced rather than adding their records twice."""
    import jobs.spark.export_iceberg as export_iceberg

    settings = stack_settings(stack)
    written = Written()
    _produce(settings, topic, "a", written)
    _export(spark, settings, tmp_path, "r1", topic)
    after_first = dict(written)
    _produce(settings, topic, "b", written)
    handed: list[str] = []  # the data files the crashed run's commit was given

    def crash(table: Any, files: Iterable[str], *args: Any, **kwargs: Any) -> int:
        handed.extend(files)
        raise RuntimeError("the driver died after the data files were written")

    monkeypatch.setattr(export_iceberg, "commit", crash)
    with pytest.raises(RuntimeError, match="driver died"):
        _export(spark, settings, tmp_path, "crashed", topic)
    monkeypatch.undo()
    assert len(handed) >= 5  # 9 and 12 new records, in ranges of 5 or fewer
    # The files were written for real: each is in the store, and none in the table.
    table = _open(settings, tmp_path)
    assert _rows(table) == _expected(topic, after_first)
    assert set(handed) <= _unreferenced(table)
    table = _rerun_exports_the_rest_once(stack, settings, tmp_path, topic, written)
    assert set(handed) <= _unreferenced(table)  # harmless: no snapshot references them


def _export_args(stack: LocalStack, settings: Settings, tmp_path: Path, report: str,
                 topic: str) -> list[str]:
    """The command line of an export to the test's table (``llog spark export ...``)."""
    catalog_args = [a for p in _catalog_options(settings, tmp_path)
                    for a in ("--catalog-property", p)]
    return ["--report", str(tmp_path / report), "--root-prefix", settings.root_prefix,
            "--stack-json", str(stack_json(stack, tmp_path / "stack.json")),
            "--format", "iceberg", "--table", TABLE, "--catalog", "llog-test",
            *catalog_args, "--topic", topic, "--range-records", "5"]


def _rerun_exports_the_rest_once(stack: LocalStack, settings: Settings, tmp_path: Path,
                                 topic: str, written: Written) -> Any:
    """After a first export of 21 records and a run that died before its commit: a
    re-run through the command line, as an operator would run it, exports the 21 records
    the first did not, and the table holds every record once. Returns the table."""
    # Retention moves partition 1's log start into what the table holds: no effect.
    run(settings, lambda e: move_log_start(e.oxia, e.layout, TopicPartition(topic, 1), 5,
                                          None))
    from jobs.spark.export import main

    assert main(_export_args(stack, settings, tmp_path, "r2", topic)) == 0
    rerun = read_summary(tmp_path / "r2")
    assert rerun["records_exported"] == 21 and rerun["records_lost_to_retention"] == 0
    assert rerun["committed"]
    table = _open(settings, tmp_path)
    assert _rows(table) == _expected(topic, written)
    assert len(table.history()) == 2
    return table


def _unreferenced(table: Any) -> set[str]:
    """Data files under the table's location that no snapshot references."""
    import pyarrow.fs

    from jobs.spark.iceberg_catalog import data_file_io

    io = data_file_io(table.io.properties, table.location())
    fs = io.fs_by_scheme("s3", table.location().split("/")[2])
    base = table.location().split("://", 1)[1] + "/data"
    listed = {f"s3://{i.path}" for i in fs.get_file_info(
        pyarrow.fs.FileSelector(base, recursive=True)) if i.path.endswith(".parquet")}
    referenced = {task.file.file_path for snapshot in table.snapshots()
                  for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()}
    assert referenced <= listed
    return listed - referenced


# `llog spark export ...` in a process of its own whose commit, the step right after the
# data files are written, announces the files and waits to be killed instead. A closed
# stdin (the test died) ends it without a commit.
_HELD_AT_COMMIT = textwrap.dedent("""
    import json, os, sys
    import jobs.spark.export_iceberg as export_iceberg
    from jobs.spark.cli import main

    def held(table, files, *rest):
        print("data files written: " + json.dumps(list(files)), flush=True)
        sys.stdin.read()
        os._exit(3)

    export_iceberg.commit = held
    sys.exit(main(sys.argv[1:]))
""")
_WRITTEN = b"data files written: "


def _await_line(proc: subprocess.Popen[bytes], prefix: bytes, timeout: float,
                log: Path) -> bytes:
    """The rest of the first line ``proc`` prints that starts with ``prefix``."""
    assert proc.stdout is not None
    fd, seen, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while True:
        for line in seen.splitlines(keepends=True):
            if line.startswith(prefix) and line.endswith(b"\n"):
                return line[len(prefix):]
        left = deadline - time.monotonic()
        assert left > 0, f"no {prefix!r} in {timeout}s: {_tail(log)}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"exited ({proc.wait()}) first: {_tail(log)}"
            seen += chunk


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _session(sid: int) -> dict[int, int]:
    """The live (not zombie) processes of session ``sid``: pid -> process group."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                state, _, group, session = (entry / "stat").read_text(
                ).rsplit(")", 1)[1].split()[:4]
            except (OSError, ValueError):  # exited meanwhile
                continue
            if state != "Z" and int(session) == sid:
                out[int(entry.name)] = int(group)
    return out


def _await_exits(pids: Iterable[int], timeout: float) -> None:
    """Until every one of ``pids`` has exited, or ``timeout``."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))  # readable once the process exits
    try:
        pending, deadline = set(fds), time.monotonic() + timeout
        while pending and (left := deadline - time.monotonic()) > 0:
            pending -= set(select.select(list(pending), [], [], left)[0])
    finally:
        for fd in fds:
            os.close(fd)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``proc`` leads (the driver and its Spark JVM) and wait
    for it; then every process of its session (PySpark's worker daemon puts itself in a
    group of its own, and leaves when the JVM is gone) must be gone too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    _await_exits(_session(proc.pid), 60)
    left = _session(proc.pid)
    for pid in left:  # never leave anything running, even when the test fails
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the kill (pid: group): {left}"


@pytest.mark.timeout(360)
def test_an_export_killed_before_its_commit_is_re_run_without_duplicates(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    """The crash is real: the export runs as its own process (driver and Spark JVM),
    which is SIGKILLed once its data files are in the store and before it commits."""
    settings = stack_settings(stack)
    written = Written()
    _produce(settings, topic, "a", written)
    first = _export(spark, settings, tmp_path, "r1", topic)
    after_first, held = dict(written), _open(settings, tmp_path).properties
    _produce(settings, topic, "b", written)

    args = ["export", *_export_args(stack, settings, tmp_path, "killed", topic),
            "--master", "local[2]", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.ui.showConsoleProgress=false",
            # The JVM of the tests' own session: quicker to start, lighter to run.
            "--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"]
    # Connection settings from the stack.json only, as an operator's run takes them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLOG_")}
    log = tmp_path / "killed.log"
    with open(log, "wb") as log_fh:
        proc = subprocess.Popen([sys.executable, "-c", _HELD_AT_COMMIT, *args], cwd=REPO,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log_fh, start_new_session=True)
        try:
            files = json.loads(_await_line(proc, _WRITTEN, 240, log))
        finally:
            _kill_session(proc)
            for pipe in (proc.stdin, proc.stdout):
                assert pipe is not None
                pipe.close()
    assert proc.returncode == -signal.SIGKILL
    assert len(files) >= 5  # 9 and 12 new records, in ranges of 5 or fewer

    # Nothing of the killed run is in the table; its data files are in the store, and
    # no snapshot references them.
    table = _open(settings, tmp_path)
    assert _rows(table) == _expected(topic, after_first)
    assert [e.snapshot_id for e in table.history()] == [first["snapshot_id"]]
    assert table.properties == held
    assert set(files) <= _unreferenced(table)

    table = _rerun_exports_the_rest_once(stack, settings, tmp_path, topic, written)
    assert set(files) <= _unreferenced(table)


def test_a_commit_never_lands_on_a_table_another_export_moved(
        stack: LocalStack, tmp_path: Path) -> None:
    from pyiceberg.exceptions import CommitFailedException

    from jobs.spark.iceberg_catalog import open_catalog, parse_properties
    from jobs.spark.iceberg_table import commit, open_table

    settings = stack_settings(stack)
    props = parse_properties(_catalog_options(settings, tmp_path))
    first = open_table(open_catalog("llog-test", settings, props), TABLE)
    second = open_table(open_catalog("llog-test", settings, props), TABLE)
    tp = TopicPartition("t", 0)
    commit(first, [], {tp: 5}, {})
    # The second read the table before the first committed: its plan is stale, so its
    # commit is refused (the snapshot it read is no longer current), not retried.
    with pytest.raises(CommitFailedException):
        commit(second, [], {tp: 7}, {})
    assert _open(settings, tmp_path).properties[high_water_key(tp)] == "5"
