"""audit: check every topic-partition's index against the protocol's invariants.

For every topic-partition (one Spark task handles a slice of them):

- the index entries (strays excluded) and the pending append tile ``log start..high
  watermark`` with no gap and no overlap; WAL entries inside a compacted range are
  reported as **strays** (warnings), as docs/protocol.md defines them, not as
  corruption; entries wholly below the log start are counted as **trimmable** (info:
  retention moved the log start, compaction has not trimmed them yet);
- every partition with data belongs to a topic of the catalog that counts it, and
  every catalog record parses;
- every object an entry, the pending record or ``meta/compaction`` names exists, and
  every slice lies inside its object; ``--deep`` also fetches and decodes every slice and
  compacted object and checks ``msg_count``, ``crc32c`` and the LLS1 header;
- stale pending appends (not materialised) and ``meta/compaction`` records, with age;
- orphans: objects under ``wal-shared/`` and each partition's ``data/`` that nothing
  references (listed first, then references are read, as vacuum does).

Exit code 1 when corruption was found, 2 when the audit could not complete.

    python -m jobs.spark.audit --report /tmp/audit [--deep] [--master local[*]]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from app.errors import VersionMismatch
from app.settings import S3Settings, Settings, StoreSettings
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from jobs.spark.catalog_checks import (
    CatalogView,
    catalog_finding,
    read_catalog_on_driver,
    topic_partitions,
)
from jobs.spark.findings import (
    CORRUPTION,
    ERROR,
    FINDING_COLUMNS,
    INFO,
    WARNING,
    Finding,
    ObjectUse,
)
from jobs.spark.index_analysis import Analysis, analyse
from jobs.spark.object_checks import Checked, ObjectChecker
from jobs.spark.report import EXIT_FAILED, EXIT_FINDINGS, EXIT_OK, JobOutcome, Report, job_header
from jobs.spark.runner import (
    base_parser,
    entry_point,
    finish,
    parse_duration_ms,
    run_as_main,
)
from jobs.spark.scan import (
    SnapshotHandler,
    Tagged,
    add_scan_arguments,
    list_then_discover,
    scan_partitions,
)
from jobs.spark.session import default_tasks, describe
from jobs.spark.snapshot import REFERENCE_COLUMNS, IndexRow, PartitionSnapshot, reference_rows
from jobs.spark.stores import Stores

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOB = "audit"
PARTITION_COLUMNS = (
    "topic string, partition int, high_watermark long, cursor long, index_entries long, "
    "strays long, pending_start long, pending_end long, pending_materialised boolean, "
    "compaction_state string, stable boolean, objects_checked long, bytes_verified long, "
    "records_verified long, corruption long, warnings long, unreadable long, error string, "
    "log_start long, trimmable long, catalogued boolean"
)
ORPHAN_COLUMNS = (
    "key string, size long, last_modified_ms long, area string, topic string, "
    "partition int, age_ms long, older_than_horizon boolean"
)


@dataclass(frozen=True)
class AuditOptions:
    deep: bool = False
    stale_after_ms: int = 10 * 60_000
    retry_horizon_ms: int | None = None  # None: the writers' Settings.retry_horizon_ms
    delete_strays: bool = False
    tasks: int = 0
    listing_fanout: int = 16
    concurrency: int = 8  # partitions in flight per task
    object_concurrency: int = 16  # S3 requests in flight per task


# -- the Spark task --------------------------------------------------------------------


class AuditHandler(SnapshotHandler):
    def __init__(self, options: AuditOptions, started_ms: int, catalog: Mapping[str, int],
                 stores: Stores) -> None:
        super().__init__(stores)
        self.options = options
        self.started_ms = started_ms
        self.catalog = catalog  # partitions by topic, read by the driver before the scan
        self.checker = ObjectChecker(stores, options.deep, options.object_concurrency)

    async def handle(self, snap: PartitionSnapshot) -> list[Tagged]:
        tp = snap.tp
        analysis = analyse(snap, now_ms(), self.options.stale_after_ms)
        findings = list(analysis.findings)
        results: list[Checked] = [Checked([]) for _ in analysis.uses]

        async def check(i: int, use: ObjectUse) -> None:
            results[i] = await self.checker.check(tp, use)

        async with anyio.create_task_group() as tg:
            for i, use in enumerate(analysis.uses):
                tg.start_soon(check, i, use)
        for r in results:
            findings.extend(r.findings)
        uncatalogued = await self._catalog_finding(snap)
        if uncatalogued is not None:
            findings.append(uncatalogued)
        if self.options.delete_strays:
            findings.extend(await self._delete_strays(tp, analysis.deletable_strays))
        rows: list[Tagged] = [("F", f.row(tp)) for f in findings]
        rows += [("R", r) for r in reference_rows(self.stores.layout, snap)]
        rows.append(("P", _partition_row(snap, analysis, results, findings,
                                         uncatalogued is None)))
        return rows

    async def _catalog_finding(self, snap: PartitionSnapshot) -> Finding | None:
        """Checked against the driver's read of the catalog, and if that does not cover
        the partition, against the topic's record read now (after the snapshot)."""
        known = self.catalog.get(snap.tp.topic, 0)
        if catalog_finding(snap, known) is None:
            return None
        now = await topic_partitions(self.stores.oxia, self.stores.layout, snap.tp.topic)
        return catalog_finding(snap, max(known, now))

    async def _delete_strays(self, tp: TopicPartition, strays: Sequence[IndexRow]
                             ) -> list[Finding]:
        out = []
        for row in strays:
            try:
                await self.stores.oxia.delete(row.key, tp.partition_key,
                                              expected_version=row.version)
            except VersionMismatch:
                continue  # changed since we read it: leave it to the next audit
            out.append(Finding("stray_deleted", INFO,
                               "stray below the compaction cursor deleted (conditional on "
                               "the version read)", row.start, row.end, row.key,
                               row.entry.data_key if row.entry is not None else None))
        return out

    def on_error(self, tp: TopicPartition, exc: BaseException) -> list[Tagged]:
        message = f"{type(exc).__name__}: {exc}"
        return [
            ("F", Finding("audit_error", ERROR, message).row(tp)),
            ("P", (tp.topic, tp.partition, None, None, None, None, None, None, None, None,
                   None, None, None, None, None, None, None, message, None, None, None)),
        ]


