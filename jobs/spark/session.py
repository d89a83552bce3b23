"""The Spark session and the driver's helpers around it."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import SparkSession

log = logging.getLogger("llog.spark")


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    conf: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--conf {pair!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return conf


def build_spark(app_name: str, master: str | None = None,
                conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession; ``master`` None means ``local[*]``, or spark-submit's own master."""
    from pyspark.sql import SparkSession

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # launched by spark-submit
    if master is None and not submitted:
        master = "local[*]"
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if master and master.startswith("local"):
        # Python workers must be this interpreter (the venv with app's dependencies);
        # bind to loopback so a laptop's changing network does not matter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("LLOG_SPARK_LOG_LEVEL", "WARN"))
    return spark


def default_tasks(spark: SparkSession, requested: int) -> int:
    if requested > 0:
        return requested
    return max(1, int(spark.sparkContext.defaultParallelism))


def computed_once(rdd: RDD[Any]) -> None:
    """Materialise ``rdd`` now, and never recompute it.

    Persisted (so PySpark does not pipeline later Python stages into it) and locally
    checkpointed (so a lost block fails the job instead of silently re-running the
    tasks, which would re-read the store at a later time).
    """
    from pyspark import StorageLevel

    rdd.persist(StorageLevel.MEMORY_AND_DISK)
    rdd.localCheckpoint()
    rdd.count()


def describe(spark: SparkSession, text: str) -> None:
    """Label the next Spark jobs (shown in the UI) and log the phase."""
    spark.sparkContext.setJobDescription(text)
    log.info("%s", text)
