"""What audit and vacuum share: the listing taken before any reference is read, and
the partition scan: every partition's snapshot (:mod:`jobs.spark.snapshot`) handed to
a job's handler in Spark tasks, computed once, its rows written as report tables.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from app.errors import LlogError
from app.settings import Settings
from app.storage.keys import TopicPartition
from jobs.spark.discovery import discover_on_driver
from jobs.spark.job_settings import settings_payload
from jobs.spark.listing import list_objects
from jobs.spark.report import Report
from jobs.spark.runner import parse_duration_ms
from jobs.spark.session import computed_once, describe
from jobs.spark.snapshot import PartitionSnapshot, read_snapshot
from jobs.spark.stores import Stores, open_stores
from jobs.spark.tasks import partition_slices, task_identity, task_logger

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

Tagged = tuple[str, tuple[Any, ...]]


class SnapshotHandler:
    """Turns one partition snapshot into tagged rows; one instance per Spark task."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores

    async def handle(self, snap: PartitionSnapshot) -> list[Tagged]:
        raise NotImplementedError

    def on_error(self, tp: TopicPartition, exc: BaseException) -> list[Tagged]:
        raise NotImplementedError


def snapshot_task(
    payload: Mapping[str, str], job: str, concurrency: int,
    make_handler: Callable[[Stores], SnapshotHandler],
    tps: Iterable[tuple[str, int]],
) -> Iterator[Tagged]:
    """Spark ``mapPartitions`` body: snapshot each partition and hand it to a handler.

    A partition whose snapshot or handling fails with a storage error yields the
    handler's ``on_error`` rows instead, so the job knows its scan was incomplete.
    """
    todo = [TopicPartition(t, p) for t, p in tps]
    logger = task_logger(job)
    results: list[Tagged] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(job)) as stores:
            handler = make_handler(stores)
            limiter = anyio.CapacityLimiter(max(1, concurrency))
            done = 0

            async def one(tp: TopicPartition) -> None:
                nonlocal done
                async with limiter:
                    try:
                        snap = await read_snapshot(stores.oxia, stores.layout, tp)
                        rows = await handler.handle(snap)
                    except (LlogError, OSError) as exc:
                        logger.warning("%s: %s", tp, exc)
                        rows = handler.on_error(tp, exc)
                    results.extend(rows)
                    done += 1
                    if done % 100 == 0:
                        logger.info("%d/%d partitions scanned", done, len(todo))

            async with anyio.create_task_group() as tg:
                for tp in todo:
                    tg.start_soon(one, tp)
        logger.info("scanned %d partitions", len(todo))

    anyio.run(run)
    return iter(results)


def list_then_discover(spark: SparkSession, settings: Settings, job: str, fanout: int,
                       tasks: int, report: Report) -> tuple[DataFrame, list[TopicPartition]]:
    """The object listing, complete before any reference is read, and the partitions to
    scan: those known before the listing and those created while it ran."""
    describe(spark, f"{job}: discovering partitions")
    first = discover_on_driver(settings, job)
    objects = list_objects(spark, settings, first, fanout, tasks, report, job)
    return objects, sorted(set(first) | set(discover_on_driver(settings, job)))


def _tagged(tag: str) -> Callable[[Tagged], bool]:
    return lambda row: row[0] == tag


def scan_partitions(spark: SparkSession, settings: Settings, job: str,
                    partitions: Sequence[TopicPartition], tasks: int, concurrency: int,
                    make_handler: Callable[[Stores], SnapshotHandler],
                    tables: Mapping[str, tuple[str, str]], report: Report,
                    extra: Mapping[str, Sequence[tuple[Any, ...]]] | None = None
                    ) -> dict[str, DataFrame]:
    """Snapshot and handle every partition in Spark tasks, once; ``tables`` maps a row
    tag to ``(table name, columns)``, ``extra`` a tag to rows the driver adds to that
    table. Returns each table, read back from the report."""
    body = functools.partial(snapshot_task, settings_payload(settings), job, concurrency,
                             make_handler)
    items = [(tp.topic, tp.partition) for tp in partitions]
    tagged: RDD[Tagged] = spark.sparkContext.parallelize(
        items, partition_slices(len(items), tasks)).mapPartitions(body)
    computed_once(tagged)  # every table below comes from one and the same scan
    out: dict[str, DataFrame] = {}
    for tag, (name, columns) in tables.items():
        rows = tagged.filter(_tagged(tag)).map(lambda row: row[1])
        df = spark.createDataFrame(rows, columns, verifySchema=False)
        if extra and extra.get(tag):
            df = df.unionByName(spark.createDataFrame(list(extra[tag]), columns))
        out[name] = spark.read.parquet(report.write_table(df, name))
    tagged.unpersist()
    return out


def add_scan_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the jobs that list objects and scan partitions (audit, vacuum)."""
    parser.add_argument("--retry-horizon", type=parse_duration_ms, default=None,
                        dest="retry_horizon_ms",
                        help="the retry horizon (default: the writers' "
                             "LLOG_RETRY_HORIZON_MS): vacuum deletes no object younger "
                             "and refuses a shorter one; audit flags older orphans")
    parser.add_argument("--listing-fanout", type=int, choices=(1, 16, 256), default=16,
                        help="wal-shared/ is listed as this many hex key ranges")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="partitions scanned concurrently within a task")
