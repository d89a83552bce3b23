"""Shared pieces of the Spark job tests: one local[2] SparkSession per test process,
settings and store clients for the session's stack, and store helpers (writing records,
injecting faults, a protocol-exact compaction).

The session is created on first use and stopped when the process exits, so every
``tests/test_spark_*.py`` module shares it whatever order pytest runs them in.
"""

from __future__ import annotations

import atexit
import gc
import importlib.util
import json
import shutil
import sys
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage import codec
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.metadata import Compaction, CompactionCursor, IndexEntry, now_ms
from app.storage.writer import CrashPoint
from app.stores.oxia.store import EXPECT_NOT_EXISTS
from jobs.spark.job_settings import settings_from_payload
from tests.helpers.stack import Engine, open_engine


def spark_missing_reason() -> str | None:
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed (pip install -e '.[spark]')"
    if shutil.which("java") is None:
        return "no Java runtime on PATH (the Spark jobs need Java 17+)"
    return None


SPARK_SKIP_REASON = spark_missing_reason()
# The marks of every Spark test module: they need Spark itself (a missing JVM fails the
# run: the skip is not on the allow-list of tests/helpers/selection.py), and they run in
# one process, sharing its JVM, also those that start a job without the spark fixture.
SPARK_TESTS = [
    pytest.mark.skipif(SPARK_SKIP_REASON is not None, reason=SPARK_SKIP_REASON or ""),
    pytest.mark.spark,
]
_SESSION: Any = None


_GATEWAY_ATTEMPTS = 3
# The tests' JVMs run small jobs for minutes: the client compiler alone, and one GC
# thread, spend a fraction of the CPU that C2's compilations and parallel GC do there.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def get_spark() -> Any:
    """The process-wide local[2] SparkSession of the tests.

    Its JVM is started again (up to :data:`_GATEWAY_ATTEMPTS` times) when it exits
    before it is up: on a loaded machine that has happened at the start of a run, and
    the session is shared, so one such exit would fail every Spark test of the worker.
    Any other failure, and a third exit, fail as they are."""
    global _SESSION
    if _SESSION is None:
        from pyspark.errors import PySparkRuntimeError

        from jobs.spark.session import build_spark

        for attempt in range(1, _GATEWAY_ATTEMPTS + 1):
            # pyspark leaves a dead JVM's stdin pipe open, and it is let go while the
            # error is handled or at the collection below: its ResourceWarning is
            # expected there, rather than failing this test or whatever runs next.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                try:
                    _SESSION = build_spark("llog-spark-tests", "local[2]", {
                        "spark.ui.enabled": "false",
                        "spark.ui.showConsoleProgress": "false",
                        "spark.sql.shuffle.partitions": "4",
                        "spark.default.parallelism": "2",
                        "spark.driver.memory": "1g",
                        "spark.sql.adaptive.enabled": "true",
                        "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
                    })
                    break
                except PySparkRuntimeError as exc:
                    if (exc.getCondition() != "JAVA_GATEWAY_EXITED"
                            or attempt == _GATEWAY_ATTEMPTS):
                        raise
                gc.collect()
            print(f"spark: the JVM exited while starting (attempt {attempt}); again",
                  file=sys.stderr)
        atexit.register(_SESSION.stop)
    return _SESSION


def unique_root() -> str:
    return f"sparktest-{uuid.uuid4().hex[:10]}"


def stack_settings(stack: LocalStack, **overrides: Any) -> Settings:
    """Settings for the session's stack under a root prefix of the test's own, built
    the way the jobs' tasks build theirs (from ``LLOG_*`` strings)."""
    env = {**stack.settings_env(), "LLOG_ROOT_PREFIX": unique_root(),
           "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000"}
    return settings_from_payload(env, **overrides)


def stack_json(stack: LocalStack, path: Path) -> Path:
    """The stack's connection as ``llog dev`` describes it in ``stack.json``."""
    env = stack.settings_env()
    path.write_text(json.dumps({
        name: env[f"LLOG_{name.upper()}"] for name in (
            "oxia_address", "oxia_namespace", "s3_endpoint", "s3_bucket", "s3_region",
            "s3_access_key", "s3_secret_key")}))
    return path


