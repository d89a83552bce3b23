"""What every export format shares: the plan (log bounds, offset ranges) and reading a
range with :class:`LogReader` into Arrow record batches of the export's columns."""

from __future__ import annotations

import datetime
import functools
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from app.errors import LlogError
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_value
from app.storage.reader import LogReader
from jobs.spark.discovery import discover_on_driver
from jobs.spark.session import default_tasks, describe
from jobs.spark.stores import open_stores
from jobs.spark.tasks import partition_slices, task_identity, task_logger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from jobs.spark.report import Report

JOB = "export"
MiB = 1024 * 1024
READ_RECORDS = 5000
READ_BYTES = 8 * MiB
RANGE_COLUMNS = "topic string, partition int, first_offset long, last_offset long"
# What every format's tasks say of each file they wrote (the table formats add columns).
FILE_COLUMNS = ("part int, topic string, partition int, first_offset long, last_offset long, "
                "records long, bytes long, file string")
MAX_SLICES = 10_000

@dataclass(frozen=True)
class ExportOptions:
    """The export's options (one per command-line option of the same name)."""

    output: str | None = None
    topics: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    from_offset: int = 1
    to_offset: int | None = None
    range_records: int = 100_000
    mode: str = "errorifexists"
    tasks: int = 0
    verify_output: bool = False
    format: str = "parquet"
    table: str | None = None
    catalog: str = "llog"
    catalog_properties: tuple[str, ...] = ()


def high_watermarks_task(payload: Mapping[str, str], tps: Iterable[tuple[str, int]]
                         ) -> Iterator[tuple[str, int, int, int]]:
    """``(topic, partition, log start, high watermark)`` of each partition."""
    todo = [TopicPartition(t, p) for t, p in tps]
    out: list[tuple[str, int, int, int]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            reader = LogReader(stores.oxia, stores.s3, stores.layout)
            for tp in todo:
                control = await reader.read_control(tp)
                out.append((tp.topic, tp.partition, 1, 0) if control is None else
                           (tp.topic, tp.partition, control.log_start,
                            control.sequence_counter))

    anyio.run(run)
    return iter(out)


def plan_ranges(bounds: Iterable[tuple[str, int, int, int]], from_offset: int,
                to_offset: int | None, range_records: int) -> list[tuple[str, int, int, int]]:
    """``(topic, partition, first, last)`` ranges of at most ``range_records`` offsets
    from ``(topic, partition, log start, high watermark)``: nothing below the log start
    (retention removed it) or above the high watermark."""
    ranges = []
    for topic, partition, log_start, hw in sorted(bounds):
        first = max(1, log_start, from_offset)
        last = hw if to_offset is None else min(hw, to_offset)
        while first <= last:
            end = min(last, first + range_records - 1)
            ranges.append((topic, partition, first, end))
            first = end + 1
    return ranges


def _utf8(value: bytes) -> str | None:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class PartRange:
    """One task's work: offsets ``first..last`` of a partition into part file ``index``."""

    index: int
    topic: str
    partition: int
    first: int
    last: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def ranges_task(payload: Mapping[str, str], ranges: Iterable[tuple[int, str, int, int, int]],
                write: Callable[[LogReader, PartRange], Awaitable[list[tuple[Any, ...]]]],
                written: str) -> Iterator[tuple[Any, ...]]:
    """The body of every format's Spark ``mapPartitions`` task: ``write`` each range in
    turn (its rows describe the files it wrote), logging ``written`` (a format string of
    the partition, first and last offsets) after each."""
    todo = [PartRange(*r) for r in ranges]
    logger = task_logger(JOB)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            reader = LogReader(stores.oxia, stores.s3, stores.layout)
            for part in todo:
                out.extend(await write(reader, part))
                logger.info(written, part.tp, part.first, part.last)

    anyio.run(run)
    return iter(out)


def record_schema() -> Any:
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]

    header = pa.struct([("name", pa.string()), ("value", pa.binary())])
    return pa.schema([("topic", pa.string()), ("partition", pa.int32()),
                      ("offset", pa.int64()), ("value", pa.binary()),
                      ("value_utf8", pa.string()), ("key", pa.binary()),
                      ("headers", pa.list_(header)), ("timestamp_ms", pa.int64()),
                      ("append_time_ms", pa.int64())])


