"""Spark reads an export's Delta table: the ``llog_delta`` Python data source.

delta-spark, Spark's own Delta connector, does not support the Spark 4.3 this project
runs yet, and Spark would need S3A jars to reach the store. So the driver takes the
table's snapshot with delta-rs (the data files of the current or a given version, with
their partition values and statistics) and Spark reads one data file per task with
pyarrow on the store's S3 endpoint, adding the partition columns from the snapshot:

    from jobs.spark.delta_source import register
    register(spark)
    spark.read.format("llog_delta").load("s3://lake/llog/events")                # latest
    spark.read.format("llog_delta").option("version", 3).load("s3://lake/...")   # time travel

Small files are packed into tasks of up to ``maxPartitionBytes`` (default 128 MiB).
Only tables an export writes are read (partitioned by ``topic`` and ``append_date``,
Delta reader version 1: no deletion vectors or column mapping). Filters on ``topic``,
``append_date`` and ``partition`` skip files (Spark still applies every filter).
Connection settings are the ``LLOG_*`` environment of the driver, or ``stackJson``.
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from jobs.spark.delta_location import filesystem, table_location
from jobs.spark.delta_table import PARTITION_BY
from jobs.spark.job_settings import load_settings, settings_from_payload, settings_payload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "llog_delta"
SCHEMA = ("topic string, partition int, offset long, value binary, value_utf8 string, "
          "key binary, headers array<struct<name:string,value:binary>>, "
          "timestamp_ms long, append_time_ms long, append_date date")
BATCH_ROWS = 8192
MAX_PARTITION_BYTES = 128 * 1024 * 1024
_COMPARE: dict[type[Filter], Callable[[Any, Any], bool]] = {
    EqualTo: operator.eq, GreaterThan: operator.gt, GreaterThanOrEqual: operator.ge,
    LessThan: operator.lt, LessThanOrEqual: operator.le}


@dataclass(frozen=True)
class DataFile:
    """One data file of the snapshot, its size, partition values and partition number."""

    path: str
    size: int
    topic: str
    append_date: datetime.date
    partition: int


class FileGroup(InputPartition):
    """A task's files: consecutive files up to ``maxPartitionBytes`` (as Spark's file
    sources pack them), so small files do not cost a task each."""

    def __init__(self, files: Sequence[DataFile]) -> None:
        super().__init__(tuple(files))
        self.files = tuple(files)


def pack(files: Sequence[DataFile], max_bytes: int) -> list[FileGroup]:
    groups: list[list[DataFile]] = []
    size = 0
    for file in files:
        if not groups or size + file.size > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(file)
        size += file.size
    return [FileGroup(g) for g in groups]


def _matches(f: Filter, file: DataFile) -> bool:
    """False only when no row of ``file`` can pass ``f``."""
    attribute: tuple[str, ...] = getattr(f, "attribute", ())
    column = attribute[0] if len(attribute) == 1 else None
    if column not in ("topic", "append_date", "partition"):
        return True
    value = getattr(file, str(column))
    if value is None:  # a file without statistics
        return True
    if isinstance(f, In):
        return value in f.value
    if not isinstance(f, EqualTo | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual):
        return True
    return _COMPARE[type(f)](value, f.value)


class DeltaReader(DataSourceReader):
    def __init__(self, files: Sequence[DataFile], base: str, payload: dict[str, str],
                 uri: str, max_bytes: int) -> None:
        self.files = list(files)
        self.base, self.payload, self.uri, self.max_bytes = base, payload, uri, max_bytes

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Skip the files no row of which passes; every filter is still Spark's to apply."""
        self.files = [f for f in self.files if all(_matches(x, f) for x in filters)]
        return filters

    def partitions(self) -> Sequence[InputPartition]:
        return pack(self.files, self.max_bytes)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]
        import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

        assert isinstance(partition, FileGroup)
        settings = settings_from_payload(self.payload)
        fs = filesystem(table_location(self.uri, settings.s3, settings.store), settings)
        for file in partition.files:
            with fs.open_input_file(f"{self.base}/{file.path}") as stream:
                for batch in pq.ParquetFile(stream).iter_batches(batch_size=BATCH_ROWS):
                    n = batch.num_rows
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([file.topic] * n, pa.string()), *batch.columns,
                         pa.array([file.append_date] * n, pa.date32())],
                        names=["topic", *batch.schema.names, "append_date"])


class DeltaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DeltaReader:
        uri = self.options.get("path") or self.options.get("table")
        if not uri:
            raise ValueError(f"{NAME}: load(table URI) or .option('table', URI)")
        stack = self.options.get("stackJson")
        settings = load_settings(Path(stack) if stack else None)
        location = table_location(uri, settings.s3, settings.store)
        version = self.options.get("version")
        return DeltaReader(_snapshot(location, None if version is None else int(version)),
                           location.base_path, settings_payload(settings), uri,
                           int(self.options.get("maxPartitionBytes", MAX_PARTITION_BYTES)))


def _snapshot(location: Any, version: int | None) -> list[DataFile]:
    """The data files of the table's ``version`` (default: the latest)."""
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from deltalake import DeltaTable

    table = DeltaTable(location.uri, version=version,
                       storage_options=location.storage_options)
    if table.protocol().min_reader_version != 1 or \
            list(table.metadata().partition_columns) != PARTITION_BY:
        raise ValueError(f"{location.uri}: not a table an llog export writes "
                         f"(reader version 1, partitioned by {PARTITION_BY})")
    rows = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return [DataFile(r["path"], r["size_bytes"], r["partition.topic"],
                     r["partition.append_date"], r["min.partition"]) for r in rows]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("llog_delta")`` available in this session, with Python
    data sources' filter pushdown on (its file skipping needs it)."""
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    spark.dataSource.register(DeltaSource)
