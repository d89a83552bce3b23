"""The command line every job shares: common options, durations, ``run_main``, and
``run_as_main`` for ``python -m jobs.spark.<job>``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from app.settings import Settings, SettingsError
from app.storage.metadata import now_ms
from jobs.spark.job_settings import load_settings
from jobs.spark.progress import Progress
from jobs.spark.report import EXIT_FAILED, JobOutcome, Report
from jobs.spark.session import build_spark, describe, parse_conf
from jobs.spark.textfile import write_job_metrics

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from pyspark.sql import SparkSession

_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``"90"`` (seconds), ``"500ms"``, ``"10s"``, ``"5m"``, ``"1h"``, ``"2d"``."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration like 90s, 5m, 1h")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2) or "s"])


def base_parser(job: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"llog spark {job}",
                                     description=description)
    parser.add_argument("--master", default=None,
                        help="Spark master URL (default local[*]; under spark-submit, "
                             "the master given to spark-submit)")
    parser.add_argument("--report", type=Path, required=True,
                        help="directory for summary.json and the Parquet detail tables")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration (repeatable)")
    parser.add_argument("--tasks", type=int, default=0,
                        help="parallelism: Spark tasks per stage (default: the default "
                             "parallelism of the cluster)")
    parser.add_argument("--stack-json", type=Path, default=None,
                        help="take Oxia/S3 settings from an `llog dev` stack.json "
                             "(otherwise LLOG_* environment variables)")
    parser.add_argument("--root-prefix", default=None,
                        help="override LLOG_ROOT_PREFIX")
    parser.add_argument("--progress-interval", type=float, default=10.0,
                        help="seconds between progress log lines (0: off)")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--metrics-file", type=Path, default=None,
                        help="also write the outcome (exit code, time, audit findings) "
                             "for node_exporter's textfile collector to this file")
    return parser


Options = TypeVar("Options", bound="DataclassInstance")
# A job gets the whole settings: its tasks get them all (job_settings.settings_payload).
JobRunner = Callable[["SparkSession", Settings, Options, Report], JobOutcome]


def finish(spark: SparkSession, report: Report, summary: dict[str, Any], line: str
           ) -> JobOutcome:
    """Write ``summary.json``, log the job's last line, and return its outcome."""
    report.write_summary(summary)
    describe(spark, f"{summary['job']}: {summary['status']}: {line}")
    return JobOutcome(summary, summary["exit_code"])


def options_from_args(options_type: type[Options], args: argparse.Namespace) -> Options:
    """``options_type`` (a dataclass) from the parsed arguments of the same names; the
    fields no option sets keep their defaults, lists become tuples."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(options_type)
              if hasattr(args, f.name)}
    return options_type(**{k: tuple(v) if isinstance(v, list) else v
                           for k, v in values.items()})


def run_main(job: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             runner: JobRunner[Options], options_type: type[Options]) -> int:
    """Parse, build the job's options and the session, run, write the summary; never
    raises (exit codes)."""
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_FAILED
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    job_log = logging.getLogger(f"llog.spark.{job}")
    try:
        settings = load_settings(args.stack_json, args.root_prefix)
        conf = parse_conf(args.conf)
    except (SettingsError, ValueError, OSError) as exc:
        print(f"{job}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    report = Report(args.report)
    started = now_ms()
    from pyspark.sql import SparkSession

    shared = SparkSession.getActiveSession() is not None  # e.g. called inside a test
    try:
        # No Java, or a JVM that does not start: the job could not run (2), never 1,
        # which says the store has findings.
        spark = build_spark(f"llog-{job}", args.master, conf)
    except Exception as exc:
        job_log.exception("%s: the Spark session did not start", job)
        outcome = _failed(report, job, started, exc)
        if args.metrics_file is not None:
            write_job_metrics(args.metrics_file, outcome.summary)
        return outcome.exit_code
    try:
        with Progress(spark, job, args.progress_interval):
            outcome = runner(spark, settings, options_from_args(options_type, args), report)
    except Exception as exc:
        job_log.exception("%s failed", job)
        outcome = _failed(report, job, started, exc)
    finally:
        if not shared:
            spark.stop()
    if args.metrics_file is not None:
        write_job_metrics(args.metrics_file, outcome.summary)
    job_log.info("%s finished with exit code %d; report in %s", job, outcome.exit_code,
                 report.directory)
    return outcome.exit_code


def _failed(report: Report, job: str, started: int, exc: Exception) -> JobOutcome:
    outcome = JobOutcome({
        "job": job, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
        "started_ms": started, "finished_ms": now_ms(), "exit_code": EXIT_FAILED,
    }, EXIT_FAILED)
    report.write_summary(outcome.summary)
    return outcome


def entry_point(job: str, build_parser: Callable[[], argparse.ArgumentParser],
                runner: JobRunner[Options], options_type: type[Options]
                ) -> Callable[[Sequence[str] | None], int]:
    """A job's ``main(argv) -> exit code``."""

    def main(argv: Sequence[str] | None = None) -> int:
        return run_main(job, build_parser(), argv, runner, options_type)

    return main


def run_as_main(module: str) -> NoReturn:
    """Each job's ``if __name__ == "__main__"`` (``python -m jobs.spark.<job>``): exit with
    the ``main`` of the importable ``module`` rather than of ``__main__``, since the
    functions Spark ships to its executors must be found under the module's own name."""
    sys.exit(importlib.import_module(module).main(sys.argv[1:]))