@dataclass(frozen=True)
class ExportRow:
    """One record as exported: its offset, payload and the broker's append time."""

    offset: int
    payload: Payload
    append_time_ms: int

    @property
    def record(self) -> LogRecord | None:
        return self.payload if isinstance(self.payload, LogRecord) else None


async def read_batches(reader: LogReader, part: PartRange, batch_records: int
                   ) -> AsyncIterator[list[ExportRow]]:
    """The range's records in batches, checked to be contiguous from ``first``."""
    offset = part.first
    while offset <= part.last:
        try:
            result = await reader.read(part.tp, offset, max_records=min(
                batch_records, part.last - offset + 1), max_bytes=READ_BYTES)
        except LlogError as exc:
            raise LlogError(f"{part.tp} offsets {offset}..{part.last}: "
                            f"{exc.error_type}: {exc}") from exc
        got = [ExportRow(at, v, t) for (at, v), t in zip(result.records, result.append_times,
                                                     strict=True) if at <= part.last]
        if not got:
            raise LlogError(f"{part.tp}: nothing readable at offset {offset} "
                            f"(high watermark {result.high_watermark})")
        if got[0].offset != offset or got[-1].offset != offset + len(got) - 1:
            raise LlogError(f"{part.tp}: offsets from {offset} are not contiguous")
        yield got
        offset = got[-1].offset + 1


def _headers(row: ExportRow) -> list[dict[str, Any]]:
    record = row.record
    return [] if record is None else [{"name": n, "value": v} for n, v in record.headers]


def _field_arrays(schema: Any, got: list[ExportRow]) -> tuple[Any, Any, Any]:
    """The ``key``, ``headers`` and ``timestamp_ms`` columns of a batch."""
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]

    headers_type = schema.field("headers").type
    records = [r.record for r in got]
    if all(r is None for r in records):  # plain values only: no per-row work
        no_headers = pa.ListArray.from_arrays(pa.array([0] * (len(got) + 1), pa.int32()),
                                              pa.array([], headers_type.value_type))
        return pa.nulls(len(got), pa.binary()), no_headers, pa.nulls(len(got), pa.int64())
    return (pa.array([None if r is None else r.key for r in records], pa.binary()),
            pa.array([_headers(r) for r in got], headers_type),
            pa.array([None if r is None else r.timestamp_ms for r in records], pa.int64()))


def record_batch(schema: Any, part: PartRange, got: list[ExportRow]) -> Any:
    import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]

    values = pa.array([payload_value(r.payload) for r in got], pa.binary())
    try:  # the whole batch at once when it is all valid UTF-8
        text = values.cast(pa.string())
    except pa.ArrowInvalid:
        text = pa.array([_utf8(payload_value(r.payload)) for r in got], pa.string())
    return pa.record_batch([
        pa.array([part.topic] * len(got), pa.string()),
        pa.array([part.partition] * len(got), pa.int32()),
        pa.array([r.offset for r in got], pa.int64()),
        values,
        text,
        *_field_arrays(schema, got),
        pa.array([r.append_time_ms for r in got], pa.int64()),
    ], schema=schema)


def select_partitions(settings: Settings, topics: Sequence[str], partitions: Sequence[int]
                      ) -> list[TopicPartition]:
    """The store's topic-partitions, filtered by ``topics`` and ``partitions`` (empty: all)."""
    return [
        tp for tp in discover_on_driver(settings, JOB)
        if (not topics or tp.topic in topics) and (not partitions or tp.partition in partitions)
    ]


def read_bounds(spark: SparkSession, payload: Mapping[str, str],
                partitions: Sequence[TopicPartition], tasks: int
                ) -> list[tuple[str, int, int, int]]:
    """The export's snapshot, read in a Spark stage: log starts and high watermarks
    (later appends are not exported)."""
    describe(spark, f"export: reading the log bounds of {len(partitions)} partitions")
    items = [(tp.topic, tp.partition) for tp in partitions]
    return spark.sparkContext.parallelize(items, partition_slices(len(items), tasks)) \
        .mapPartitions(functools.partial(high_watermarks_task, payload)).collect()


