"""export --format delta: append what the store holds past the table's high-water offsets
to a Delta table, partitioned by topic and the UTC date of the append time.

The driver opens (or creates) the table and reads, per topic-partition, the last offset
it holds (its transaction version, :mod:`jobs.spark.delta_table`); reads the log bounds
in a Spark stage; plans ranges from ``max(log start, held + 1)`` to the high watermark;
runs one Spark task per range that writes data files (:mod:`jobs.spark.delta_files`);
and commits every file with the new high-water offsets in one Delta commit. Offsets
retention removed before they were exported are counted (``records_lost_to_retention``),
never waited for.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.metadata import now_ms
from jobs.spark.delta_files import DATA_FILE_COLUMNS, delta_task
from jobs.spark.delta_location import table_location
from jobs.spark.delta_table import commit, high_waters, open_table
from jobs.spark.export_read import (
    JOB,
    ExportOptions,
    new_high_waters,
    plan_table_export,
    write_data_files,
)
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import finish

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

def run_delta_export(spark: SparkSession, settings: Settings, options: ExportOptions,
                     report: Report) -> JobOutcome:
    """The job (see the module's docstring); exit 1 when the files do not hold the plan."""
    if options.table is None:
        raise ValueError("--format delta needs --table (s3://bucket/prefix or a path)")
    if options.output is not None or options.verify_output:
        raise ValueError("--output and --verify-output are for --format parquet")
    started, payload = now_ms(), settings_payload(settings)
    table = open_table(table_location(options.table, settings))
    partitions, ranges, lost, expected = plan_table_export(
        spark, settings, payload, options, functools.partial(high_waters, table), report)
    task = functools.partial(delta_task, payload, options.table)
    files = write_data_files(spark, task, DATA_FILE_COLUMNS, ranges, report) \
        if ranges else []
    exported = sum(int(f["records"]) for f in files)
    ok = exported == expected
    version = table.version()
    if ok and files:  # a mismatch commits nothing: the table stays as it was
        version = commit(table, files, new_high_waters(files),
                         {"llog.job": JOB, "llog.root_prefix": settings.root_prefix})
    finished = now_ms()
    summary: dict[str, Any] = {
        **job_header(JOB, "ok" if ok else "mismatch", EXIT_OK if ok else EXIT_FINDINGS,
                     started, finished, settings, options),
        "table": options.table, "table_version": version, "committed": ok and bool(files),
        "partitions": len(partitions), "ranges": len(ranges), "data_files": len(files),
        "records_expected": expected, "records_exported": exported,
        "records_lost_to_retention": lost,
        "bytes_exported": sum(int(f["bytes"]) for f in files),
    }
    return finish(spark, report, summary, f"{exported}/{expected} records, "
                                          f"table version {version}")
