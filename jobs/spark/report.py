"""What a job leaves behind: ``summary.json``, Parquet tables, and its exit code."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.settings import S3Settings, StoreSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

EXIT_OK = 0
EXIT_FINDINGS = 1  # audit found corruption; backfill/export/vacuum had failed items
EXIT_FAILED = 2  # the job could not run (arguments, settings, storage, Spark)
# vacuum: some metadata does not parse or has a newer format; nothing was deleted
EXIT_UNREADABLE_METADATA = 3


@dataclass
class JobOutcome:
    summary: dict[str, Any]
    exit_code: int


def job_header(job: str, status: str, exit_code: int, started_ms: int, finished_ms: int,
               s3: S3Settings, store: StoreSettings, options: Any) -> dict[str, Any]:
    """The fields every job's ``summary.json`` starts with (``options``: a dataclass)."""
    return {
        "job": job,
        "status": status,
        "exit_code": exit_code,
        "started_ms": started_ms,
        "finished_ms": finished_ms,
        "duration_s": round((finished_ms - started_ms) / 1000, 3),
        "root_prefix": store.root_prefix,
        "bucket": s3.s3_bucket,
        "options": {k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in dataclasses.asdict(options).items()},
    }


@dataclass
class Report:
    """``DIR/summary.json`` plus one Parquet dataset per detail table under ``DIR/``.

    Spark's executors write the tables, so on a cluster ``DIR`` must be on a filesystem
    every executor and the driver share (a local path is right for ``local[*]``).
    """

    directory: Path
    tables: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.directory = self.directory.expanduser().resolve()
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> str:
        return str(self.directory / name)

    def write_table(self, df: DataFrame, name: str) -> str:
        path = self.path(name)
        df.write.mode("overwrite").parquet(path)
        self.tables[name] = path
        return path

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        out = dict(summary)
        out.setdefault("tables", dict(self.tables))
        target = self.directory / "summary.json"
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(out, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(target)
        return target