def _partition_row(snap: PartitionSnapshot, analysis: Analysis, results: Sequence[Checked],
                   findings: Sequence[Finding], catalogued: bool) -> tuple[Any, ...]:
    """The partition's row of :data:`PARTITION_COLUMNS`."""
    tp, control = snap.tp, snap.control
    pending = control.pending if control is not None else None
    return (
        tp.topic, tp.partition, snap.high_watermark, snap.cursor, len(snap.index),
        len(analysis.strays), pending.start_offset if pending else None,
        pending.end_offset if pending else None, analysis.pending_materialised,
        snap.compaction.state if snap.compaction else None, snap.stable,
        len({u.data_key for u in analysis.uses}), sum(r.bytes_verified for r in results),
        sum(r.records_verified for r in results),
        sum(1 for f in findings if f.severity == CORRUPTION),
        sum(1 for f in findings if f.severity == WARNING), len(snap.unreadable()), None,
        control.log_start if control is not None else None, len(analysis.trimmable),
        catalogued,
    )


# -- the driver ------------------------------------------------------------------------


def _orphans(spark: SparkSession, objects: DataFrame, refs: DataFrame, started: int,
             horizon: int, report: Report) -> DataFrame:
    """``objects LEFT ANTI JOIN references``, with ages, written to ``report/orphans``."""
    from pyspark.sql import functions as F

    describe(spark, "audit: finding orphans")
    orphans = (
        objects.join(refs.select("key").where(F.col("key").isNotNull()).distinct(), "key",
                     "left_anti")
        .withColumn("age_ms", F.lit(started) - F.col("last_modified_ms"))
        .withColumn("older_than_horizon", F.col("age_ms") > F.lit(horizon))
        .select(*[c.split()[0] for c in ORPHAN_COLUMNS.split(", ")])
    )
    return spark.read.parquet(report.write_table(orphans, "orphans"))


def _findings_by(findings: DataFrame) -> tuple[dict[str, int], dict[str, int]]:
    """Finding counts (by kind, by severity)."""
    by_kind: dict[str, int] = {}
    by_severity: dict[str, int] = {CORRUPTION: 0, WARNING: 0, INFO: 0, ERROR: 0}
    for row in findings.groupBy("kind", "severity").count().collect():
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + int(row["count"])
        by_severity[row["severity"]] = by_severity.get(row["severity"], 0) + int(row["count"])
    return dict(sorted(by_kind.items())), by_severity


def _partition_totals(parts: DataFrame) -> dict[str, int]:
    from pyspark.sql import functions as F

    def count_if(condition: Any) -> Any:
        return F.sum(F.when(condition, 1).otherwise(0))

    p = parts.agg(
        F.count("*").alias("partitions"),
        count_if(F.col("corruption") > 0).alias("partitions_with_corruption"),
        count_if(F.col("error").isNotNull()).alias("partitions_failed"),
        count_if(F.col("unreadable") > 0).alias("partitions_unreadable"),
        F.sum("high_watermark").alias("records"),
        F.sum("index_entries").alias("index_entries"),
        F.sum("strays").alias("strays"),
        F.sum("trimmable").alias("trimmable_entries"),
        count_if(F.col("catalogued") == F.lit(False)).alias("partitions_uncatalogued"),
        F.sum("objects_checked").alias("objects_checked"),
        F.sum("bytes_verified").alias("bytes_verified"),
        F.sum("records_verified").alias("records_verified"),
    ).collect()[0]
    return {name: int(p[name] or 0) for name in p.asDict()}


