"""What the Delta and Iceberg exports share on the driver (:func:`run_table_export`): open
the table, read the log bounds in a Spark stage and plan ranges from
``max(log start, held + 1)`` to the high watermark (``held``: the last offset the table
holds of each topic-partition), run one Spark task per range that writes data files,
and commit every file with the new high-water offsets at once, only when the files hold
the plan. Offsets retention removed before they were exported are counted
(``records_lost_to_retention``), never waited for.

A table format supplies its table, opened, as a :class:`TableTarget`: its high-water
offsets, its tasks, its version and its commit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from jobs.spark.export_read import (
    JOB,
    ExportOptions,
    new_high_waters,
    plan_table_export,
    write_data_files,
)
from jobs.spark.job_settings import SettingsPayload, settings_payload
from jobs.spark.report import EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import finish

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True)
class TableTarget:
    """An opened table, as one format writes it."""

    # The last offset the table holds of each partition (0: none).
    held: Callable[[list[TopicPartition]], Mapping[TopicPartition, int]]
    # The Spark ``mapPartitions`` body writing ranges as data files, rows of ``columns``.
    task: Callable[[Iterable[tuple[int, str, int, int, int]]], Iterator[tuple[Any, ...]]]
    columns: str
    # The table's version as the run found it.
    version: Callable[[], Any]
    # Commit the files (rows of ``columns``) with the new high-water offsets and the
    # job's metadata, atomically; the table's new version.
    commit: Callable[[Sequence[Mapping[str, Any]], Mapping[TopicPartition, int],
                      Mapping[str, str]], Any]
    version_field: str  # the version's name in ``summary.json``
    version_label: str  # ... and in the job's last line
    described: Mapping[str, Any] = field(default_factory=dict)  # more summary fields
    shown_options: Mapping[str, Any] = field(default_factory=dict)  # options as reported


def run_table_export(spark: SparkSession, settings: Settings, options: ExportOptions,
                     report: Report, open_target: Callable[[str, SettingsPayload], TableTarget],
                     needs_table: str) -> JobOutcome:
    """The export to a table (see the module's docstring): ``open_target(table,
    payload)`` opens ``options.table``; without one, the error is ``needs_table``. Exit 1
    when the files do not hold the plan."""
    if options.table is None:
        raise ValueError(needs_table)
    if options.output is not None or options.verify_output:
        raise ValueError("--output and --verify-output are for --format parquet")
    started, payload = now_ms(), settings_payload(settings)
    target = open_target(options.table, payload)
    partitions, ranges, lost, expected = plan_table_export(
        spark, settings, payload, options, target.held, report)
    files = write_data_files(spark, target.task, target.columns, ranges, report) \
        if ranges else []
    exported = sum(int(f["records"]) for f in files)
    ok = exported == expected
    version = target.version()
    if ok and files:  # a mismatch commits nothing: the table stays as it was
        version = target.commit(files, new_high_waters(files),
                                {"llog.job": JOB, "llog.root_prefix": settings.root_prefix})
    finished = now_ms()
    header = job_header(JOB, "ok" if ok else "mismatch", EXIT_OK if ok else EXIT_FINDINGS,
                        started, finished, settings.s3, settings.store, options)
    header["options"].update(target.shown_options)
    summary: dict[str, Any] = {
        **header,
        "table": options.table, **target.described, target.version_field: version,
        "committed": ok and bool(files),
        "partitions": len(partitions), "ranges": len(ranges), "data_files": len(files),
        "records_expected": expected, "records_exported": exported,
        "records_lost_to_retention": lost,
        "bytes_exported": sum(int(f["bytes"]) for f in files),
    }
    return finish(spark, report, summary, f"{exported}/{expected} records, "
                                          f"{target.version_label} {version}")
