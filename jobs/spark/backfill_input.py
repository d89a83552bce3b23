"""backfill's input: Parquet, JSON Lines or CSV files read as (topic, partition, value)
rows in input order, with the record fields the input has (key, headers, timestamp_ms),
and the per-partition plan checked before anything is written."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from app.errors import InvalidRequest
from app.storage.keys import TopicPartition, validate_partition, validate_topic

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from jobs.spark.backfill_options import BackfillOptions


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


# The optional record fields, by the name of their column in the input (and in export).
RECORD_FIELDS = ("key", "headers", "timestamp_ms")
MAX_HEADERS = 0xFFFF  # bytes-batch-v2: u16 header count and name length
MAX_HEADER_NAME_BYTES = 0xFFFF


def field_options(options: BackfillOptions) -> dict[str, str | None]:
    return {"key": options.key_column, "headers": options.headers_column,
            "timestamp_ms": options.timestamp_column}


def field_columns(options: BackfillOptions, columns: set[str]) -> dict[str, str]:
    """Record field -> input column: a field's option names its column (which must
    exist), ``""`` ignores the field, and left unset the column of the field's own name
    is used when the input has one."""
    out: dict[str, str] = {}
    for field_name, column in field_options(options).items():
        if column is None:
            if field_name in columns:
                out[field_name] = field_name
        elif column:
            if column not in columns:
                raise ValueError(f"column {column!r} not in the input (columns: "
                                 f"{sorted(columns)})")
            out[field_name] = column
    return out


def _bytes_of(column: Column, dtype: Any, encoding: str, what: str) -> Column:
    """``column`` as bytes: binary as it is, a string by ``encoding``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType

    if encoding == "auto":
        encoding = "binary" if isinstance(dtype, BinaryType) else "utf8"
    if encoding == "binary":
        if not isinstance(dtype, BinaryType):
            raise ValueError(f"{what}: encoding binary needs a binary column, not {dtype}")
        return column
    if not isinstance(dtype, StringType):
        raise ValueError(f"{what} is {dtype}: expected a string or binary column")
    converters = {"utf8": lambda c: F.encode(c, "UTF-8"), "base64": F.unbase64,
                  "hex": F.unhex}
    if encoding not in converters:
        raise ValueError(f"{what}: unknown encoding {encoding!r}")
    return converters[encoding](column)


def _headers_of(column: Column, dtype: Any) -> Column:
    """A list of ``{name, value}`` structs (``value`` binary or UTF-8 text, or
    ``base64`` text as in the HTTP API) as a list of ``{name string, value binary}``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StructType

    element = dtype.elementType if isinstance(dtype, ArrayType) else None
    fields = ({f.name: f.dataType for f in element.fields}
              if isinstance(element, StructType) else {})
    if "name" not in fields or not ({"value", "base64"} & set(fields)):
        raise ValueError(f"headers column is {dtype}: expected a list of structs with "
                         "a name and a value (or base64)")

    def one(h: Column) -> Column:
        parts = []
        if "value" in fields:
            parts.append(_bytes_of(h["value"], fields["value"], "auto", "header value"))
        if "base64" in fields:
            parts.append(_bytes_of(h["base64"], fields["base64"], "base64", "header base64"))
        return F.struct(h["name"].cast("string").alias("name"),
                        F.coalesce(*parts).alias("value"))

    return F.transform(column, one)


def _timestamp_of(column: Column, dtype: Any) -> Column:
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType, TimestampType

    if isinstance(dtype, IntegralType):
        return column.cast("long")
    if isinstance(dtype, TimestampType):
        return F.unix_millis(column)
    raise ValueError(f"timestamp column is {dtype}: expected integer milliseconds since "
                     "the epoch, or a timestamp")


def _field_exprs(raw: DataFrame, options: BackfillOptions) -> dict[str, Column]:
    """The record fields the input carries, converted, by field name."""
    from pyspark.sql import functions as F

    exprs: dict[str, Column] = {}
    for field_name, column in field_columns(options, set(raw.columns)).items():
        dtype = raw.schema[column].dataType
        if field_name == "key":
            exprs[field_name] = _bytes_of(F.col(column), dtype, options.key_encoding,
                                          f"key column {column!r}")
        elif field_name == "headers":
            exprs[field_name] = _headers_of(F.col(column), dtype)
        else:
            exprs[field_name] = _timestamp_of(F.col(column), dtype)
    return exprs


def _record_size(fields: dict[str, Column]) -> Column:
    """What a record counts against chunk budgets (as ``LogRecord.size``): value, key,
    header names and values; for plain records the value's length alone."""
    from pyspark.sql import functions as F

    size = F.length("value")
    if "key" in fields:
        size = size + F.coalesce(F.length("key"), F.lit(0))
    if "headers" in fields:
        size = size + F.coalesce(F.aggregate(
            "headers", F.lit(0), lambda acc, h: acc + F.length(F.encode(h["name"], "UTF-8"))
            + F.coalesce(F.length(h["value"]), F.lit(0))), F.lit(0))
    return size


