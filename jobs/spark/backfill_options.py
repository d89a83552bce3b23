"""backfill's options: what the command line and a job's manifest say, read by the
driver's steps and by the input's reading alike."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1024 * 1024


@dataclass(frozen=True)
class BackfillOptions:
    inputs: tuple[str, ...]
    input_format: str | None = None  # parquet | json | csv; None: by file extension
    value_column: str = "value"
    value_encoding: str = "auto"  # auto | utf8 | base64 | hex | binary
    # Record fields: None takes the column of the field's name when the input has one,
    # "" ignores the field, a name must be a column of the input.
    key_column: str | None = None
    key_encoding: str = "auto"  # as value_encoding
    headers_column: str | None = None
    timestamp_column: str | None = None
    topic_column: str | None = None
    partition_column: str | None = None
    topic: str | None = None
    partition: int | None = None
    csv_header: bool = True
    job_id: str | None = None
    chunk_records: int = 5000
    chunk_bytes: int = 4 * MiB
    blob_bytes: int = 16 * MiB
    marker_every: int = 16
    tasks: int = 0
    max_records_per_second: float = 0.0  # per task; 0: unlimited
