"""What the tasks of a Delta and of an Iceberg export share: write an offset range as
data files of the table, one per UTC day of append time the range touches
(:func:`write_range`). A table format says how through a :class:`DataFiles`: the
columns of its files, where a file goes and how it is opened, and what the driver needs
to know of it besides :data:`FILE_COLUMNS`.

Every file of a range is named ``part-{partition}-{first}-{uuid}.parquet``, a name no
other attempt uses, and is invisible until the driver commits it: files of failed,
retried or crashed attempts are never referenced. An attempt that fails closes what it
opened and leaves it to the table's own clean-up.
"""

from __future__ import annotations

import contextlib
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from app.storage.reader import LogReader
from jobs.spark.export_read import (
    FILE_COLUMNS,
    READ_RECORDS,
    PartRange,
    ranges_task,
    read_batches,
    record_batch,
    record_schema,
    split_by_day,
)

__all__ = ["FILE_COLUMNS", "DataFiles", "OpenFile", "table_task", "write_range"]


@dataclass
class OpenFile:
    """A data file being written, and what went into it."""

    path: str  # the file as the driver commits it (the ``file`` column)
    stream: Any
    writer: Any
    records: int = 0
    bytes: int = 0

    def add(self, batch: Any) -> None:
        import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]

        self.writer.write_batch(batch)
        self.records += batch.num_rows
        self.bytes += pc.sum(pc.binary_length(batch.column("value"))).as_py() or 0


F = TypeVar("F", bound=OpenFile)


class DataFiles(ABC, Generic[F]):
    """A table format's data files, as one task writes them."""

    @abstractmethod
    def columns(self, batch: Any) -> Any:
        """``batch`` (the export's columns) as the columns of a data file."""

    @abstractmethod
    def open(self, part: PartRange, date: str, name: str) -> F:
        """A new data file ``name`` for the rows of ``part`` appended on ``date``."""

    @abstractmethod
    def described(self, file: F, date: str) -> tuple[Any, ...]:
        """The closed ``file``'s columns after :data:`FILE_COLUMNS` in the task's rows."""


async def write_range(reader: LogReader, files: DataFiles[F], part: PartRange,
                      *, batch_records: int = READ_RECORDS) -> list[tuple[Any, ...]]:
    """Write ``part`` as data files; a row of :data:`FILE_COLUMNS` and the format's own
    columns per file."""
    full = record_schema()
    opened: dict[str, F] = {}
    name = f"part-{part.partition:05d}-{part.first:020d}-{uuid.uuid4().hex}.parquet"
    try:
        async for got in read_batches(reader, part, batch_records):
            for date, rows in split_by_day(files.columns(record_batch(full, part, got))):
                if date not in opened:
                    opened[date] = files.open(part, date, name)
                opened[date].add(rows)
        for f in opened.values():
            f.writer.close()
            f.stream.close()
    except BaseException:
        for f in opened.values():  # never committed
            with contextlib.suppress(Exception):
                f.writer.close()
            with contextlib.suppress(Exception):
                f.stream.close()
        raise
    return [(part.index, part.topic, part.partition, part.first, part.last, f.records,
             f.bytes, f.path, *files.described(f, date)) for date, f in sorted(opened.items())]


def table_task(payload: Mapping[str, str], files: DataFiles[Any],
               ranges: Iterable[tuple[int, str, int, int, int]]) -> Iterator[tuple[Any, ...]]:
    """A table export's Spark ``mapPartitions`` body: write each range as ``files`` with
    :func:`write_range`."""

    async def write(reader: LogReader, part: PartRange) -> list[tuple[Any, ...]]:
        return await write_range(reader, files, part)

    return ranges_task(payload, ranges, write, "exported %s offsets %d..%d to the table")
