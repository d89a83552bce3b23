"""export: topic-partition offset ranges to Parquet (this module), or appended to a Delta
Lake table (``--format delta``: :mod:`jobs.spark.export_delta`) or an Apache Iceberg table
(``--format iceberg``: :mod:`jobs.spark.export_iceberg`).

The driver discovers the partitions, a first Spark stage reads their high watermarks
(the export's snapshot: records appended later are not exported), and the driver cuts
every partition's ``[--from-offset, min(--to-offset, high watermark)]`` into ranges of
``--range-records`` offsets. Each range is one Spark task that reads it with
:class:`LogReader` (the read protocol: pending, CEILING lookup, forward scans, strays
skipped, gaps reported) and writes it with pyarrow to ``{output}/part-{n}.parquet``.

Columns: ``topic`` (string), ``partition`` (int), ``offset`` (long), ``value``
(binary), ``value_utf8`` (string, null when the value is not valid UTF-8), ``key``
(binary, null when the record has none), ``headers`` (list of ``{name: string, value:
binary}`` in record order, empty when none), ``timestamp_ms`` (long, the producer's,
null when none) and ``append_time_ms`` (long, the broker's). Ranges start at each
partition's log start (retention). Part files are numbered in (topic, partition,
offset) order, rows inside them too. The output is a local (or shared) directory, or
any URI pyarrow's filesystems open.

    python -m jobs.spark.export --report /tmp/exp --output /tmp/orders.parquet --topic orders
    python -m jobs.spark.export --report /tmp/exp --format delta --table s3://lake/events
    python -m jobs.spark.export --report /tmp/exp --format iceberg --table llog.events \
        --catalog-property uri=sqlite:////tmp/iceberg.db \
        --catalog-property warehouse=s3://lake/iceberg
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.log_record import payload_value
from app.storage.metadata import now_ms
from app.storage.reader import LogReader
from jobs.spark.export_delta import run_delta_export
from jobs.spark.export_iceberg import run_iceberg_export
from jobs.spark.export_read import (
    FILE_COLUMNS,
    JOB,
    MAX_SLICES,
    RANGE_COLUMNS,
    READ_RECORDS,
    ExportOptions,
    PartRange,
    plan_ranges,
    ranges_task,
    read_batches,
    read_bounds,
    record_batch,
    record_schema,
    select_partitions,
)
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import base_parser, entry_point, finish, run_as_main
from jobs.spark.session import default_tasks, describe
from jobs.spark.tasks import task_attempt_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ExportOptions", "PartRange", "plan_ranges", "run_export", "write_part"]
RECORD_COLUMNS = ("topic string, partition int, offset long, value binary, "
                  "value_utf8 string, key binary, headers array<struct<name:string,"
                  "value:binary>>, timestamp_ms long, append_time_ms long")


def _filesystem(output: str) -> tuple[Any, str]:
    """A pyarrow filesystem and path for ``output`` (a local path or a URI)."""
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]

    if "://" not in output:
        output = "file://" + os.path.abspath(output)
    fs, path = pyarrow.fs.FileSystem.from_uri(output)
    return fs, str(path)



def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def temp_part_name(index: int, attempt: int) -> str:
    """The hidden name a part is written under before it is renamed into place.

    Unique per task attempt: a retried, speculative or zombie attempt of the same task
    writes its own file, so two attempts never write into (or rename away) each other's
    temporary file; whichever renames last replaces a whole file with an equal one.
    """
    return f".{part_name(index)}.attempt-{attempt}.tmp"


def _sweep_temporary_parts(fs: Any, base: str) -> None:
    """Remove what attempts that were killed midway left behind (hidden files, which
    readers skip anyway); best effort."""
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]

    for info in fs.get_file_info(pyarrow.fs.FileSelector(base)):
        if info.base_name.startswith(".part-") and info.base_name.endswith(".tmp"):
            with contextlib.suppress(OSError):
                fs.delete_file(info.path)



async def write_part(reader: LogReader, fs: Any, base: str, part: PartRange, attempt: int,
                     *, batch_records: int = READ_RECORDS) -> tuple[Any, ...]:
    """Write ``part`` to ``base/part-{index}.parquet``; a row of :data:`FILE_COLUMNS`.

    The file is written under a hidden temporary name and renamed when complete, so the
    committed name only ever holds a whole file, whichever attempt renamed it last.
    """
    import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

    schema = record_schema()
    tmp = f"{base}/{temp_part_name(part.index, attempt)}"
    records = size = 0
    try:
        with fs.open_output_stream(tmp) as stream, \
                pq.ParquetWriter(stream, schema, compression="snappy") as writer:
            async for got in read_batches(reader, part, batch_records):
                writer.write_batch(record_batch(schema, part, got))
                records += len(got)
                size += sum(len(payload_value(r.payload)) for r in got)
        fs.move(tmp, f"{base}/{part_name(part.index)}")
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)
        raise
    return (part.index, part.topic, part.partition, part.first, part.last, records, size,
            part_name(part.index))


def export_task(payload: Mapping[str, str], output: str,
                ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: write each range with :func:`write_part`.

    Records are read with :class:`LogReader` in batches and written with pyarrow as they
    come (no per-row serialisation through the JVM).
    """
    fs, base = _filesystem(output)
    attempt = task_attempt_id()

    async def write(reader: LogReader, part: PartRange) -> list[tuple[Any, ...]]:
        return [await write_part(reader, fs, base, part, attempt)]

    return ranges_task(payload, ranges, write, "exported %s offsets %d..%d")