def read_input(spark: SparkSession, options: BackfillOptions) -> DataFrame:
    """Rows ``topic, partition, value``, the record fields the input has (``key``,
    ``headers``, ``timestamp_ms``), ``_size`` and the input position columns."""
    from pyspark.sql import functions as F

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
    value_expr = _bytes_of(F.col(options.value_column),
                           raw.schema[options.value_column].dataType, options.value_encoding,
                           f"value column {options.value_column!r}")
    fields = _field_exprs(raw, options)
    topic_expr = (F.col(options.topic_column).cast("string") if options.topic_column
                  else F.lit(options.topic))
    partition_expr = (F.col(options.partition_column).cast("int")
                      if options.partition_column else F.lit(options.partition or 0))
    return raw.select(
        topic_expr.alias("topic"),
        partition_expr.alias("partition"),
        value_expr.alias("value"),
        *[expr.alias(name) for name, expr in fields.items()],
        F.col("_metadata.file_path").alias("_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_mono"),
    ).withColumn("_size", _record_size(fields))


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


def _row_checks(columns: list[str]) -> dict[str, tuple[Column, str]]:
    """Per-row refusals: a condition and what it means, by name."""
    from pyspark.sql import functions as F

    checks = {"nulls": (F.col("value").isNull(), "rows have a null value")}
    if "headers" in columns:
        checks["bad_headers"] = ((F.size("headers") > MAX_HEADERS) | F.exists(
            "headers", lambda h: h["name"].isNull() | h["value"].isNull()
            | (F.length(F.encode(h["name"], "UTF-8")) > MAX_HEADER_NAME_BYTES)),
            f"rows have a header without a name or value, a name over "
            f"{MAX_HEADER_NAME_BYTES} bytes, or over {MAX_HEADERS} headers")
    if "timestamp_ms" in columns:
        checks["negative_timestamps"] = (F.col("timestamp_ms") < 0,
                                         "rows have a negative timestamp_ms")
    return checks


def plan_input(df: DataFrame) -> dict[str, list[int]]:
    """Per topic-partition record and byte counts; refuses null values, bad names and
    record fields the encoding cannot hold, before anything is written."""
    from pyspark.sql import functions as F

    checks = _row_checks(df.columns)
    rows = df.groupBy("topic", "partition").agg(
        F.count("*").alias("records"),
        F.sum("_size").alias("bytes"),
        *[F.sum(F.when(cond, 1).otherwise(0)).alias(name)
          for name, (cond, _) in checks.items()],
    ).collect()
    problems: list[str] = []
    plan: dict[str, list[int]] = {}
    for r in rows:
        try:
            tp = TopicPartition(validate_topic(r["topic"]), validate_partition(r["partition"]))
        except InvalidRequest as exc:
            problems.append(f"{r['records']} rows: {exc}")
            continue
        problems += [f"{tp}: {r[name]} {what}" for name, (_, what) in checks.items()
                     if r[name]]
        plan[str(tp)] = [int(r["records"]), int(r["bytes"] or 0)]
    if problems:
        raise ValueError("input refused:\n  " + "\n  ".join(sorted(problems)[:20]))
    return dict(sorted(plan.items()))
