"""Object listings in Spark tasks: ``wal-shared/`` cut into key ranges, and one
``data/`` prefix per partition. Taken once and written to ``report/objects``."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.settings import Settings
from app.storage.keys import KeyLayout, TopicPartition
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import Report
from jobs.spark.session import describe
from jobs.spark.stores import open_stores
from jobs.spark.tasks import partition_slices, stream_from_async, task_identity, task_logger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HEX = "0123456789abcdef"
OBJECT_COLUMNS = "key string, size long, last_modified_ms long, area string, " \
                 "topic string, partition int"


@dataclass(frozen=True)
class ListingUnit:
    """One prefix to list: a slice of ``wal-shared/`` or one partition's ``data/``."""

    area: str  # "wal-shared" | "data"
    prefix: str
    topic: str | None = None
    partition: int | None = None


def listing_units(layout: KeyLayout, partitions: Iterable[TopicPartition],
                  fanout: int) -> list[ListingUnit]:
    """``wal-shared/`` cut into ``fanout`` (1, 16 or 256) hex prefixes, plus ``data/``.

    Shared blob names are ``uuid4().hex`` (lowercase hex), so the hex prefixes cover all
    of them; an object under ``wal-shared/`` whose name starts with anything else is
    never listed, hence never reported or deleted.
    """
    base = f"{layout.root}/wal-shared/"
    if fanout <= 1:
        heads = [""]
    elif fanout <= 16:
        heads = list(HEX)
    else:
        heads = [a + b for a in HEX for b in HEX]
    units = [ListingUnit("wal-shared", base + h) for h in heads]
    units += [ListingUnit("data", layout.partition_prefix(tp) + "data/", tp.topic,
                          tp.partition) for tp in sorted(set(partitions))]
    return units


def list_objects_task(payload: Mapping[str, str], job: str,
                      units: Iterable[ListingUnit]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: rows of :data:`OBJECT_COLUMNS` for every object."""
    todo = list(units)
    logger = task_logger(job)

    async def produce(emit: Callable[[list[tuple[Any, ...]]], Awaitable[None]]) -> None:
        async with open_stores(payload, task_identity(job)) as stores:
            listed = 0
            for unit in todo:
                page: list[tuple[Any, ...]] = []
                async for info in stores.s3.list(unit.prefix):
                    page.append((info.key, info.size, info.last_modified_ms, unit.area,
                                 unit.topic, unit.partition))
                    if len(page) >= 1000:
                        listed += len(page)
                        await emit(page)
                        page = []
                listed += len(page)
                await emit(page)
            logger.info("listed %d objects under %d prefixes", listed, len(todo))

    return stream_from_async(produce)


def list_objects(spark: SparkSession, settings: Settings, partitions: Sequence[TopicPartition],
                 fanout: int, tasks: int, report: Report, job: str) -> DataFrame:
    """List ``wal-shared/`` and every partition's ``data/`` in Spark tasks, write the
    listing to ``report/objects`` and return it read back (computed exactly once)."""
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    units = listing_units(layout, partitions, fanout)
    describe(spark, f"{job}: listing objects under {len(units)} prefixes")
    body = functools.partial(list_objects_task, settings_payload(settings), job)
    rdd = spark.sparkContext.parallelize(units, partition_slices(len(units), tasks))
    df = spark.createDataFrame(rdd.mapPartitions(body), OBJECT_COLUMNS, verifySchema=False)
    return spark.read.parquet(report.write_table(df, "objects"))
