"""The Spark tasks of a Delta export: each reads its offset range and writes it as data
files of the table, one per ``append_date`` the range touches.

A data file is written under a name no other attempt uses
(``topic={t}/append_date={d}/part-{partition}-{first}-{uuid}.parquet``,
:mod:`jobs.spark.table_files`) and is invisible until the driver commits it: files of
failed, retried or crashed attempts are never referenced, and Delta's VACUUM removes
them. The partition columns (``topic``, ``append_date``) are not stored in the files, as
Delta's protocol has it; the commit carries them. Each file's statistics (row count,
offset and append-time bounds) go into its ``add`` action, so readers skip files by
offset and time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.spark.delta_location import filesystem, table_location
from jobs.spark.export_read import PartRange, record_schema
from jobs.spark.job_settings import settings_from_payload
from jobs.spark.table_files import FILE_COLUMNS, DataFiles, OpenFile, table_task

# One row per data file: what the driver needs for the file's add action and the report.
DATA_FILE_COLUMNS = f"{FILE_COLUMNS}, size long, append_date string, stats string"
STATS_COLUMNS = ("partition", "offset", "append_time_ms")


def data_schema() -> Any:
    """The columns of a data file: the export's, less the table's partition columns."""
    schema = record_schema()
    return schema.remove(schema.get_field_index("topic"))


@dataclass
class _OpenFile(OpenFile):
    """A data file being written, and the statistics of what went into it."""

    low: dict[str, int] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)

    def add(self, batch: Any) -> None:
        import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]

        super().add(batch)
        for name in STATS_COLUMNS:
            bounds = pc.min_max(batch.column(name)).as_py()
            self.low[name] = min(self.low.get(name, bounds["min"]), bounds["min"])
            self.high[name] = max(self.high.get(name, bounds["max"]), bounds["max"])

    def stats(self) -> str:
        return json.dumps({"numRecords": self.records, "minValues": self.low,
                           "maxValues": self.high,
                           "nullCount": dict.fromkeys(STATS_COLUMNS, 0)})


def _open(fs: Any, path: str) -> Any:
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]

    if isinstance(fs, pyarrow.fs.LocalFileSystem):  # S3 has no directories to create
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    return fs.open_output_stream(path)


@dataclass
class DeltaFiles(DataFiles[_OpenFile]):
    """Data files under ``base`` (the table's root on ``fs``), named relative to it,
    without the partition columns; rows of :data:`DATA_FILE_COLUMNS`. Never committed,
    a failed attempt's files are Delta's VACUUM's to remove."""

    fs: Any
    base: str
    schema: Any = field(default_factory=data_schema)

    def columns(self, batch: Any) -> Any:
        return batch.drop_columns(["topic"])

    def open(self, part: PartRange, date: str, name: str) -> _OpenFile:
        import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

        path = f"topic={part.topic}/append_date={date}/{name}"
        stream = _open(self.fs, f"{self.base}/{path}")
        return _OpenFile(path, stream, pq.ParquetWriter(stream, self.schema,
                                                        compression="snappy"))

    def described(self, file: _OpenFile, date: str) -> tuple[Any, ...]:
        return self.fs.get_file_info(f"{self.base}/{file.path}").size, date, file.stats()


def delta_task(payload: Mapping[str, str], table: str,
               ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: write each range as data files of the table."""
    settings = settings_from_payload(payload)
    location = table_location(table, settings.s3, settings.store)
    files = DeltaFiles(filesystem(location, settings), location.base_path)
    return table_task(payload, files, ranges)
