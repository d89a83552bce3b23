"""The Spark tasks of a Delta export: each reads its offset range and writes it as data
files of the table, one per ``append_date`` the range touches.

A data file is written under a name no other attempt uses
(``topic={t}/append_date={d}/part-{partition}-{first}-{uuid}.parquet``) and is
invisible until the driver commits it: files of failed, retried or crashed attempts are
never referenced, and Delta's VACUUM removes them. The partition columns (``topic``,
``append_date``) are not stored in the files, as Delta's protocol has it; the commit
carries them. Each file's statistics (row count, offset and append-time bounds) go into
its ``add`` action, so readers skip files by offset and time.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from app.storage.reader import LogReader
from jobs.spark.delta_location import filesystem, table_location
from jobs.spark.export_read import (
    JOB,
    READ_RECORDS,
    PartRange,
    read_batches,
    record_batch,
    record_schema,
    split_by_day,
)
from jobs.spark.job_settings import settings_from_payload
from jobs.spark.stores import open_stores
from jobs.spark.tasks import task_identity, task_logger

# One row per data file: what the driver needs for the file's add action and the report.
DATA_FILE_COLUMNS = ("part int, topic string, partition int, first_offset long, "
                     "last_offset long, records long, bytes long, file string, size long, "
                     "append_date string, stats string")
STATS_COLUMNS = ("partition", "offset", "append_time_ms")



def data_schema() -> Any:
    """The columns of a data file: the export's, less the table's partition columns."""
    schema = record_schema()
    return schema.remove(schema.get_field_index("topic"))


@dataclass
class _OpenFile:
    """A data file being written, and the statistics of what went into it."""

    path: str
    stream: Any
    writer: Any
    records: int = 0
    bytes: int = 0
    low: dict[str, int] = field(default_factory=dict)
    high: dict[str, int] = field(default_factory=dict)

    def add(self, batch: Any) -> None:
        import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]

        self.writer.write_batch(batch)
        self.records += batch.num_rows
        self.bytes += pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0
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


async def write_range(reader: LogReader, fs: Any, base: str, part: PartRange,
                      *, batch_records: int = READ_RECORDS) -> list[tuple[Any, ...]]:
    """Write ``part`` as data files under ``base``; rows of :data:`DATA_FILE_COLUMNS`."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

    full, schema = record_schema(), data_schema()
    files: dict[str, _OpenFile] = {}
    name = f"part-{part.partition:05d}-{part.first:020d}-{uuid.uuid4().hex}.parquet"
    try:
        async for got in read_batches(reader, part, batch_records):
            batch = record_batch(full, part, got).drop_columns(["topic"])
            for date, rows in split_by_day(batch):
                if date not in files:
                    path = f"topic={part.topic}/append_date={date}/{name}"
                    stream = _open(fs, f"{base}/{path}")
                    files[date] = _OpenFile(path, stream, pq.ParquetWriter(
                        stream, schema, compression="snappy"))
                files[date].add(rows)
        for f in files.values():
            f.writer.close()
            f.stream.close()
    except BaseException:
        for f in files.values():  # never committed: Delta's VACUUM removes what is left
            with contextlib.suppress(Exception):
                f.writer.close()
            with contextlib.suppress(Exception):
                f.stream.close()
        raise
    return [(part.index, part.topic, part.partition, part.first, part.last, f.records,
             f.bytes, f.path, fs.get_file_info(f"{base}/{f.path}").size, date, f.stats())
            for date, f in sorted(files.items())]


def delta_task(payload: Mapping[str, str], table: str,
               ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: write each range with :func:`write_range`."""
    todo = [PartRange(*r) for r in ranges]
    logger = task_logger(JOB)
    settings = settings_from_payload(payload)
    location = table_location(table, settings)
    fs = filesystem(location, settings)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            reader = LogReader(stores.oxia, stores.s3, stores.layout)
            for part in todo:
                out.extend(await write_range(reader, fs, location.base_path, part))
                logger.info("exported %s offsets %d..%d to the table", part.tp, part.first,
                            part.last)

    anyio.run(run)
    return iter(out)

