"""``llog spark <job> ...``: one entry point for every Spark job.

    from jobs.spark.cli import main
    sys.exit(main(["audit", "--report", "/tmp/audit", "--deep"]))
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence

JOBS = ("audit", "vacuum", "backfill", "export")

USAGE = """usage: llog spark {audit,vacuum,backfill,export} [options]

  audit     check indexes, objects, strays, stale records and orphans (exit 1: corruption)
  vacuum    delete orphan objects older than the retry horizon (dry run unless --apply)
  backfill  bulk-load Parquet / JSON Lines / CSV records through the commit protocol
  export    export topic-partition offset ranges to Parquet, Delta or Iceberg

`llog spark <job> --help` describes a job's options. See docs/spark-jobs.md."""


def _job(name: str) -> Callable[[Sequence[str] | None], int]:
    if name == "audit":
        from jobs.spark.audit import main as audit

        return audit
    if name == "vacuum":
        from jobs.spark.vacuum import main as vacuum

        return vacuum
    if name == "backfill":
        from jobs.spark.backfill import main as backfill

        return backfill
    from jobs.spark.export import main as export

    return export


def spark_available() -> bool:
    return importlib.util.find_spec("pyspark") is not None


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` (a job name) with the remaining arguments; returns the exit code."""
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in JOBS:
        print(f"unknown Spark job {name!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    if not spark_available():
        print("the Spark jobs need pyspark: pip install -e '.[spark]' (and Java 17+)",
              file=sys.stderr)
        return 2
    return _job(name)(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
