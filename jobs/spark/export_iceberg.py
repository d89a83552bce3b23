"""export --format iceberg: append what the store holds past the table's high-water
offsets to an Apache Iceberg table (pyiceberg, no Spark runtime jar), partitioned by
topic and the UTC day of the append time.

The steps are every table export's (:mod:`jobs.spark.table_export`); the table's are
Iceberg's: the driver loads the catalog (:mod:`jobs.spark.iceberg_catalog`), loads or
creates the table and reads, per topic-partition, the last offset it holds (a table
property, :mod:`jobs.spark.iceberg_table`); each Spark task writes the data files of a
range through the table's FileIO (:mod:`jobs.spark.iceberg_files`); every file is
committed with the new high-water offsets in one transaction (one snapshot).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.keys import TopicPartition
from jobs.spark.export_read import ExportOptions
from jobs.spark.iceberg_catalog import (
    check_location,
    file_io_properties,
    open_catalog,
    parse_properties,
    redacted,
)
from jobs.spark.iceberg_files import DATA_FILE_COLUMNS, iceberg_task
from jobs.spark.iceberg_table import commit, high_waters, open_table
from jobs.spark.job_settings import SettingsPayload
from jobs.spark.report import JobOutcome, Report
from jobs.spark.table_export import TableTarget, run_table_export

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession


def _snapshot_id(table: Table) -> int | None:
    snapshot = table.current_snapshot()
    return None if snapshot is None else snapshot.snapshot_id


def run_iceberg_export(spark: SparkSession, settings: Settings, options: ExportOptions,
                       report: Report) -> JobOutcome:
    """The job (see the module's docstring); exit 1 when the files do not hold the plan."""

    def open_target(name: str, payload: SettingsPayload) -> TableTarget:
        catalog = open_catalog(options.catalog, settings,
                               parse_properties(options.catalog_properties))
        if warehouse := catalog.properties.get("warehouse"):  # before a table is created
            check_location(name, str(warehouse), settings.s3, settings.store)
        table = open_table(catalog, name)
        location = table.location().rstrip("/")
        check_location(name, location, settings.s3, settings.store)

        def commit_files(files: Sequence[Mapping[str, Any]],
                         offsets: Mapping[TopicPartition, int], job: Mapping[str, str]) -> int:
            return commit(table, [f["file"] for f in files], offsets, job)

        return TableTarget(
            held=functools.partial(high_waters, table),
            task=functools.partial(iceberg_task, payload, location,
                                   dict(file_io_properties(table.io.properties))),
            columns=DATA_FILE_COLUMNS, version=functools.partial(_snapshot_id, table),
            commit=commit_files, version_field="snapshot_id", version_label="snapshot",
            described={"table_location": location},
            shown_options={"catalog_properties": redacted(options.catalog_properties)})

    return run_table_export(spark, settings, options, report, open_target,
                            "--format iceberg needs --table (NAMESPACE.NAME in the catalog)")
