"""backfill: bulk-load records from Parquet, JSON Lines or CSV through the commit protocol.

Records go through :meth:`LogWriter.append_shared` exactly like a broker's flushes: one
LLS1 blob per append holding a chunk of each of several partitions, one CAS per
partition, so offsets stay contiguous and correct while live brokers append to the same
partitions (a chunk's records get consecutive offsets; other writers' appends may fall
between two chunks).

Order: within a topic-partition, records keep the input order: input files by path,
then rows in file order.

Re-runs never duplicate (see docs/spark-jobs.md, "backfill: exactly once"):

- every chunk is appended with the idempotency key ``backfill/{job_id}/{chunk}``, which
  the partition's control record remembers in the committing CAS (last 64 keys);
- every ``--marker-every`` chunks (at most 32) a progress marker
  ``{root}/_jobs/backfill/{job_id}/progress/{topic}/{partition}/{next_chunk}.json`` is
  created (S3 conditional create); a re-run skips the chunks below the newest marker
  and checks the few after it against the remembered keys;
- if the 64-key window overflowed since the marker (other keyed writers), the job
  cannot tell whether the next chunk was committed: it stops that partition and
  reports ``ambiguous`` rather than risk a duplicate.

    python -m jobs.spark.backfill --report /tmp/bf --input data.parquet \\
        --topic-column topic --partition-column partition [--value-column value]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlparse

import anyio

from app.errors import InvalidRequest, LlogError
from app.settings import Settings
from app.storage.keys import TopicPartition, validate_partition, validate_topic
from app.storage.records import Control, now_ms
from app.storage.s3 import S3Store
from app.storage.writer import (
    IDEMPOTENCY_FIELD,
    IDEMPOTENCY_WINDOW,
    AppendGroup,
    AppendResult,
    LogWriter,
)
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import base_parser, run_main, run_module
from jobs.spark.session import default_tasks, describe
from jobs.spark.stores import Stores, job_object_key, open_stores
from jobs.spark.tasks import run_async, task_identity, task_logger

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

JOB = "backfill"
MiB = 1024 * 1024
MAX_MARKER_EVERY = IDEMPOTENCY_WINDOW // 2

CHUNK_COLUMNS = (
    "topic string, partition int, chunk long, records long, bytes long, status string, "
    "start_offset long, end_offset long, blob_key string, error string"
)
APPENDED = "appended"
SKIPPED_MARKER = "skipped_marker"  # below the newest progress marker
SKIPPED_COMMITTED = "skipped_committed"  # its idempotency key says it is committed
FAILED = "failed"
AMBIGUOUS = "ambiguous"  # key window overflowed: cannot prove it was not committed
NOT_ATTEMPTED = "not_attempted"  # an earlier chunk of the partition did not commit
OK_STATUSES = (APPENDED, SKIPPED_MARKER, SKIPPED_COMMITTED)


@dataclass(frozen=True)
class BackfillOptions:
    inputs: tuple[str, ...]
    input_format: str | None = None  # parquet | json | csv; None: by file extension
    value_column: str = "value"
    value_encoding: str = "auto"  # auto | utf8 | base64 | hex | binary
    topic_column: str | None = None
    partition_column: str | None = None
    topic: str | None = None
    partition: int | None = None
    csv_header: bool = True
    job_id: str | None = None
    chunk_records: int = 5000
    chunk_bytes: int = 4 * MiB
    blob_bytes: int = 16 * MiB
    marker_every: int = 16
    tasks: int = 0
    max_records_per_second: float = 0.0  # per task; 0: unlimited


@dataclass(frozen=True)
class TaskParams:
    job_id: str
    blob_bytes: int
    marker_every: int
    max_records_per_second: float


# -- idempotency: the resume rule, pure ------------------------------------------------


def chunk_key(job_id: str, chunk: int) -> str:
    return f"backfill/{job_id}/{chunk}"


def resume_decision(control: Control | None, key: str, bound: int
                    ) -> tuple[str, tuple[int, int] | None]:
    """Was the chunk with idempotency ``key`` committed? ``bound`` is the end offset of
    the newest append of this job known to precede it (or the high watermark when the
    job first touched the partition).

    Returns ``("committed", (start, end))``, ``("not_committed", None)`` or
    ``("ambiguous", None)``. The writer remembers the last 64 keys of a partition in
    commit order and forgets the oldest first. If the chunk had been committed, it was
    after offset ``bound``; so if the oldest remembered key starts at or below
    ``bound``, nothing committed after ``bound`` has been forgotten, and the key's
    absence proves the chunk was not committed. A table that never filled up has
    forgotten nothing at all.
    """
    table = control.extra.get(IDEMPOTENCY_FIELD) if control is not None else None
    if not isinstance(table, dict):
        return "not_committed", None
    entry = table.get(key)
    if isinstance(entry, list) and len(entry) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in entry[:2]):
        return "committed", (int(entry[0]), int(entry[1]))
    if len(table) < IDEMPOTENCY_WINDOW:
        return "not_committed", None
    starts = [e[0] for e in table.values()
              if isinstance(e, list) and e and isinstance(e[0], int)]
    if starts and min(starts) <= bound:
        return "not_committed", None
    return "ambiguous", None


# -- the Spark task --------------------------------------------------------------------


@dataclass
class _Unit:
    tp: TopicPartition
    chunk: int
    records: list[bytes]

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.records)


@dataclass
class _TpState:
    marker_next: int = 0  # chunks below this are done (newest progress marker)
    bound: int = 0
    verifying: bool = False
    failed: bool = False
    since_marker: int = 0
    next_chunk: int = 0


class _RecordingS3:
    """The task's S3Store, remembering the key of the last PUT (the blob of a flush)."""

    def __init__(self, s3: S3Store) -> None:
        self._s3 = s3
        self.last_put: str | None = None

    async def put(self, key: str, body: bytes) -> None:
        await self._s3.put(key, body)
        self.last_put = key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)