DAY_MS = 86_400_000


def append_date(append_time_ms: int) -> str:
    """The UTC date of an append time, as the tables' partition value."""
    return datetime.datetime.fromtimestamp(append_time_ms / 1000, datetime.UTC) \
        .date().isoformat()


def split_by_day(batch: Any) -> Iterator[tuple[str, Any]]:
    """``(UTC date of append time, rows of that date)`` of a batch (usually one date):
    the tables' files hold one day each."""
    import pyarrow.compute as pc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    days = pc.divide(batch.column("append_time_ms"), DAY_MS)  # integer division
    distinct = pc.unique(days).to_pylist()
    if len(distinct) == 1:
        yield append_date(distinct[0] * DAY_MS), batch
        return
    for day in distinct:
        yield append_date(day * DAY_MS), batch.filter(pc.equal(days, day))


def new_high_waters(files: Sequence[Mapping[str, Any]]) -> dict[TopicPartition, int]:
    """The last offset the data files (rows with ``topic``, ``partition`` and
    ``last_offset``) hold of each partition: what a table commit records."""
    out: dict[TopicPartition, int] = {}
    for row in files:
        tp = TopicPartition(row["topic"], row["partition"])
        out[tp] = max(out.get(tp, 0), int(row["last_offset"]))
    return out


def write_data_files(spark: SparkSession, task: Callable[[Iterable[Any]], Iterator[Any]],
                     columns: str, ranges: Sequence[tuple[str, int, int, int]],
                     report: Report) -> list[dict[str, Any]]:
    """A table export's tasks, one per range, each writing its data files; the rows
    (``columns``) describing the files they wrote, also kept as ``report/files``."""
    indexed = [(i, *r) for i, r in enumerate(ranges)]
    rows = spark.sparkContext.parallelize(
        indexed, max(1, min(len(indexed), MAX_SLICES))).mapPartitions(task)
    files = spark.read.parquet(report.write_table(
        spark.createDataFrame(rows, columns, verifySchema=False), "files"))
    return [row.asDict() for row in files.collect()]


def resume_bounds(bounds: Sequence[tuple[str, int, int, int]],
                  held: Mapping[TopicPartition, int], from_offset: int = 1
                  ) -> tuple[list[tuple[str, int, int, int]], int]:
    """Each partition's bounds starting past what the table holds (and at
    ``from_offset`` or later), and how many offsets retention removed before any export
    read them."""
    resumed, lost = [], 0
    for topic, partition, log_start, hw in bounds:
        start = max(from_offset, held.get(TopicPartition(topic, partition), 0) + 1)
        lost += max(0, min(log_start, hw + 1) - start)
        resumed.append((topic, partition, max(log_start, start), hw))
    return resumed, lost


class TablePlan(NamedTuple):
    partitions: list[TopicPartition]
    ranges: list[tuple[str, int, int, int]]
    lost: int  # offsets retention removed before any export read them
    expected: int  # records the ranges hold


def plan_table_export(spark: SparkSession, settings: Settings, payload: Mapping[str, str],
                      options: ExportOptions,
                      held: Callable[[list[TopicPartition]], Mapping[TopicPartition, int]],
                      report: Report) -> TablePlan:
    """A table export's plan: the selected partitions read past what the table holds
    (``held``: its high-water offsets), in ranges (also ``report/ranges``)."""
    describe(spark, "export: discovering partitions")
    partitions = select_partitions(settings, options.topics, options.partitions)
    bounds, lost = resume_bounds(
        read_bounds(spark, payload, partitions, default_tasks(spark, options.tasks)),
        held(partitions), options.from_offset)
    ranges = plan_ranges(bounds, options.from_offset, options.to_offset,
                         options.range_records)
    report.write_table(spark.createDataFrame(ranges, RANGE_COLUMNS), "ranges")
    expected = sum(last - first + 1 for _, _, first, last in ranges)
    describe(spark, f"export: {expected} records in {len(ranges)} ranges to {options.table}")
    return TablePlan(partitions, ranges, lost, expected)