def _orphan_totals(objects: DataFrame, orphans: DataFrame) -> dict[str, int]:
    from pyspark.sql import functions as F

    o = objects.agg(F.count("*").alias("n"), F.sum("size").alias("bytes")).collect()[0]
    orph = orphans.agg(
        F.count("*").alias("n"), F.sum("size").alias("bytes"),
        F.sum(F.when(F.col("older_than_horizon"), 1).otherwise(0)).alias("old"),
        F.max("age_ms").alias("oldest"),
    ).collect()[0]
    return {"objects_listed": int(o["n"] or 0), "objects_bytes": int(o["bytes"] or 0),
            "count": int(orph["n"] or 0), "bytes": int(orph["bytes"] or 0),
            "older_than_horizon": int(orph["old"] or 0),
            "oldest_age_ms": int(orph["oldest"] or 0)}


def _summary(s3: S3Settings, store: StoreSettings, options: AuditOptions, started: int,
             horizon: int, tables: dict[str, DataFrame], objects: DataFrame, orphans: DataFrame,
             catalog: CatalogView) -> dict[str, Any]:
    by_kind, by_severity = _findings_by(tables["findings"])
    totals = _partition_totals(tables["partitions"])
    listed = _orphan_totals(objects, orphans)
    failed, unreadable = totals["partitions_failed"], totals["partitions_unreadable"]
    if failed:
        status, code = "incomplete", EXIT_FAILED
    elif by_severity.get(CORRUPTION, 0):
        status, code = "corruption", EXIT_FINDINGS
    else:
        status, code = "ok", EXIT_OK
    return {
        **job_header(JOB, status, code, started, now_ms(), s3, store, options),
        **totals,
        "findings_by_kind": by_kind,
        "findings_by_severity": by_severity,
        "catalog": {"topics": len(catalog.partitions),
                    "partitions": sum(catalog.partitions.values()),
                    "bad_records": len(catalog.bad)},
        "objects_listed": listed.pop("objects_listed"),
        "objects_bytes": listed.pop("objects_bytes"),
        # an unreadable record may name objects listed here as orphans
        "orphans": {**listed, "retry_horizon_ms": horizon,
                    "complete": failed == 0 and unreadable == 0},
    }


def run_audit(spark: SparkSession, settings: Settings, options: AuditOptions,
              report: Report) -> JobOutcome:
    started = now_ms()
    tasks = default_tasks(spark, options.tasks)
    objects, partitions = list_then_discover(spark, settings, JOB, options.listing_fanout,
                                             tasks, report)
    catalog = read_catalog_on_driver(settings, JOB)  # before any partition is scanned
    describe(spark, f"audit: checking {len(partitions)} partitions"
             f"{' (deep)' if options.deep else ''}")
    tables = scan_partitions(
        spark, settings, JOB, partitions, tasks, options.concurrency,
        functools.partial(AuditHandler, options, started, catalog.partitions),
        {"F": ("findings", FINDING_COLUMNS), "P": ("partitions", PARTITION_COLUMNS),
         "R": ("references", REFERENCE_COLUMNS)}, report, extra={"F": catalog.bad})
    horizon = options.retry_horizon_ms or settings.retry_horizon_ms
    orphans = _orphans(spark, objects, tables["references"], started, horizon, report)
    summary = _summary(settings.s3, settings.store, options, started, horizon, tables,
                       objects, orphans, catalog)
    return finish(spark, report, summary, f"{summary['partitions']} partitions, "
                  f"{summary['findings_by_severity'][CORRUPTION]} corruption findings, "
                  f"{summary['strays']} strays, {summary['orphans']['count']} orphans")


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(JOB, "Check every topic-partition's index, objects and orphans.")
    add_scan_arguments(parser)
    parser.add_argument("--deep", action="store_true",
                        help="also read and decode every slice and compacted object")
    parser.add_argument("--stale-after", type=parse_duration_ms, default="10m",
                        dest="stale_after_ms",
                        help="age from which unmaterialised pending appends and "
                             "meta/compaction records are reported as stale (default 10m)")
    parser.add_argument("--delete-strays", action="store_true",
                        help="delete strays below the compaction cursor (conditional "
                             "deletes on the version read)")
    return parser


main = entry_point(JOB, build_parser, run_audit, AuditOptions)


if __name__ == "__main__":
    run_as_main("jobs.spark.audit")