@dataclass
class _Task:
    stores: Stores
    writer: LogWriter
    recorder: _RecordingS3
    params: TaskParams
    results: list[tuple[Any, ...]] = field(default_factory=list)
    states: dict[TopicPartition, _TpState] = field(default_factory=dict)
    appended_records: int = 0
    appends: int = 0
    started: float = field(default_factory=time.monotonic)

    def marker_prefix(self, tp: TopicPartition) -> str:
        return job_object_key(self.stores.layout, "backfill", self.params.job_id, "progress",
                              tp.topic, str(tp.partition), "")

    def result(self, unit: _Unit, status: str, start: int | None = None,
               end: int | None = None, blob: str | None = None,
               error: str | None = None) -> None:
        self.results.append((unit.tp.topic, unit.tp.partition, unit.chunk, len(unit.records),
                             unit.size, status, start, end, blob, error))

    async def read_control(self, tp: TopicPartition) -> Control | None:
        record = await self.stores.oxia.get(self.stores.layout.control(tp), tp.partition_key)
        return None if record is None else Control.from_json(record.value)

    async def state(self, tp: TopicPartition) -> _TpState:
        """The partition's progress: from its newest marker, or a fresh start marker."""
        state = self.states.get(tp)
        if state is not None:
            return state
        newest: str | None = None
        async for info in self.stores.s3.list(self.marker_prefix(tp)):
            if newest is None or info.key > newest:
                newest = info.key
        if newest is None:
            control = await self.read_control(tp)
            hw = control.sequence_counter if control is not None else 0
            state = _TpState(bound=hw)
            await self.write_marker(tp, state, 0)
        else:
            marker = json.loads(await self.stores.s3.get(newest))
            state = _TpState(marker_next=int(marker["next_chunk"]),
                             bound=int(marker["bound_offset"]), verifying=True)
            state.next_chunk = state.marker_next
        self.states[tp] = state
        return state

    async def write_marker(self, tp: TopicPartition, state: _TpState, next_chunk: int) -> None:
        body = json.dumps({
            "job_id": self.params.job_id, "topic": tp.topic, "partition": tp.partition,
            "next_chunk": next_chunk, "bound_offset": state.bound, "written_at_ms": now_ms(),
        }, sort_keys=True).encode()
        # Conditional create: a marker is written once and never changes.
        await self.stores.s3.create_if_absent(
            f"{self.marker_prefix(tp)}{next_chunk:012d}.json", body)
        state.since_marker = 0
        state.marker_next = max(state.marker_next, next_chunk)

    async def admit(self, unit: _Unit) -> bool:
        """Should this unit be appended? Records the outcome of those that should not."""
        state = await self.state(unit.tp)
        if state.failed:
            self.result(unit, NOT_ATTEMPTED, error="an earlier chunk did not commit")
            return False
        if unit.chunk < state.marker_next:
            self.result(unit, SKIPPED_MARKER)
            return False
        if state.verifying:
            control = await self.read_control(unit.tp)
            verdict, offsets = resume_decision(
                control, chunk_key(self.params.job_id, unit.chunk), state.bound)
            if verdict == "committed":
                assert offsets is not None
                self.result(unit, SKIPPED_COMMITTED, offsets[0], offsets[1])
                await self.done(unit, state, offsets[1])
                return False
            if verdict == "ambiguous":
                state.failed = True
                self.result(unit, AMBIGUOUS, error=(
                    "the partition's idempotency window (64 keys) overflowed since the "
                    "last progress marker; cannot prove this chunk was not committed"))
                return False
            state.verifying = False  # not committed, so no later chunk was either
        return True

    async def done(self, unit: _Unit, state: _TpState, end: int) -> None:
        state.bound = end
        state.next_chunk = unit.chunk + 1
        state.since_marker += 1
        if state.since_marker >= self.params.marker_every:
            await self.write_marker(unit.tp, state, state.next_chunk)

    async def flush(self, units: list[_Unit]) -> None:
        if not units:
            return
        await self.throttle(sum(len(u.records) for u in units))
        groups = [AppendGroup(u.tp, u.records, chunk_key(self.params.job_id, u.chunk))
                  for u in units]
        self.recorder.last_put = None
        try:
            results = await self.writer.append_shared(groups)
        except LlogError as exc:
            results = [exc for _ in units]
        ours = self.recorder.last_put
        for unit, res in zip(units, results, strict=True):
            state = self.states[unit.tp]
            if isinstance(res, AppendResult):
                # The writer answers a key it remembers with the first append's offsets
                # (a retried or duplicated Spark task): then our blob was not used.
                blob = self.stores.layout.parse_uri(res.wal_uri)[1]
                status = APPENDED if blob == ours else SKIPPED_COMMITTED
                self.result(unit, status, res.start_offset, res.end_offset, blob)
                if status == APPENDED:
                    self.appended_records += res.count
                await self.done(unit, state, res.end_offset)
            else:
                state.failed = True
                self.result(unit, FAILED, error=f"{res.error_type}: {res}")
        self.appends += 1

    async def throttle(self, records: int) -> None:
        rate = self.params.max_records_per_second
        if rate <= 0:
            return
        ahead = (self.appended_records + records) / rate - (time.monotonic() - self.started)
        if ahead > 0:
            await anyio.sleep(ahead)

    async def finish(self) -> None:
        for tp, state in self.states.items():
            if state.since_marker > 0:
                await self.write_marker(tp, state, state.next_chunk)