def _prepare_output(output: str, mode: str) -> tuple[Any, str]:
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]

    fs, base = _filesystem(output)
    if fs.get_file_info(base).type != pyarrow.fs.FileType.NotFound:
        if mode != "overwrite":
            raise ValueError(f"{output} exists (pass --mode overwrite to replace it)")
        fs.delete_dir(base)
    fs.create_dir(base)
    return fs, base


def _write_parts(spark: SparkSession, payload: Mapping[str, str], output: str, mode: str,
                 ranges: Sequence[tuple[str, int, int, int]], report: Report) -> DataFrame:
    """One task per range; the tasks' file rows, written to ``report/files``."""
    fs, base = _prepare_output(output, mode)
    indexed = [(i, *r) for i, r in enumerate(ranges)]
    written_rows = spark.sparkContext.parallelize(
        indexed, max(1, min(len(indexed), MAX_SLICES))
    ).mapPartitions(functools.partial(export_task, payload, output))
    files = spark.createDataFrame(written_rows, FILE_COLUMNS, verifySchema=False)
    files_df = spark.read.parquet(report.write_table(files, "files"))
    _sweep_temporary_parts(fs, base)
    with fs.open_output_stream(f"{base}/_SUCCESS"):
        pass
    return files_df


def _per_partition(spark: SparkSession, bounds: Sequence[tuple[str, int, int, int]],
                   files: DataFrame) -> DataFrame:
    """Log start and high watermark against what the tasks exported, per partition."""
    from pyspark.sql import functions as F

    return spark.createDataFrame(
        list(bounds), "topic string, partition int, log_start long, high_watermark long",
    ).join(files.groupBy("topic", "partition").agg(
        F.sum("records").alias("records"), F.min("first_offset").alias("first_offset"),
        F.max("last_offset").alias("last_offset"), F.sum("bytes").alias("bytes"),
    ), ["topic", "partition"], "left_outer").orderBy("topic", "partition")


def _verify_output(spark: SparkSession, output: str) -> tuple[int, int]:
    """(records, duplicate offsets) of the written files, read back with Spark."""
    from pyspark.sql import functions as F

    describe(spark, "export: verifying the output")
    written = spark.read.schema(RECORD_COLUMNS).parquet(output)
    check = written.agg(F.count("*").alias("n"), F.countDistinct(
        "topic", "partition", "offset").alias("distinct")).collect()[0]
    return int(check["n"] or 0), int(check["n"] or 0) - int(check["distinct"] or 0)


