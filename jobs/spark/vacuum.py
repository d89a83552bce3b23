"""vacuum: delete orphan objects, and only those that provably are orphans.

The rule (seed 003, docs/protocol.md "Open points"): an object may be deleted only if
it is older than the retry horizon of every writer and compactor, **and** a complete
scan, made in the same run after the object was listed, shows that no index entry
(strays included), pending record or ``meta/compaction`` record references it.

1. An anchor object ``{root}/_jobs/vacuum/{run}/started`` is created and listed: its
   LastModified is the scan start on the object store's own clock (no clock skew
   between the driver and S3 in any age computation).
2. ``wal-shared/`` and every partition's ``data/`` are listed in Spark tasks; the
   listing is written to ``report/objects`` and read back, so it is taken once.
3. Only then are partitions discovered again and every partition's references read
   (Spark tasks, :func:`jobs.spark.scan.read_snapshot`).
4. An object is deleted only if it is unreferenced, the reference scan of every
   partition succeeded and found no record this release cannot fully read (fail
   closed: such a record may name any object; then nothing is deleted and the job
   exits 3), it was last modified before the scan start, and it is older
   than the retry horizon (+1 s for second-granular timestamps): the writers' own
   ``LLOG_RETRY_HORIZON_MS``, or a longer ``--retry-horizon``. Everything else is
   kept, with the reason. Dry run by default; ``--apply`` deletes.

    python -m jobs.spark.vacuum --report /tmp/vacuum [--retry-horizon 2h] [--apply]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from app.errors import LlogError
from app.settings import S3Settings, Settings, StoreSettings
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from jobs.spark.job_settings import settings_payload
from jobs.spark.report import (
    EXIT_FAILED,
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_UNREADABLE_METADATA,
    JobOutcome,
    Report,
    job_header,
)
from jobs.spark.runner import base_parser, entry_point, finish, run_as_main
from jobs.spark.scan import (
    SnapshotHandler,
    Tagged,
    add_scan_arguments,
    list_then_discover,
    scan_partitions,
)
from jobs.spark.session import default_tasks, describe
from jobs.spark.snapshot import REFERENCE_COLUMNS, PartitionSnapshot, reference_rows
from jobs.spark.stores import job_object_key, open_stores
from jobs.spark.tasks import run_async, task_identity, task_logger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOB = "vacuum"
TIMESTAMP_SLACK_MS = 1000  # S3 timestamps may be truncated to the second
DELETE_CONCURRENCY = 16

STATUS_COLUMNS = ("topic string, partition int, references long, stable boolean, "
                  "attempts int, errors array<string>, error string")
# At most this many unreadable partitions are named in summary.json (all of them are in
# the partitions table).
SUMMARY_UNREADABLE = 1000
DECISION_COLUMNS = (
    "key string, size long, last_modified_ms long, area string, topic string, "
    "partition int, age_ms long, action string, reason string, error string"
)

KEEP = "kept"
DELETED = "deleted"
WOULD_DELETE = "would_delete"
DELETE_FAILED = "delete_failed"


@dataclass(frozen=True)
class VacuumOptions:
    retry_horizon_ms: int | None = None  # None: the writers' Settings.retry_horizon_ms
    apply: bool = False
    tasks: int = 0
    listing_fanout: int = 16
    concurrency: int = 8
    unsafe_short_horizon: bool = False


def decide(*, referenced: bool, complete: bool, last_modified_ms: int, scan_started_ms: int,
           retry_horizon_ms: int) -> tuple[bool, str]:
    """(delete?, reason) for one listed object: the whole deletion rule, pure."""
    if referenced:
        return False, "referenced"
    if not complete:
        return False, "reference_scan_incomplete"
    if last_modified_ms >= scan_started_ms:
        return False, "created_after_scan_start"
    if scan_started_ms - last_modified_ms <= retry_horizon_ms + TIMESTAMP_SLACK_MS:
        return False, "younger_than_retry_horizon"
    return True, "orphan_older_than_retry_horizon"


class VacuumHandler(SnapshotHandler):
    async def handle(self, snap: PartitionSnapshot) -> list[Tagged]:
        refs = reference_rows(self.stores.layout, snap)
        rows: list[Tagged] = [("R", r) for r in refs]
        rows.append(("P", (snap.tp.topic, snap.tp.partition, len(refs), snap.stable,
                           snap.attempts, snap.unreadable(), None)))
        return rows

    def on_error(self, tp: TopicPartition, exc: BaseException) -> list[Tagged]:
        return [("P", (tp.topic, tp.partition, None, None, None, [],
                       f"{type(exc).__name__}: {exc}"))]


def retry_horizon(settings: StoreSettings, options: VacuumOptions) -> int:
    """The horizon of this run: the writers' own setting unless a longer one is asked
    for. Writers refuse to commit a blob older than half of ``retry_horizon_ms``, so an
    object older than it can no longer become referenced; a shorter horizon could
    delete a blob a writer is about to commit."""
    configured = settings.retry_horizon_ms
    requested = options.retry_horizon_ms
    if requested is None:
        return configured
    if requested < configured and not options.unsafe_short_horizon:
        raise ValueError(
            f"--retry-horizon {requested} ms is shorter than the writers' retry horizon "
            f"(LLOG_RETRY_HORIZON_MS={configured}): a writer could still commit a blob "
            "that young. Pass --unsafe-short-horizon only where no writer runs (tests).")
    return requested


def delete_task(payload: Mapping[str, str], complete: bool, scan_started_ms: int,
                retry_horizon_ms: int, apply: bool, rows: Iterable[Any]
                ) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: decide for every listed object, delete if allowed."""
    todo = list(rows)
    logger = task_logger(JOB)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            limiter = anyio.CapacityLimiter(DELETE_CONCURRENCY)
            out.extend([None] * len(todo))  # type: ignore[list-item]

            async def one(i: int, r: Any) -> None:
                delete, reason = decide(
                    referenced=bool(r["referenced"]), complete=complete,
                    last_modified_ms=int(r["last_modified_ms"]),
                    scan_started_ms=scan_started_ms, retry_horizon_ms=retry_horizon_ms)
                action, error = KEEP, None
                if delete and not apply:
                    action = WOULD_DELETE
                elif delete:
                    try:
                        async with limiter:
                            await stores.s3.delete(r["key"])
                        action = DELETED
                    except LlogError as exc:
                        action, error = DELETE_FAILED, str(exc)
                out[i] = (r["key"], r["size"], r["last_modified_ms"], r["area"], r["topic"],
                          r["partition"], scan_started_ms - int(r["last_modified_ms"]),
                          action, reason, error)

            for base in range(0, len(todo), 5000):  # bounded number of tasks at once
                async with anyio.create_task_group() as tg:
                    for i in range(base, min(base + 5000, len(todo))):
                        tg.start_soon(one, i, todo[i])
            deleted = sum(1 for row in out if row[7] == DELETED)
            if deleted:
                logger.info("deleted %d orphan objects", deleted)

    run_async(run)
    return iter(out)


