"""backfill's input: Parquet, JSON Lines or CSV files read as (topic, partition, value)
rows in input order, and the per-partition plan checked before anything is written."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from app.errors import InvalidRequest
from app.storage.keys import TopicPartition, validate_partition, validate_topic

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from jobs.spark.backfill import BackfillOptions


_SUFFIXES = ((".parquet", "parquet"), (".jsonl", "json"), (".ndjson", "json"),
             (".json", "json"), (".csv", "csv"))


def _format_of(path: str) -> str:
    """The input format from the name, or from the files of a local directory."""
    lowered = path.lower().rstrip("/")
    for suffix, fmt in _SUFFIXES:
        if lowered.endswith(suffix):
            return fmt
    local = urlparse(path)
    if local.scheme in ("", "file") and os.path.isdir(local.path):
        found = {fmt for name in os.listdir(local.path)
                 if not name.startswith(("_", ".")) for suffix, fmt in _SUFFIXES
                 if name.lower().endswith(suffix)}
        if len(found) == 1:
            return found.pop()
    raise ValueError(f"cannot tell the format of {path!r}: pass --format parquet|json|csv")


def read_input(spark: SparkSession, options: BackfillOptions) -> DataFrame:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    formats = {options.input_format or _format_of(p) for p in options.inputs}
    if len(formats) != 1:
        raise ValueError(f"inputs of several formats {sorted(formats)}: one run, one format")
    fmt = formats.pop()
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", str(options.csv_header).lower())
    raw = reader.load(list(options.inputs))
    columns = set(raw.columns)
    for name in (options.value_column, options.topic_column, options.partition_column):
        if name is not None and name not in columns:
            raise ValueError(f"column {name!r} not in the input (columns: {sorted(columns)})")

    value = F.col(options.value_column)
    dtype = raw.schema[options.value_column].dataType
    encoding = options.value_encoding
    if encoding == "auto":
        encoding = "binary" if isinstance(dtype, BinaryType) else "utf8"
    if encoding == "binary":
        if not isinstance(dtype, BinaryType):
            raise ValueError(f"--value-encoding binary needs a binary column, not {dtype}")
        value_expr: Column = value
    elif not isinstance(dtype, StringType):
        raise ValueError(f"value column {options.value_column!r} is {dtype}: "
                         "expected a string or binary column")
    elif encoding == "utf8":
        value_expr = F.encode(value, "UTF-8")
    elif encoding == "base64":
        value_expr = F.unbase64(value)
    elif encoding == "hex":
        value_expr = F.unhex(value)
    else:
        raise ValueError(f"unknown --value-encoding {encoding!r}")
    topic_expr = (F.col(options.topic_column).cast("string") if options.topic_column
                  else F.lit(options.topic))
    partition_expr = (F.col(options.partition_column).cast("int")
                      if options.partition_column else F.lit(options.partition or 0))
    return raw.select(
        topic_expr.alias("topic"),
        partition_expr.alias("partition"),
        value_expr.alias("value"),
        F.col("_metadata.file_path").alias("_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_mono"),
    )


def input_fingerprint(df: DataFrame) -> list[list[Any]]:
    files: list[list[Any]] = []
    for uri in sorted(df.inputFiles()):
        parsed = urlparse(uri)
        size: int | None = None
        mtime: int | None = None
        if parsed.scheme in ("", "file"):
            try:
                st = os.stat(unquote(parsed.path))
                size, mtime = st.st_size, st.st_mtime_ns
            except OSError:
                pass
        files.append([uri, size, mtime])
    return files


def plan_input(df: DataFrame) -> dict[str, list[int]]:
    """Per topic-partition record and byte counts; refuses null values and bad names."""
    from pyspark.sql import functions as F

    rows = df.groupBy("topic", "partition").agg(
        F.count("*").alias("records"),
        F.sum(F.length("value")).alias("bytes"),
        F.sum(F.when(F.col("value").isNull(), 1).otherwise(0)).alias("nulls"),
    ).collect()
    problems: list[str] = []
    plan: dict[str, list[int]] = {}
    for r in rows:
        try:
            tp = TopicPartition(validate_topic(r["topic"]), validate_partition(r["partition"]))
        except InvalidRequest as exc:
            problems.append(f"{r['records']} rows: {exc}")
            continue
        if r["nulls"]:
            problems.append(f"{tp}: {r['nulls']} rows have a null value")
        plan[str(tp)] = [int(r["records"]), int(r["bytes"] or 0)]
    if problems:
        raise ValueError("input refused:\n  " + "\n  ".join(sorted(problems)[:20]))
    return dict(sorted(plan.items()))
