"""The Spark tasks of an Iceberg export: each reads its offset range and writes it as
data files of the table, one per UTC day of append time the range touches, through the
table's FileIO (pyiceberg's PyArrow FileIO: the store's S3, or the catalog's own).

A data file is written under a name no other attempt uses
(``{table location}/data/topic={t}/append_day={d}/part-{partition}-{first}-{uuid}.parquet``)
and is invisible until the driver adds it in a snapshot: files of failed, retried or
crashed attempts are never referenced and no reader sees them. Unlike Delta's, Iceberg's
data files hold every column, the partition sources too (``topic``, ``append_time``);
the driver's ``add_files`` reads each footer for the file's statistics and partition.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from app.storage.reader import LogReader
from jobs.spark.export_read import (
    JOB,
    READ_RECORDS,
    PartRange,
    read_batches,
    record_batch,
    record_schema,
    split_by_day,
)
from jobs.spark.iceberg_catalog import data_file_io
from jobs.spark.stores import open_stores
from jobs.spark.tasks import task_identity, task_logger

# One row per data file: what the driver commits and reports.
DATA_FILE_COLUMNS = ("part int, topic string, partition int, first_offset long, "
                     "last_offset long, records long, bytes long, file string, "
                     "append_date string")


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
class _OpenFile:
    uri: str
    stream: Any
    writer: Any
    records: int = 0
    bytes: int = 0


async def write_range(reader: LogReader, io: Any, location: str, part: PartRange,
                      *, batch_records: int = READ_RECORDS) -> list[tuple[Any, ...]]:
    """Write ``part`` as data files under ``location``; rows of :data:`DATA_FILE_COLUMNS`."""
    import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

    full, schema = record_schema(), file_schema()
    files: dict[str, _OpenFile] = {}
    name = f"part-{part.partition:05d}-{part.first:020d}-{uuid.uuid4().hex}.parquet"
    try:
        async for got in read_batches(reader, part, batch_records):
            batch = with_append_time(record_batch(full, part, got))
            for date, rows in split_by_day(batch):
                if date not in files:
                    uri = f"{location}/data/topic={part.topic}/append_day={date}/{name}"
                    stream = io.new_output(uri).create(overwrite=False)
                    files[date] = _OpenFile(uri, stream, pq.ParquetWriter(
                        stream, schema, compression="zstd"))
                f = files[date]
                f.writer.write_batch(rows)
                f.records += rows.num_rows
                f.bytes += pc.sum(pc.binary_length(rows.column("value"))).as_py() or 0
        for f in files.values():
            f.writer.close()
            f.stream.close()
    except BaseException:
        for f in files.values():  # never committed: no snapshot will reference them
            with contextlib.suppress(Exception):
                f.writer.close()
            with contextlib.suppress(Exception):
                f.stream.close()
        raise
    return [(part.index, part.topic, part.partition, part.first, part.last, f.records,
             f.bytes, f.uri, date) for date, f in sorted(files.items())]


def iceberg_task(payload: Mapping[str, str], location: str, io_properties: Mapping[str, str],
                 ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: write each range with :func:`write_range`."""
    todo = [PartRange(*r) for r in ranges]
    logger = task_logger(JOB)
    io = data_file_io(io_properties, location)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            reader = LogReader(stores.oxia, stores.s3, stores.layout)
            for part in todo:
                out.extend(await write_range(reader, io, location, part))
                logger.info("exported %s offsets %d..%d to the table", part.tp, part.first,
                            part.last)

    anyio.run(run)
    return iter(out)