def _anchor(settings: Settings, run_id: str, *, remove: bool = False) -> int:
    """Create (or remove) the run's anchor object; its LastModified on the S3 clock."""
    payload = settings_payload(settings)

    async def run() -> int:
        async with open_stores(payload, task_identity(JOB)) as stores:
            key = job_object_key(stores.layout, "vacuum", run_id, "started")
            if remove:
                await stores.s3.delete(key)
                return 0
            await stores.s3.create_if_absent(key, b"vacuum scan anchor\n")
            async for info in stores.s3.list(key):
                if info.key == key:
                    return info.last_modified_ms
            raise LlogError(f"the anchor object {key} was created but is not listed")

    return run_async(run)


@dataclass
class ScanVerdict:
    """Whether the references read are all there are; nothing is deleted unless so."""

    partitions: int
    failed: int
    unstable: int
    unreadable: int
    unreadable_partitions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        # Fail closed: an unreadable record may name any shared blob and any object of
        # its partition, so the set of references is not known to be complete.
        return self.failed == 0 and self.unstable == 0 and self.unreadable == 0


def scan_verdict(status: DataFrame) -> ScanVerdict:
    from pyspark.sql import functions as F

    s = status.agg(
        F.count("*").alias("n"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("failed"),
        F.sum(F.when(F.col("stable") == F.lit(False), 1).otherwise(0)).alias("unstable"),
        F.sum(F.when(F.size("errors") > 0, 1).otherwise(0)).alias("unreadable"),
    ).collect()[0]
    named = [
        {"topic": r["topic"], "partition": r["partition"], "errors": list(r["errors"])}
        for r in status.where(F.size("errors") > 0).orderBy("topic", "partition")
        .limit(SUMMARY_UNREADABLE).collect()
    ]
    return ScanVerdict(int(s["n"] or 0), int(s["failed"] or 0), int(s["unstable"] or 0),
                       int(s["unreadable"] or 0), named)


def _decide_all(spark: SparkSession, settings: Settings, objects: DataFrame,
                refs: DataFrame, complete: bool, scan_started: int, horizon: int,
                apply: bool, report: Report) -> DataFrame:
    """Decide for (and with ``apply`` delete) every listed object in Spark tasks; the
    decisions, written to ``report/decisions``."""
    from pyspark.sql import functions as F

    describe(spark, f"vacuum: {'deleting' if apply else 'dry run: deciding'} "
             f"(retry horizon {horizon} ms)")
    joined = objects.join(
        refs.where(F.col("key").isNotNull()).select("key").distinct()
        .withColumn("referenced", F.lit(True)), "key", "left_outer",
    ).fillna({"referenced": False})
    body = functools.partial(delete_task, settings_payload(settings), complete,
                             scan_started, horizon, apply)
    decisions = spark.createDataFrame(joined.rdd.mapPartitions(body), DECISION_COLUMNS,
                                      verifySchema=False)
    return spark.read.parquet(report.write_table(decisions, "decisions"))


def _tally(decisions: DataFrame) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(count and bytes per action, count per action and reason)."""
    from pyspark.sql import functions as F

    reasons: dict[str, dict[str, int]] = {}
    for row in decisions.groupBy("action", "reason").agg(F.count("*").alias("n")).collect():
        reasons.setdefault(row["action"], {})[row["reason"]] = int(row["n"])
    totals = {
        row["action"]: {"count": int(row["n"]), "bytes": int(row["bytes"] or 0)}
        for row in decisions.groupBy("action").agg(
            F.count("*").alias("n"), F.sum("size").alias("bytes")).collect()
    }
    return totals, reasons


def _status(verdict: ScanVerdict, delete_failed: int) -> tuple[str, int]:
    if verdict.unreadable:
        return "unreadable_metadata", EXIT_UNREADABLE_METADATA
    if not verdict.complete:
        return "incomplete", EXIT_FAILED
    if delete_failed:
        return "delete_failures", EXIT_FINDINGS
    return "ok", EXIT_OK


def _summary(s3: S3Settings, store: StoreSettings, options: VacuumOptions, horizon: int,
             started: int, scan_started: int, listed: int, verdict: ScanVerdict,
             decisions: DataFrame) -> dict[str, Any]:
    totals, reasons = _tally(decisions)
    status, code = _status(verdict, totals.get(DELETE_FAILED, {}).get("count", 0))
    none = {"count": 0, "bytes": 0}
    return {
        **job_header(JOB, status, code, started, now_ms(), s3, store, options),
        "dry_run": not options.apply,
        "scan_started_ms": scan_started,
        "retry_horizon_ms": horizon,
        "partitions": verdict.partitions,
        "partitions_failed": verdict.failed,
        "partitions_unstable": verdict.unstable,
        "partitions_unreadable": verdict.unreadable,
        "unreadable_partitions": verdict.unreadable_partitions,
        "reference_scan_complete": verdict.complete,
        "objects_listed": listed,
        "actions": totals,
        "reasons": reasons,
        "deleted": totals.get(DELETED, none),
        "would_delete": totals.get(WOULD_DELETE, none),
        "kept": totals.get(KEEP, none),
    }


def run_vacuum(spark: SparkSession, settings: Settings, options: VacuumOptions,
               report: Report, *, later: Callable[[int], int] | None = None) -> JobOutcome:
    """``later``: the scan start to use given the anchor's, for tests that age objects
    without waiting for the S3 clock (it may only move the start later; the rest of the
    rule, and the scan's order, are unchanged)."""
    horizon = retry_horizon(settings, options)
    started = now_ms()
    tasks = default_tasks(spark, options.tasks)
    run_id = uuid.uuid4().hex
    scan_started = anchored = _anchor(settings, run_id)
    if later is not None:
        scan_started = max(anchored, later(anchored))
    try:
        describe(spark, f"vacuum: scan started at {scan_started} (S3 clock)")
        objects, partitions = list_then_discover(spark, settings, JOB,
                                                 options.listing_fanout, tasks, report)
        listed = objects.count()
        # References are read only now, after the listing is complete.
        describe(spark, f"vacuum: {listed} objects listed; reading the references of "
                 f"{len(partitions)} partitions")
        tables = scan_partitions(
            spark, settings, JOB, partitions, tasks, options.concurrency, VacuumHandler,
            {"P": ("partitions", STATUS_COLUMNS), "R": ("references", REFERENCE_COLUMNS)},
            report)
        verdict = scan_verdict(tables["partitions"])
        if not verdict.complete:
            describe(spark, f"vacuum: reference scan incomplete ({verdict.failed} partitions "
                     f"failed, {verdict.unstable} unstable, {verdict.unreadable} with "
                     "unreadable metadata): nothing will be deleted")
        decisions = _decide_all(spark, settings, objects, tables["references"],
                                verdict.complete, scan_started, horizon, options.apply, report)
    finally:
        # A leftover anchor is a few bytes outside every data prefix.
        with contextlib.suppress(LlogError):
            _anchor(settings, run_id, remove=True)
    summary = _summary(settings.s3, settings.store, options, horizon, started, scan_started,
                       listed, verdict, decisions)
    return finish(spark, report, summary, f"{summary['deleted']['count']} deleted, "
                  f"{summary['would_delete']['count']} would be deleted, "
                  f"{summary['kept']['count']} kept")


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(JOB, "Delete orphan objects older than the retry horizon "
                              "(dry run unless --apply).")
    add_scan_arguments(parser)
    parser.add_argument("--apply", action="store_true",
                        help="really delete (default: dry run, report only)")
    parser.add_argument("--unsafe-short-horizon", action="store_true",
                        help="allow a horizon shorter than LLOG_RETRY_HORIZON_MS "
                             "(only where no writer is running)")
    return parser


main = entry_point(JOB, build_parser, run_vacuum, VacuumOptions)


if __name__ == "__main__":
    run_as_main("jobs.spark.vacuum")