def read_summary(report: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((report / "summary.json").read_text())
    return data


def table(report: Path, name: str) -> list[dict[str, Any]]:
    """A report's Parquet table as dicts (through the tests' Spark session)."""
    return [r.asDict() for r in get_spark().read.parquet(str(report / name)).collect()]


# -- store helpers (async; tests call them through anyio.run) ---------------------------


async def append(e: Engine, groups: Sequence[tuple[TopicPartition, Sequence[Payload]]]
                 ) -> list[AppendResult]:
    results = await e.writer.append_shared([AppendGroup(tp, list(r)) for tp, r in groups])
    out = []
    for r in results:
        assert isinstance(r, AppendResult), r
        out.append(r)
    return out


def run(settings: Settings, fn: Any, *args: Any) -> Any:
    """``fn(engine, *args)`` against ``settings`` (no background writer tasks)."""

    async def main() -> Any:
        async with open_engine(settings) as e:
            return await fn(e, *args)

    return anyio.run(main)


async def crash_after_commit(e: Engine, tp: TopicPartition, records: Sequence[bytes]) -> None:
    """Commit an append and 'die' before its index entry exists: a pending-only append."""
    def hook(step: str) -> None:
        if step == "after_pending_cas":
            raise CrashPoint(step)

    async with open_engine(e.settings, crash_hook=hook) as crashing:
        try:
            await crashing.writer.append_shared([AppendGroup(tp, list(records))])
        except CrashPoint:
            pass
        except BaseExceptionGroup as group:
            if not group.subgroup(CrashPoint):
                raise
        else:
            raise AssertionError("the crash hook did not fire")


async def index_rows(e: Engine, tp: TopicPartition) -> list[tuple[int, IndexEntry, int]]:
    records = await e.oxia.range_scan(e.layout.index(tp, 0), e.layout.index_scan_end(tp),
                                      tp.partition_key)
    out = []
    for r in records:
        end = e.layout.index_end_offset(tp, r.key)
        assert end is not None
        out.append((end, IndexEntry.from_json(r.value), r.version_id))
    return out


async def compact(e: Engine, tp: TopicPartition, end: int, *, keep_record: bool = False
                  ) -> str:
    """Compact ``[cursor, end]`` exactly as docs/protocol.md's compact_once does (steps
    3-8). Returns the compacted blob's key. ``keep_record`` stops after step 5, leaving
    ``meta/compaction`` in state WRITING_COMPACTED_INDEX."""
    await e.writer.materialise_pending(tp)
    cursor_rec = await e.oxia.get(e.layout.compaction_cursor(tp), tp.partition_key)
    start = CompactionCursor.from_json(cursor_rec.value).offset if cursor_rec else 1
    read = await e.reader.read(tp, start, max_records=end - start + 1)
    values = [v for _, v in read.records]
    assert len(values) == end - start + 1
    body = codec.encode_batch(values)
    key = e.layout.compacted_object(tp, uuid.uuid4().hex)
    await e.s3.put(key, body)
    rows = [r for r in await index_rows(e, tp) if start <= r[0] <= end]
    tail_start = rows[-1][0] - rows[-1][1].msg_count + 1
    record = Compaction(
        compaction_id=uuid.uuid4().hex, state="WRITING_COMPACTED_INDEX", start_offset=start,
        end_offset=end, msg_count=end - start + 1, data_key=e.layout.uri(key),
        tail_entry_start_offset=tail_start, created_at_ms=now_ms(),
        crc32c=codec.crc32c(body),
    )
    await e.oxia.put(e.layout.compaction(tp), record.to_json(), tp.partition_key,
                     expected_version=EXPECT_NOT_EXISTS)
    if keep_record:
        return key
    entry = IndexEntry(type="COMPACTED", msg_count=end - start + 1, data_key=e.layout.uri(key),
                       created_at_ms=now_ms(), crc32c=codec.crc32c(body))
    await e.oxia.put(e.layout.index(tp, end), entry.to_json(), tp.partition_key)
    await e.oxia.delete_range(e.layout.index(tp, start), e.layout.index(tp, end),
                              tp.partition_key)
    await e.oxia.put(e.layout.compaction_cursor(tp), CompactionCursor(offset=end + 1).to_json(),
                     tp.partition_key)
    await e.oxia.delete(e.layout.compaction(tp), tp.partition_key)
    return key


async def recreate_stray(e: Engine, tp: TopicPartition, end: int, entry: IndexEntry) -> None:
    """A delayed materialising create landing inside a compacted range."""
    await e.oxia.put(e.layout.index(tp, end), entry.to_json(), tp.partition_key,
                     expected_version=EXPECT_NOT_EXISTS)


# -- metadata this release cannot read (garbage, or a newer format) ---------------------


async def _rewrite_first_index_entry(e: Engine, tp: TopicPartition,
                                     change: dict[str, Any] | None) -> None:
    (end, entry, version), *_ = await index_rows(e, tp)
    value = b"{not json" if change is None else json.dumps(
        {**entry.to_dict(), **change}).encode()
    await e.oxia.put(e.layout.index(tp, end), value, tp.partition_key,
                     expected_version=version)


async def _rewrite_pending(e: Engine, tp: TopicPartition, change: dict[str, Any]) -> None:
    record = await e.oxia.get(e.layout.control(tp), tp.partition_key)
    assert record is not None
    control = json.loads(record.value)
    assert control["pending"] is not None
    control["pending"].update(change)
    await e.oxia.put(e.layout.control(tp), json.dumps(control).encode(), tp.partition_key,
                     expected_version=record.version_id)


async def unreadable_metadata(e: Engine, tp: TopicPartition, how: str) -> None:
    """Make one of ``tp``'s records unreadable to this release, as ``how`` says."""
    changes: dict[str, Any] = {
        "index_not_json": lambda: _rewrite_first_index_entry(e, tp, None),
        "index_newer_encoding": lambda: _rewrite_first_index_entry(
            e, tp, {"encoding": "bytes-batch-v9"}),
        "index_unknown_type": lambda: _rewrite_first_index_entry(e, tp, {"type": "SNAPSHOT"}),
        "index_data_key_not_a_uri": lambda: _rewrite_first_index_entry(
            e, tp, {"data_key": "wal-shared/0123"}),
        "pending_newer_encoding": lambda: _rewrite_pending(
            e, tp, {"encoding": "bytes-batch-v9"}),
    }
    await changes[how]()


UNREADABLE = ("index_not_json", "index_newer_encoding", "index_unknown_type",
              "index_data_key_not_a_uri", "pending_newer_encoding")
