"""The Spark tasks of an Iceberg export: each reads its offset range and writes it as
data files of the table, one per UTC day of append time the range touches, through the
table's FileIO (pyiceberg's PyArrow FileIO: the store's S3, or the catalog's own).

A data file is written under a name no other attempt uses
(``{table location}/data/topic={t}/append_day={d}/part-{partition}-{first}-{uuid}.parquet``,
:mod:`jobs.spark.table_files`) and is invisible until the driver adds it in a snapshot:
files of failed, retried or crashed attempts are never referenced and no reader sees
them. Unlike Delta's, Iceberg's data files hold every column, the partition sources too
(``topic``, ``append_time``); the driver's ``add_files`` reads each footer for the
file's statistics and partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.spark.export_read import PartRange, record_schema
from jobs.spark.iceberg_catalog import data_file_io
from jobs.spark.table_files import FILE_COLUMNS, DataFiles, OpenFile, table_task

# One row per data file: what the driver commits and reports.
DATA_FILE_COLUMNS = f"{FILE_COLUMNS}, append_date string"


def file_schema() -> Any:
    """The columns of a data file: the export's and ``append_time`` (a UTC timestamp)."""
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]

    return record_schema().append(pa.field("append_time", pa.timestamp("us", tz="UTC")))


def with_append_time(batch: Any) -> Any:
    """``batch`` of the export's columns, with ``append_time`` from ``append_time_ms``."""
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    micros = pc.multiply(batch.column("append_time_ms"), 1000)
    return pa.record_batch([*batch.columns, micros.cast(pa.timestamp("us", tz="UTC"))],
                           schema=file_schema())


@dataclass
class IcebergFiles(DataFiles[OpenFile]):
    """Data files under ``{location}/data``, written through ``io`` (the table's FileIO)
    and named by their URIs; rows of :data:`DATA_FILE_COLUMNS`. Never committed, a
    failed attempt's files are in no snapshot."""

    io: Any
    location: str
    schema: Any = field(default_factory=file_schema)

    def columns(self, batch: Any) -> Any:
        return with_append_time(batch)

    def open(self, part: PartRange, date: str, name: str) -> OpenFile:
        import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

        uri = f"{self.location}/data/topic={part.topic}/append_day={date}/{name}"
        stream = self.io.new_output(uri).create(overwrite=False)
        return OpenFile(uri, stream, pq.ParquetWriter(stream, self.schema, compression="zstd"))

    def described(self, file: OpenFile, date: str) -> tuple[Any, ...]:
        return (date,)


def iceberg_task(payload: Mapping[str, str], location: str, io_properties: Mapping[str, str],
                 ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: write each range as data files of the table."""
    files = IcebergFiles(data_file_io(io_properties, location), location)
    return table_task(payload, files, ranges)
