"""backfill: bulk-load records from Parquet, JSON Lines or CSV through the commit protocol.

Records go through :meth:`LogWriter.append_shared` exactly like a broker's flushes: one
LLS1 blob per append holding a chunk of each of several partitions, one CAS per
partition, so offsets stay contiguous and correct while live brokers append to the same
partitions (a chunk's records get consecutive offsets; other writers' appends may fall
between two chunks).

Records carry the input's ``key``, ``headers`` and ``timestamp_ms`` columns when it
has them (the columns export writes); rows without any of them stay plain values.

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
import shutil
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from app.settings import S3Settings, Settings, StoreSettings
from app.storage.idempotency import IDEMPOTENCY_WINDOW
from app.storage.metadata import now_ms
from jobs.spark.backfill_appends import (
    APPENDED,
    CHUNK_COLUMNS,
    JOB,
    OK_STATUSES,
    TaskParams,
    backfill_task,
)
from jobs.spark.backfill_input import (
    RECORD_FIELDS,
    field_options,
    input_fingerprint,
    plan_input,
    read_input,
)
from jobs.spark.backfill_options import BackfillOptions, MiB
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import base_parser, entry_point, finish, run_as_main
from jobs.spark.session import default_tasks, describe
from jobs.spark.stores import job_object_key, open_stores
from jobs.spark.tasks import run_async, task_identity

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


MAX_MARKER_EVERY = IDEMPOTENCY_WINDOW // 2





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
    chunking: dict[str, Any] = {
        "value_column": options.value_column, "value_encoding": options.value_encoding,
        "topic_column": options.topic_column, "partition_column": options.partition_column,
        "topic": options.topic, "partition": options.partition,
        "chunk_records": options.chunk_records, "chunk_bytes": options.chunk_bytes,
        "plan": plan,
    }
    # Only when records carry fields: a job of plain values keeps the identity (and
    # manifest) it had before record fields existed, so its re-runs still skip.
    fields = {name: column or name for name, column in field_options(options).items()
              if name in df.columns}
    if fields:
        chunking["record_fields"] = fields
        if "key" in fields:
            chunking["key_encoding"] = options.key_encoding
    job_id = options.job_id or hashlib.sha256(json.dumps(
        {"inputs": input_fingerprint(df), **chunking}, sort_keys=True).encode()
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
    cumulative = F.sum("_size").over(
        w.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    rn = F.row_number().over(w) - 1
    before = cumulative - F.col("_size")
    fields = [name for name in RECORD_FIELDS if name in df.columns]
    ordered = (
        df.repartition(tasks, "topic", "partition")
        .withColumn("_rn", rn)
        .withColumn("_chunk", F.greatest(
            F.floor(F.col("_rn") / F.lit(options.chunk_records)),
            F.floor(before / F.lit(options.chunk_bytes))).cast("long"))
        .sortWithinPartitions("_chunk", "topic", "partition", "_rn")
        .select("_chunk", "topic", "partition", "value", *fields)
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


def _summary(s3: S3Settings, store: StoreSettings, options: BackfillOptions, job_id: str,
             started: int, seconds: float, plan: dict[str, list[int]],
             statuses: dict[str, dict[str, int]]) -> dict[str, Any]:
    total_records = sum(v[0] for v in plan.values())
    done = statuses.get(APPENDED, {"records": 0, "bytes": 0, "chunks": 0})
    bad = sum(v["chunks"] for k, v in statuses.items() if k not in OK_STATUSES)
    done_records = sum(v["records"] for k, v in statuses.items() if k in OK_STATUSES)
    complete = bad == 0 and done_records == total_records
    return {
        **job_header(JOB, "ok" if complete else "incomplete",
                     EXIT_OK if complete else EXIT_FINDINGS, started, now_ms(), s3, store,
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
    summary = _summary(settings.s3, settings.store, options, job_id, started, seconds, plan,
                       _statuses(chunks))
    return finish(spark, report, summary, f"{job_id}: {summary['records_appended']} "
                  f"records appended, {summary['records_done']}/{summary['records_input']} "
                  "done")


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
    parser.add_argument("--key-column", default=None,
                        help="the records' keys (default: the column 'key' if the input "
                             "has one; '' for none)")
    parser.add_argument("--key-encoding", default="auto",
                        choices=("auto", "utf8", "base64", "hex", "binary"),
                        help="how a string key column becomes bytes (as --value-encoding)")
    parser.add_argument("--headers-column", default=None,
                        help="the records' headers, a list of {name, value} (default: the "
                             "column 'headers' if the input has one; '' for none)")
    parser.add_argument("--timestamp-column", default=None,
                        help="the producers' timestamps in ms (default: the column "
                             "'timestamp_ms' if the input has one; '' for none)")
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


main = entry_point(JOB, build_parser, run_backfill, BackfillOptions)


if __name__ == "__main__":
    run_as_main("jobs.spark.backfill")
