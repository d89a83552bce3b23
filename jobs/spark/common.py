"""Plumbing shared by the Spark jobs (see docs/spark-jobs.md).

- Settings travel to executors as the plain ``LLOG_*`` dictionary of
  :meth:`Settings.as_env`; each task rebuilds a :class:`Settings` from it and opens the
  project's own :class:`OxiaStore` and :class:`S3Store` inside ``anyio.run`` (or an anyio
  blocking portal when a task streams rows), so executors speak to Oxia and S3 with
  exactly the codecs, conditional creates and retries of the brokers.
- The driver only plans (discovery, key ranges) and gathers small aggregates; every
  listing, Oxia scan, S3 read or write and delete runs in Spark tasks.
- Every job writes ``summary.json`` and Parquet tables into its ``--report`` directory.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from app.settings import Settings, SettingsError
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metrics import StoreMetrics
from app.storage.oxia_store import OxiaStore
from app.storage.s3 import S3Store

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import DataFrame, SparkSession

T = TypeVar("T")
SettingsPayload = dict[str, str]
JOBS_PREFIX = "_jobs"  # {root}/_jobs/...: objects of the jobs themselves (never data)
EXIT_OK = 0
EXIT_FINDINGS = 1  # audit found corruption; backfill/export/vacuum had failed items
EXIT_FAILED = 2  # the job could not run (arguments, settings, storage, Spark)
# vacuum: some metadata does not parse or has a newer format; nothing was deleted
EXIT_UNREADABLE_METADATA = 3

log = logging.getLogger("llog.spark")


def now_ms() -> int:
    return int(time.time() * 1000)


# -- settings --------------------------------------------------------------------------


def settings_payload(settings: Settings) -> SettingsPayload:
    """The settings as plain ``LLOG_*`` strings: picklable and free of secrets' objects."""
    return settings.as_env()


def settings_from_payload(payload: Mapping[str, str], **overrides: object) -> Settings:
    values: dict[str, Any] = {
        key[len("LLOG_"):].lower(): value
        for key, value in payload.items() if key.startswith("LLOG_")
    }
    values.update(overrides)
    return Settings(**values)


_STACK_FIELDS = ("oxia_address", "oxia_namespace", "s3_endpoint", "s3_bucket", "s3_region",
                 "s3_access_key", "s3_secret_key", "root_prefix")


def load_settings(stack_json: Path | None = None, root_prefix: str | None = None) -> Settings:
    """``LLOG_*`` environment, optionally overridden by an ``llog dev`` stack.json."""
    overrides: dict[str, object] = {}
    if stack_json is not None:
        data = json.loads(stack_json.read_text())
        overrides.update({k: data[k] for k in _STACK_FIELDS if data.get(k) is not None})
    if root_prefix:
        overrides["root_prefix"] = root_prefix
    return Settings.from_env(**overrides)


# -- stores inside tasks ---------------------------------------------------------------


@dataclass
class Stores:
    settings: Settings
    layout: KeyLayout
    metrics: StoreMetrics
    oxia: OxiaStore
    s3: S3Store


@contextlib.asynccontextmanager
async def open_stores(payload: Mapping[str, str], identity: str) -> AsyncIterator[Stores]:
    """The project's own Oxia and S3 clients, for one task (or the driver)."""
    settings = settings_from_payload(payload, broker_id=identity)
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings, metrics, identity=identity) as ox:
        try:
            async with S3Store(settings, metrics) as s3:
                yield Stores(settings, layout, metrics, ox, s3)
        finally:
            quiet_oxia_close(ox)


def quiet_oxia_close(oxia: OxiaStore) -> None:
    """Tell the client's shard-assignment thread that a close is coming.

    ``oxia.Client.close`` (0.2.x) closes its channels before it flags its service
    discovery as closed, so the assignment thread can retry on a closed channel and die
    with ``ValueError: Cannot invoke RPC: Channel closed!``. Setting the flag first
    makes that thread leave quietly. Harmless if the client's internals change.
    """
    discovery = getattr(oxia.client, "_service_discovery", None)
    if discovery is not None and hasattr(discovery, "_closed"):
        discovery._closed = True


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(fn)``, or in a thread of its own when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result()


def task_identity(job: str) -> str:
    """An Oxia client identity for the current Spark task (or the driver)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is always there in a task
        ctx = None
    if ctx is None:
        return f"spark-{job}-driver-{os.getpid()}"
    return f"spark-{job}-s{ctx.stageId()}-p{ctx.partitionId()}-a{ctx.attemptNumber()}"


def task_attempt_id() -> int:
    """Spark's id of this task attempt, unique within the application (a retry or a
    speculative copy of the same task has another); outside a task, this process's."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return os.getpid() if ctx is None else int(ctx.taskAttemptId())


def task_logger(job: str) -> logging.Logger:
    """A logger for executor code: stderr of the Python worker (the executor's log)."""
    logger = logging.getLogger(f"llog.spark.{job}.task")
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def partition_slices(items: int, tasks: int, per_task: int = 2) -> int:
    """How many Spark partitions to cut ``items`` units into."""
    return max(1, min(items, max(1, tasks) * per_task))