def read_staged(uri: str, batch_rows: int = 8192) -> Iterator[tuple[int, str, int, bytes]]:
    """Rows ``(chunk, topic, partition, value)`` of one staged Parquet file, in order."""
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    with fs.open_input_file(path) as fh:
        parquet = pq.ParquetFile(fh)
        for batch in parquet.iter_batches(batch_size=batch_rows,
                                          columns=["_chunk", "topic", "partition", "value"]):
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                           batch.column(2).to_pylist(), batch.column(3).to_pylist(),
                           strict=True)


def _units(rows: Iterable[tuple[int, str, int, bytes]]) -> Iterator[_Unit]:
    """Group rows sorted by (chunk, topic, partition, position): one unit per chunk."""
    unit: _Unit | None = None
    for chunk, topic, partition, value in rows:
        if unit is None or unit.chunk != chunk or unit.tp.topic != topic or (
                unit.tp.partition != partition):
            if unit is not None:
                yield unit
            unit = _Unit(TopicPartition(topic, partition), int(chunk), [])
        unit.records.append(value)
    if unit is not None:
        yield unit


def backfill_task(payload: Mapping[str, str], params: TaskParams,
                  files: Iterable[str]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: append the chunks of each staged file.

    A staged file holds every row of a set of topic-partitions, sorted by (chunk,
    topic, partition, position); the task reads it with pyarrow (no per-row
    serialisation between the JVM and Python) and packs the next chunk of each of its
    partitions into one shared blob per append.
    """
    logger = task_logger(JOB)
    todo = list(files)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            recorder = _RecordingS3(stores.s3)
            writer = LogWriter(stores.oxia, cast(S3Store, recorder), stores.layout,
                               stores.metrics, max_attempts=stores.settings.commit_max_attempts)
            async with writer:
                task = _Task(stores, writer, recorder, params)
                last_log = time.monotonic()
                for uri in todo:
                    batch: list[_Unit] = []
                    size = 0
                    # Reading the file blocks the event loop briefly per row batch; the
                    # writer's background work just waits meanwhile.
                    for unit in _units(read_staged(uri)):
                        if batch and (unit.tp in {u.tp for u in batch}
                                      or size + unit.size > params.blob_bytes):
                            await task.flush(batch)
                            batch, size = [], 0
                        # After the flush: a chunk whose predecessor just failed must not
                        # be appended (its partition's order would break).
                        if not await task.admit(unit):
                            continue
                        batch.append(unit)
                        size += unit.size
                        if time.monotonic() - last_log > 10:
                            last_log = time.monotonic()
                            logger.info("%d records appended in %d appends so far",
                                        task.appended_records, task.appends)
                    await task.flush(batch)
                await task.finish()
                out.extend(task.results)
                logger.info("task done: %d records appended in %d appends, %d partitions",
                            task.appended_records, task.appends, len(task.states))

    run_async(run)
    return iter(out)


# -- the driver ------------------------------------------------------------------------


_SUFFIXES = ((".parquet", "parquet"), (".jsonl", "json"), (".ndjson", "json"),
             (".json", "json"), (".csv", "csv"))


def _format_of(path: str) -> str:
    """The input format from the name, or from the files of a local directory."""
    lowered = path.lower().rstrip("/")
    for suffix, fmt in _SUFFIXES:
        if lowered.endswith(suffix):
            return fmt
    local = urlparse(path)
    if local.scheme in ("", "file") and os.path.isdir(local.path):
        found = {fmt for name in os.listdir(local.path)
                 if not name.startswith(("_", ".")) for suffix, fmt in _SUFFIXES
                 if name.lower().endswith(suffix)}
        if len(found) == 1:
            return found.pop()
    raise ValueError(f"cannot tell the format of {path!r}: pass --format parquet|json|csv")


def read_input(spark: SparkSession, options: BackfillOptions) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    formats = {options.input_format or _format_of(p) for p in options.inputs}
    if len(formats) != 1:
        raise ValueError(f"inputs of several formats {sorted(formats)}: one run, one format")
    fmt = formats.pop()
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", str(options.csv_header).lower())
    raw = reader.load(list(options.inputs))
    columns = set(raw.columns)
    for name in (options.value_column, options.topic_column, options.partition_column):
        if name is not None and name not in columns:
            raise ValueError(f"column {name!r} not in the input (columns: {sorted(columns)})")

    value = F.col(options.value_column)
    dtype = raw.schema[options.value_column].dataType
    encoding = options.value_encoding
    if encoding == "auto":
        encoding = "binary" if isinstance(dtype, BinaryType) else "utf8"
    if encoding == "binary":
        if not isinstance(dtype, BinaryType):
            raise ValueError(f"--value-encoding binary needs a binary column, not {dtype}")
        value_expr: Column = value
    elif not isinstance(dtype, StringType):
        raise ValueError(f"value column {options.value_column!r} is {dtype}: "
                         "expected a string or binary column")
    elif encoding == "utf8":
        value_expr = F.encode(value, "UTF-8")
    elif encoding == "base64":
        value_expr = F.unbase64(value)
    elif encoding == "hex":
        value_expr = F.unhex(value)
    else:
        raise ValueError(f"unknown --value-encoding {encoding!r}")
    topic_expr = (F.col(options.topic_column).cast("string") if options.topic_column
                  else F.lit(options.topic))
    partition_expr = (F.col(options.partition_column).cast("int")
                      if options.partition_column else F.lit(options.partition or 0))
    return raw.select(
        topic_expr.alias("topic"),
        partition_expr.alias("partition"),
        value_expr.alias("value"),
        F.col("_metadata.file_path").alias("_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_mono"),
    )


def _input_fingerprint(df: DataFrame) -> list[list[Any]]:
    files: list[list[Any]] = []
    for uri in sorted(df.inputFiles()):
        parsed = urlparse(uri)
        size: int | None = None
        mtime: int | None = None
        if parsed.scheme in ("", "file"):
            try:
                st = os.stat(unquote(parsed.path))
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:
                pass
        files.append([uri, size, mtime])
    return files


def plan_input(df: DataFrame) -> dict[str, list[int]]:
    """Per topic-partition record and byte counts; refuses null values and bad names."""
    from pyspark.sql import functions as F

    rows = df.groupBy("topic", "partition").agg(
        F.count("*").alias("records"),
        F.sum(F.length("value")).alias("bytes"),
        F.sum(F.when(F.col("value").isNull(), 1).otherwise(0)).alias("nulls"),
    ).collect()
    problems: list[str] = []
    plan: dict[str, list[int]] = {}
    for r in rows:
        try:
            tp = TopicPartition(validate_topic(r["topic"]), validate_partition(r["partition"]))
        except InvalidRequest as exc:
            problems.append(f"{r['records']} rows: {exc}")
            continue
        if r["nulls"]:
            problems.append(f"{tp}: {r['nulls']} rows have a null value")
        plan[str(tp)] = [int(r["records"]), int(r["bytes"] or 0)]
    if problems:
        raise ValueError("input refused:\n  " + "\n  ".join(sorted(problems)[:20]))
    return dict(sorted(plan.items()))


def _manifest(settings: Settings, job_id: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create the job manifest, or return the one a previous run of this job created."""
    payload = settings_payload(settings)
    body = json.dumps(manifest, sort_keys=True, indent=1).encode()

    async def run() -> dict[str, Any]:
        async with open_stores(payload, task_identity(JOB)) as stores:
            key = job_object_key(stores.layout, "backfill", job_id, "job.json")
            if await stores.s3.create_if_absent(key, body):
                return manifest
            existing: dict[str, Any] = json.loads(await stores.s3.get(key))
            return existing

    return run_async(run)


def _check_options(options: BackfillOptions) -> None:
    if (options.topic_column is None) == (options.topic is None):
        raise ValueError("give exactly one of --topic-column and --topic")
    if options.partition_column is not None and options.partition is not None:
        raise ValueError("give at most one of --partition-column and --partition")
    if not 1 <= options.marker_every <= MAX_MARKER_EVERY:
        raise ValueError(f"--marker-every must be 1..{MAX_MARKER_EVERY} (half the "
                         f"{IDEMPOTENCY_WINDOW}-key idempotency window)")
    if options.chunk_records < 1 or options.chunk_bytes < 1 or options.blob_bytes < 1:
        raise ValueError("chunk and blob sizes must be positive")


def _job_identity(settings: Settings, options: BackfillOptions, df: DataFrame,
                  plan: dict[str, list[int]], started: int) -> str:
    """The job id (given, or a hash of input files, columns, chunking and counts), its
    manifest created; a re-run whose chunking or counts differ is refused."""
    chunking = {
        "value_column": options.value_column, "value_encoding": options.value_encoding,
        "topic_column": options.topic_column, "partition_column": options.partition_column,
        "topic": options.topic, "partition": options.partition,
        "chunk_records": options.chunk_records, "chunk_bytes": options.chunk_bytes,
        "plan": plan,
    }
    job_id = options.job_id or hashlib.sha256(json.dumps(
        {"inputs": _input_fingerprint(df), **chunking}, sort_keys=True).encode()
    ).hexdigest()[:16]
    manifest = _manifest(settings, job_id, {"job_id": job_id, "created_ms": started,
                                            "inputs": list(options.inputs), **chunking})
    changed = [k for k, v in chunking.items() if manifest.get(k) != v]
    if changed:
        raise ValueError(
            f"job {job_id} was first run with different {', '.join(changed)}: a re-run "
            "must see the same input and chunking to skip what is committed (or use a "
            "new --job-id)")
    return job_id


def _stage_chunks(spark: SparkSession, df: DataFrame, options: BackfillOptions, tasks: int,
                  staging: str) -> list[str]:
    """Number every record's chunk, sort, and stage the rows as Parquet (one file per
    Spark partition, each holding whole topic-partitions in order); the file paths."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("topic", "partition").orderBy("_file", "_block", "_mono")
    cumulative = F.sum(F.length("value")).over(
        w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    rn = F.row_number().over(w) - 1
    before = cumulative - F.length("value")
    ordered = (
        df.repartition(tasks, "topic", "partition")
        .withColumn("_rn", rn)
        .withColumn("_chunk", F.greatest(
            F.floor(F.col("_rn") / F.lit(options.chunk_records)),
            F.floor(before / F.lit(options.chunk_bytes))).cast("long"))
        .sortWithinPartitions("_chunk", "topic", "partition", "_rn")
        .select("_chunk", "topic", "partition", "value")
    )
    ordered.write.mode("overwrite").option("maxRecordsPerFile", 0).parquet(staging)
    return sorted(spark.read.parquet(staging).inputFiles())


def _append_staged(spark: SparkSession, settings: Settings, files: Sequence[str],
                   params: TaskParams, report: Report) -> tuple[DataFrame, float]:
    """One append task per staged file; the chunk outcomes (``report/chunks``) and the
    seconds the appends took."""
    body = functools.partial(backfill_task, settings_payload(settings), params)
    appended = spark.sparkContext.parallelize(files, max(1, len(files))).mapPartitions(body)
    results = spark.createDataFrame(appended, CHUNK_COLUMNS, verifySchema=False)
    t0 = time.monotonic()
    chunks = spark.read.parquet(report.write_table(results, "chunks"))
    return chunks, time.monotonic() - t0


def _per_partition(chunks: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    ok = F.col("status").isin(*OK_STATUSES)
    return chunks.groupBy("topic", "partition").agg(
        F.sum(F.when(F.col("status") == APPENDED, F.col("records")).otherwise(0))
        .alias("records_appended"),
        F.sum(F.when(ok, F.col("records")).otherwise(0)).alias("records_done"),
        F.sum("records").alias("records_input"),
        F.min("start_offset").alias("first_offset"),
        F.max("end_offset").alias("last_offset"),
        F.count("*").alias("chunks"),
        F.sum(F.when(ok, 0).otherwise(1)).alias("chunks_failed"),
    ).orderBy("topic", "partition")


def _statuses(chunks: DataFrame) -> dict[str, dict[str, int]]:
    from pyspark.sql import functions as F

    return {r["status"]: {"chunks": int(r["n"]), "records": int(r["records"] or 0),
                          "bytes": int(r["bytes"] or 0)}
            for r in chunks.groupBy("status").agg(
                F.count("*").alias("n"), F.sum("records").alias("records"),
                F.sum("bytes").alias("bytes")).collect()}


def _summary(settings: Settings, options: BackfillOptions, job_id: str, started: int,
             seconds: float, plan: dict[str, list[int]], statuses: dict[str, dict[str, int]]
             ) -> dict[str, Any]:
    total_records = sum(v[0] for v in plan.values())
    done = statuses.get(APPENDED, {"records": 0, "bytes": 0, "chunks": 0})
    bad = sum(v["chunks"] for k, v in statuses.items() if k not in OK_STATUSES)
    done_records = sum(v["records"] for k, v in statuses.items() if k in OK_STATUSES)
    complete = bad == 0 and done_records == total_records
    return {
        **job_header(JOB, "ok" if complete else "incomplete",
                     EXIT_OK if complete else EXIT_FINDINGS, started, now_ms(), settings,
                     options),
        "job_id": job_id,
        "append_seconds": round(seconds, 3),
        "partitions": len(plan),
        "records_input": total_records,
        "bytes_input": sum(v[1] for v in plan.values()),
        "records_done": done_records,
        "records_appended": done["records"],
        "bytes_appended": done["bytes"],
        "statuses": statuses,
        "records_per_s": round(done["records"] / seconds, 1) if seconds else None,
        "mib_per_s": round(done["bytes"] / MiB / seconds, 3) if seconds else None,
    }


def run_backfill(spark: SparkSession, settings: Settings, options: BackfillOptions,
                 report: Report) -> JobOutcome:
    _check_options(options)
    started = now_ms()
    tasks = default_tasks(spark, options.tasks)
    describe(spark, f"backfill: reading {len(options.inputs)} input path(s)")
    df = read_input(spark, options)
    plan = plan_input(df)
    job_id = _job_identity(settings, options, df, plan, started)
    describe(spark, f"backfill {job_id}: {sum(v[0] for v in plan.values())} records, "
             f"{sum(v[1] for v in plan.values())} bytes in {len(plan)} partitions, "
             f"{tasks} tasks")
    describe(spark, f"backfill {job_id}: staging sorted chunks")
    staging = report.path("staging")
    files = _stage_chunks(spark, df, options, tasks, staging)
    describe(spark, f"backfill {job_id}: appending from {len(files)} staged files")
    params = TaskParams(job_id, options.blob_bytes, options.marker_every,
                        options.max_records_per_second)
    chunks, seconds = _append_staged(spark, settings, files, params, report)
    shutil.rmtree(staging, ignore_errors=True)
    report.write_table(_per_partition(chunks), "partitions")
    summary = _summary(settings, options, job_id, started, seconds, plan, _statuses(chunks))
    report.write_summary(summary)
    describe(spark, f"backfill {job_id}: {summary['status']}: "
             f"{summary['records_appended']} records appended, "
             f"{summary['records_done']}/{summary['records_input']} done")
    return JobOutcome(summary, summary["exit_code"])


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(JOB, "Bulk-load records from Parquet, JSON Lines or CSV through "
                              "the commit protocol; re-runs never duplicate.")
    parser.add_argument("--input", action="append", required=True, dest="inputs",
                        help="input file or directory (repeatable)")
    parser.add_argument("--format", choices=("parquet", "json", "csv"), default=None,
                        dest="input_format",
                        help="input format (default: from the file extension)")
    parser.add_argument("--value-column", default="value")
    parser.add_argument("--value-encoding", default="auto",
                        choices=("auto", "utf8", "base64", "hex", "binary"),
                        help="how a string value column becomes bytes (auto: binary "
                             "columns as they are, strings as UTF-8)")
    parser.add_argument("--topic-column", default=None)
    parser.add_argument("--partition-column", default=None)
    parser.add_argument("--topic", default=None, help="one topic for every row")
    parser.add_argument("--partition", type=int, default=None,
                        help="one partition for every row (default 0 without a column)")
    parser.add_argument("--no-csv-header", action="store_false", dest="csv_header",
                        help="CSV files have no header line (columns are _c0, _c1, ...)")
    parser.add_argument("--job-id", default=None,
                        help="identity of this backfill (default: a hash of the input "
                             "files, columns and chunking); re-runs must use the same")
    parser.add_argument("--chunk-records", type=int, default=5000,
                        help="records per chunk (one append of one partition)")
    parser.add_argument("--chunk-bytes", type=int, default=4 * MiB,
                        help="bytes per chunk")
    parser.add_argument("--blob-bytes", type=int, default=16 * MiB,
                        help="target size of one shared blob (chunks of several "
                             "partitions)")
    parser.add_argument("--marker-every", type=int, default=16,
                        help=f"chunks between progress markers (1..{MAX_MARKER_EVERY})")
    parser.add_argument("--max-records-per-second", type=float, default=0.0,
                        help="rate limit per Spark task (0: none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(JOB, build_parser(), argv, run_backfill, BackfillOptions)


if __name__ == "__main__":
    sys.exit(run_module(JOB))
