"""export --format delta: append what the store holds past the table's high-water offsets
to a Delta table, partitioned by topic and the UTC date of the append time.

The steps are every table export's (:mod:`jobs.spark.table_export`); the table's are
Delta's: the driver opens (or creates) the table and reads, per topic-partition, the
last offset it holds (its transaction version, :mod:`jobs.spark.delta_table`); each
Spark task writes the data files of a range (:mod:`jobs.spark.delta_files`); every file
is committed with the new high-water offsets in one Delta commit.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.keys import TopicPartition
from jobs.spark.delta_files import DATA_FILE_COLUMNS, delta_task
from jobs.spark.delta_location import table_location
from jobs.spark.delta_table import commit, high_waters, open_table
from jobs.spark.export_read import ExportOptions
from jobs.spark.job_settings import SettingsPayload
from jobs.spark.report import JobOutcome, Report
from jobs.spark.table_export import TableTarget, run_table_export

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_delta_export(spark: SparkSession, settings: Settings, options: ExportOptions,
                     report: Report) -> JobOutcome:
    """The job (see the module's docstring); exit 1 when the files do not hold the plan."""

    def open_target(name: str, payload: SettingsPayload) -> TableTarget:
        table = open_table(table_location(name, settings.s3, settings.store))

        def commit_files(files: Sequence[Mapping[str, Any]],
                         offsets: Mapping[TopicPartition, int], job: Mapping[str, str]) -> int:
            return commit(table, files, offsets, job)

        return TableTarget(
            held=functools.partial(high_waters, table),
            task=functools.partial(delta_task, payload, name), columns=DATA_FILE_COLUMNS,
            version=table.version, commit=commit_files,
            version_field="table_version", version_label="table version")

    return run_table_export(spark, settings, options, report, open_target,
                            "--format delta needs --table (s3://bucket/prefix or a path)")