# -- discovery -------------------------------------------------------------------------

_PARTITION_KEY_DEPTH = 5  # {topic}/partitions/{p}/{a}/{b} below the root
_DIGITS = re.compile(r"[0-9]+")


def parse_partition_key(layout: KeyLayout, key: str) -> TopicPartition | None:
    """The topic-partition of any ``{root}/{topic}/partitions/{p}/(meta|index)/…`` key."""
    prefix = layout.root + "/"
    if not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/")
    if len(parts) != _PARTITION_KEY_DEPTH or parts[1] != "partitions":
        return None
    topic, _, partition, area, _name = parts
    if area not in ("meta", "index") or not _DIGITS.fullmatch(partition):
        return None
    if str(int(partition)) != partition:
        return None
    try:
        return TopicPartition(topic, int(partition))
    except ValueError:
        return None


async def discover_all(oxia: OxiaStore, layout: KeyLayout) -> list[TopicPartition]:
    """Every topic-partition with any ``meta/`` or ``index/`` key.

    A superset of :func:`app.storage.catalog.discover_partitions` (same single listing):
    a partition whose ``meta/control`` were lost but whose index survives is still
    audited, and still counts as holding references for vacuum.
    """
    low = layout.root + "/"
    high = layout.root + "/~" * _PARTITION_KEY_DEPTH
    keys = await oxia.list_keys(low, high)
    found = {tp for key in keys if (tp := parse_partition_key(layout, key)) is not None}
    return sorted(found)


def discover_on_driver(settings: Settings, job: str) -> list[TopicPartition]:
    payload = settings_payload(settings)

    async def run() -> list[TopicPartition]:
        async with open_stores(payload, task_identity(job)) as stores:
            return await discover_all(stores.oxia, stores.layout)

    return run_async(run)


# -- Spark -----------------------------------------------------------------------------


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


class Progress:
    """Logs the progress of running Spark stages every ``interval_s`` from the driver."""

    def __init__(self, spark: SparkSession, job: str, interval_s: float) -> None:
        self._spark = spark
        self._log = logging.getLogger(f"llog.spark.{job}")
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: dict[int, tuple[int, int]] = {}

    def __enter__(self) -> Progress:
        if self._interval > 0:
            self._thread = threading.Thread(target=self._run, name="spark-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(self._interval):
            try:
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is None:
                        continue
                    state = (info.numCompletedTasks, info.numActiveTasks)
                    if self._last.get(stage_id) == state:
                        continue
                    self._last[stage_id] = state
                    self._log.info(
                        "stage %d (%s): %d/%d tasks done, %d running, %d failed",
                        stage_id, info.name, info.numCompletedTasks, info.numTasks,
                        info.numActiveTasks, info.numFailedTasks,
                    )
            except Exception:  # the context may be stopping; progress is best effort
                return


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


# -- reports ---------------------------------------------------------------------------


@dataclass
class JobOutcome:
    summary: dict[str, Any]
    exit_code: int


def job_header(job: str, status: str, exit_code: int, started_ms: int, finished_ms: int,
               settings: Settings, options: Any) -> dict[str, Any]:
    """The fields every job's ``summary.json`` starts with (``options``: a dataclass)."""
    return {
        "job": job,
        "status": status,
        "exit_code": exit_code,
        "started_ms": started_ms,
        "finished_ms": finished_ms,
        "duration_s": round((finished_ms - started_ms) / 1000, 3),
        "root_prefix": settings.root_prefix,
        "bucket": settings.s3_bucket,
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


# -- command line ----------------------------------------------------------------------


_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(text: str) -> int:
    """``"90"`` (seconds), ``"500ms"``, ``"10s"``, ``"5m"``, ``"1h"``, ``"2d"``."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration like 90s, 5m, 1h")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2) or "s"])


def base_parser(job: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"python -m jobs.spark.{job}",
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
    return parser


Options = TypeVar("Options")
JobRunner = Callable[["SparkSession", Settings, Options, Report], JobOutcome]


def run_main(job: str, parser: argparse.ArgumentParser, argv: Sequence[str] | None,
             runner: JobRunner[Options],
             options_from_args: Callable[[argparse.Namespace], Options]) -> int:
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
    spark = build_spark(f"llog-{job}", args.master, conf)
    try:
        with Progress(spark, job, args.progress_interval):
            outcome = runner(spark, settings, options_from_args(args), report)
    except Exception as exc:
        job_log.exception("%s failed", job)
        report.write_summary({
            "job": job, "status": "failed", "error": f"{type(exc).__name__}: {exc}",
            "started_ms": started, "finished_ms": now_ms(), "exit_code": EXIT_FAILED,
        })
        return EXIT_FAILED
    finally:
        if not shared:
            spark.stop()
    job_log.info("%s finished with exit code %d; report in %s", job, outcome.exit_code,
                 report.directory)
    return outcome.exit_code


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
