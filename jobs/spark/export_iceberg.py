"""export --format iceberg: append what the store holds past the table's high-water
offsets to an Apache Iceberg table (pyiceberg, no Spark runtime jar), partitioned by
topic and the UTC day of the append time.

The driver loads the catalog (:mod:`jobs.spark.iceberg_catalog`), loads or creates the
table and reads, per topic-partition, the last offset it holds (a table property,
:mod:`jobs.spark.iceberg_table`); reads the log bounds in a Spark stage; plans ranges
from ``max(log start, held + 1)`` to the high watermark; runs one Spark task per range
that writes data files through the table's FileIO (:mod:`jobs.spark.iceberg_files`);
and commits every file with the new high-water offsets in one transaction (one
snapshot). Offsets retention removed before they were exported are counted
(``records_lost_to_retention``), never waited for.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.metadata import now_ms
from jobs.spark.export_read import (
    JOB,
    ExportOptions,
    new_high_waters,
    plan_table_export,
    write_data_files,
)
from jobs.spark.iceberg_catalog import (
    check_location,
    file_io_properties,
    open_catalog,
    parse_properties,
    redacted,
)
from jobs.spark.iceberg_files import DATA_FILE_COLUMNS, iceberg_task
from jobs.spark.iceberg_table import commit, high_waters, open_table
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import finish

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_iceberg_export(spark: SparkSession, settings: Settings, options: ExportOptions,
                       report: Report) -> JobOutcome:
    """The job (see the module's docstring); exit 1 when the files do not hold the plan."""
    if options.table is None:
        raise ValueError("--format iceberg needs --table (NAMESPACE.NAME in the catalog)")
    if options.output is not None or options.verify_output:
        raise ValueError("--output and --verify-output are for --format parquet")
    started, payload = now_ms(), settings_payload(settings)
    catalog = open_catalog(options.catalog, settings,
                           parse_properties(options.catalog_properties))
    if warehouse := catalog.properties.get("warehouse"):  # before a table is created
        check_location(options.table, str(warehouse), settings)
    table = open_table(catalog, options.table)
    location = table.location().rstrip("/")
    check_location(options.table, location, settings)
    partitions, ranges, lost, expected = plan_table_export(
        spark, settings, payload, options, functools.partial(high_waters, table), report)
    task = functools.partial(iceberg_task, payload, location,
                             dict(file_io_properties(table.io.properties)))
    files = write_data_files(spark, task, DATA_FILE_COLUMNS, ranges, report) \
        if ranges else []
    exported = sum(int(f["records"]) for f in files)
    ok = exported == expected
    snapshot = table.current_snapshot()
    snapshot_id = None if snapshot is None else snapshot.snapshot_id
    if ok and files:  # a mismatch commits nothing: the table stays as it was
        snapshot_id = commit(table, [f["file"] for f in files], new_high_waters(files),
                             {"llog.job": JOB, "llog.root_prefix": settings.root_prefix})
    finished = now_ms()
    header = job_header(JOB, "ok" if ok else "mismatch", EXIT_OK if ok else EXIT_FINDINGS,
                        started, finished, settings, options)
    header["options"]["catalog_properties"] = redacted(options.catalog_properties)
    summary: dict[str, Any] = {
        **header,
        "table": options.table, "table_location": location, "snapshot_id": snapshot_id,
        "committed": ok and bool(files),
        "partitions": len(partitions), "ranges": len(ranges), "data_files": len(files),
        "records_expected": expected, "records_exported": exported,
        "records_lost_to_retention": lost,
        "bytes_exported": sum(int(f["bytes"]) for f in files),
    }
    return finish(spark, report, summary, f"{exported}/{expected} records, "
                                          f"snapshot {snapshot_id}")