def run_export(spark: SparkSession, settings: Settings, options: ExportOptions,
               report: Report) -> JobOutcome:
    from pyspark.sql import functions as F

    if options.range_records < 1:
        raise ValueError("--range-records must be positive")
    if options.format != "iceberg" and (options.catalog_properties or
                                        options.catalog != ExportOptions.catalog):
        raise ValueError("--catalog and --catalog-property are for --format iceberg")
    if options.format == "delta":
        return run_delta_export(spark, settings, options, report)
    if options.format == "iceberg":
        return run_iceberg_export(spark, settings, options, report)
    if options.output is None or options.table is not None:
        raise ValueError("--format parquet needs --output (--table is for --format delta "
                         "or iceberg)")
    output = options.output
    started = now_ms()
    tasks = default_tasks(spark, options.tasks)
    payload = settings_payload(settings)
    describe(spark, "export: discovering partitions")
    partitions = select_partitions(settings, options.topics, options.partitions)
    bounds = read_bounds(spark, payload, partitions, tasks)
    ranges = plan_ranges(bounds, options.from_offset, options.to_offset,
                         options.range_records)
    report.write_table(spark.createDataFrame(ranges, RANGE_COLUMNS), "ranges")
    expected = sum(last - first + 1 for _, _, first, last in ranges)
    describe(spark, f"export: {expected} records in {len(ranges)} ranges to {output}")
    # Every task checked that its range came out contiguous and complete; the counts
    # per partition come from the tasks' own file list. --verify-output re-reads it all.
    files = _write_parts(spark, payload, output, options.mode, ranges, report)
    report.write_table(_per_partition(spark, bounds, files), "partitions")
    totals = files.agg(F.sum("records").alias("n"), F.sum("bytes").alias("b")).collect()[0]
    exported, duplicates = int(totals["n"] or 0), 0
    if options.verify_output:
        exported, duplicates = _verify_output(spark, output)
    ok = exported == expected and duplicates == 0
    finished = now_ms()
    seconds = (finished - started) / 1000
    summary: dict[str, Any] = {
        **job_header(JOB, "ok" if ok else "mismatch", EXIT_OK if ok else EXIT_FINDINGS,
                     started, finished, settings.s3, settings.store, options),
        "output": output,
        "partitions": len(partitions),
        "ranges": len(ranges),
        "records_expected": expected,
        "records_exported": exported,
        "duplicate_offsets": duplicates,
        "bytes_exported": int(totals["b"] or 0),
        "records_per_s": round(exported / seconds, 1) if seconds else None,
    }
    return finish(spark, report, summary, f"{exported}/{expected} records")


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(JOB, "Export topic-partition offset ranges to Parquet files, or "
                              "append them to a Delta Lake or Apache Iceberg table.")
    parser.add_argument("--format", choices=("parquet", "delta", "iceberg"),
                        default="parquet",
                        help="parquet: a dataset of part files (--output); delta, iceberg: "
                             "append what the table does not hold yet to a Delta or "
                             "Iceberg table (--table)")
    parser.add_argument("--output", help="--format parquet: the Parquet dataset to write")
    parser.add_argument("--table", help="--format delta: the table, s3://bucket/prefix on "
                                        "the store's S3 endpoint, or a local path; "
                                        "--format iceberg: NAMESPACE.NAME in the catalog")
    parser.add_argument("--catalog", default="llog",
                        help="--format iceberg: the pyiceberg catalog's name (its "
                             "configuration: .pyiceberg.yaml, PYICEBERG_CATALOG__NAME__*)")
    parser.add_argument("--catalog-property", action="append", default=[],
                        dest="catalog_properties", metavar="KEY=VALUE",
                        help="--format iceberg: a catalog property, over its configuration "
                             "(repeatable; e.g. uri=sqlite:////path/catalog.db, "
                             "warehouse=s3://bucket/prefix)")
    parser.add_argument("--topic", action="append", default=[], dest="topics",
                        help="topic to export (repeatable; default: all)")
    parser.add_argument("--partition", action="append", type=int, default=[],
                        dest="partitions", help="partition to export (repeatable; "
                                                "default: all)")
    parser.add_argument("--from-offset", type=int, default=1)
    parser.add_argument("--to-offset", type=int, default=None,
                        help="last offset (inclusive; default: the high watermark)")
    parser.add_argument("--range-records", type=int, default=100_000,
                        help="offsets per Spark task")
    parser.add_argument("--mode", choices=("errorifexists", "overwrite"),
                        default="errorifexists", help="when --output exists")
    parser.add_argument("--verify-output", action="store_true",
                        help="read the written files back with Spark and check the count "
                             "and that no offset appears twice")
    return parser


main = entry_point(JOB, build_parser, run_export, ExportOptions)


if __name__ == "__main__":
    run_as_main("jobs.spark.export")
