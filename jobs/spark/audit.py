"""audit: check every topic-partition's index against the protocol's invariants.

For every topic-partition (one Spark task handles a slice of them):

- the index entries (strays excluded) and the pending append tile ``1..high watermark``
  with no gap and no overlap; WAL entries inside a compacted range are reported as
  **strays** (warnings), as docs/protocol.md defines them, not as corruption;
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
import bisect
import functools
import json
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from app.errors import CorruptData, ObjectMissing, VersionMismatch
from app.settings import Settings
from app.storage import codec
from app.storage.keys import TopicPartition
from app.storage.s3 import ObjectInfo
from jobs.spark.common import (
    EXIT_FAILED,
    EXIT_FINDINGS,
    EXIT_OK,
    JobOutcome,
    Report,
    Stores,
    base_parser,
    computed_once,
    default_tasks,
    describe,
    discover_on_driver,
    now_ms,
    parse_duration_ms,
    partition_slices,
    run_main,
    settings_payload,
)
from jobs.spark.scan import (
    OBJECT_COLUMNS,
    REFERENCE_COLUMNS,
    IndexRow,
    PartitionSnapshot,
    SnapshotHandler,
    Tagged,
    list_objects_task,
    listing_units,
    object_key,
    reference_rows,
    snapshot_task,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

JOB = "audit"
CORRUPTION = "corruption"
WARNING = "warning"
INFO = "info"
ERROR = "error"  # the audit itself failed for a partition

FINDING_COLUMNS = (
    "topic string, partition int, kind string, severity string, first_offset long, "
    "last_offset long, index_key string, data_key string, age_ms long, size long, "
    "message string"
)
PARTITION_COLUMNS = (
    "topic string, partition int, high_watermark long, cursor long, index_entries long, "
    "strays long, pending_start long, pending_end long, pending_materialised boolean, "
    "compaction_state string, stable boolean, objects_checked long, bytes_verified long, "
    "records_verified long, corruption long, warnings long, unreadable long, error string"
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


@dataclass(frozen=True)
class Finding:
    kind: str
    severity: str
    message: str
    first_offset: int | None = None
    last_offset: int | None = None
    index_key: str | None = None
    data_key: str | None = None
    age_ms: int | None = None
    size: int | None = None

    def row(self, tp: TopicPartition) -> tuple[Any, ...]:
        return (tp.topic, tp.partition, self.kind, self.severity, self.first_offset,
                self.last_offset, self.index_key, self.data_key, self.age_ms, self.size,
                self.message)


@dataclass(frozen=True)
class ObjectUse:
    """One reference to check: the object, and the slice and records it should hold."""

    kind: str  # index | stray | pending | compaction
    data_key: str
    first: int
    last: int
    msg_count: int
    byte_offset: int | None
    byte_length: int | None
    crc32c: int | None
    index_key: str | None


@dataclass
class Analysis:
    findings: list[Finding]
    uses: list[ObjectUse]
    strays: list[IndexRow]
    deletable_strays: list[IndexRow]  # strays below the cursor: can never matter again
    pending_materialised: bool


# -- the index, pure -------------------------------------------------------------------


def analyse(snap: PartitionSnapshot, now: int, stale_after_ms: int) -> Analysis:
    """Coverage, strays, cursor, pending and compaction checks of one snapshot."""
    out: list[Finding] = []
    for kind, message in snap.errors:
        out.append(Finding(kind, CORRUPTION, message))
    hw = snap.high_watermark
    hw_after = snap.high_watermark_after
    if not snap.control_present and snap.index:
        out.append(Finding("missing_control", CORRUPTION,
                           "index entries exist but meta/control does not"))
    if snap.control_present and not snap.cursor_present:
        out.append(Finding("missing_cursor", WARNING,
                           "meta/control exists but meta/compaction-cursor does not"))
    if not snap.stable:
        out.append(Finding("unstable_snapshot", WARNING,
                           f"compaction kept changing the index during {snap.attempts} "
                           "reads; findings may be transient"))

    entries: list[IndexRow] = []
    for row in snap.index:
        if row.end is None:
            out.append(Finding("bad_index_key", CORRUPTION, row.error or "bad key",
                               index_key=row.key))
        elif row.entry is None or row.error is not None:
            out.append(Finding("bad_index_entry", CORRUPTION, row.error or "bad value",
                               last_offset=row.end, index_key=row.key))
        elif row.end > hw_after:
            out.append(Finding("beyond_high_watermark", CORRUPTION,
                               f"entry ends at {row.end}, the high watermark is {hw_after}",
                               row.start, row.end, row.key, row.entry.data_key))
        elif row.end > hw:
            continue  # appended while the index was being scanned
        else:
            entries.append(row)

    # Strays: WAL entries lying entirely inside a compacted entry's range.
    compacted = sorted((r for r in entries if _entry(r).type == "COMPACTED"),
                       key=lambda r: _end(r))
    compacted_ends = [_end(r) for r in compacted]
    live: list[IndexRow] = []
    strays: list[IndexRow] = []
    for row in entries:
        if _entry(row).type == "WAL":
            i = bisect.bisect_left(compacted_ends, _end(row))
            if i < len(compacted) and _start(compacted[i]) <= _start(row):
                strays.append(row)
                continue
        live.append(row)
    deletable = []
    comp = snap.compaction
    for row in strays:
        if _end(row) < snap.cursor:
            reason = "below the compaction cursor"
            deletable.append(row)
        elif comp is not None and comp.state in ("DELETING_OLD", "UPDATING_CURSOR") and (
                comp.start_offset <= _end(row) < comp.end_offset):
            reason = f"left by the compaction in flight ({comp.state})"
        else:
            reason = "inside a compacted range"
        out.append(Finding("stray", WARNING, f"WAL entry is a stray: {reason}",
                           _start(row), _end(row), row.key, _entry(row).data_key))

    # The pending append: materialised already, or part of the tiling.
    spans: list[tuple[int, int, str]] = [(_start(r), _end(r), r.key) for r in live]
    pending = snap.control.pending if snap.control is not None else None
    materialised = False
    if pending is not None:
        age = now - pending.created_at_ms
        if pending.end_offset != hw:
            out.append(Finding("pending_not_at_head", CORRUPTION,
                               f"pending ends at {pending.end_offset}, the high watermark "
                               f"is {hw}", pending.start_offset, pending.end_offset,
                               data_key=pending.data_key, age_ms=age))
        for row in live:
            same_key = _end(row) == pending.end_offset and _start(row) == pending.start_offset
            covering = (_entry(row).type == "COMPACTED" and _start(row) <= pending.start_offset
                        and pending.end_offset <= _end(row))
            if (same_key and (_entry(row).append_id in (None, pending.append_id))) or covering:
                materialised = True
        if not materialised:
            spans.append((pending.start_offset, pending.end_offset, "meta/control pending"))
            if age >= stale_after_ms:
                # Valid (readers serve it from meta/control, the next append or a
                # compaction materialises it), but old: an idle partition, or a writer
                # that died after its commit.
                out.append(Finding(
                    "stale_pending", INFO,
                    f"pending append {pending.append_id} not materialised for "
                    f"{age / 1000:.0f} s", pending.start_offset, pending.end_offset,
                    data_key=pending.data_key, age_ms=age))

    # Tiling of 1..hw.
    spans.sort(key=lambda s: (s[0], -s[1]))
    expected = 1
    for start, end, where in spans:
        if start > expected:
            out.append(Finding("gap", CORRUPTION,
                               f"no entry covers offsets {expected}..{start - 1}",
                               expected, start - 1))
        elif start < expected:
            out.append(Finding("overlap", CORRUPTION,
                               f"{where} covers {start}..{end}, overlapping entries "
                               f"before it up to {expected - 1}",
                               start, min(end, expected - 1), where))
        expected = max(expected, end + 1)
    if expected <= hw:
        out.append(Finding("gap", CORRUPTION, f"no entry covers offsets {expected}..{hw}",
                           expected, hw))

    # Compaction cursor (invariant 4) and the compaction record.
    if snap.cursor > hw + 1:
        out.append(Finding("cursor_beyond_head", CORRUPTION,
                           f"compaction cursor {snap.cursor} is beyond the high watermark {hw}"))
    for row in live:
        if _entry(row).type == "WAL" and _start(row) < snap.cursor:
            out.append(Finding("wal_below_cursor", CORRUPTION,
                               f"WAL entry below the compaction cursor {snap.cursor} and "
                               "not covered by a compacted entry",
                               _start(row), _end(row), row.key, _entry(row).data_key))
    if comp is not None:
        age = now - comp.created_at_ms
        stale = age >= stale_after_ms
        out.append(Finding(
            "stale_compaction" if stale else "compaction_in_flight", WARNING if stale else INFO,
            f"meta/compaction {comp.compaction_id} in state {comp.state} for "
            f"{age / 1000:.0f} s", comp.start_offset, comp.end_offset,
            data_key=comp.data_key, age_ms=age))

    uses = [_use("index", r) for r in live] + [_use("stray", r) for r in strays]
    if pending is not None and not materialised:
        uses.append(ObjectUse("pending", pending.data_key, pending.start_offset,
                              pending.end_offset, pending.msg_count, pending.byte_offset,
                              pending.byte_length, pending.crc32c, None))
    if comp is not None:
        uses.append(ObjectUse("compaction", comp.data_key, comp.start_offset, comp.end_offset,
                              comp.msg_count, None, None, comp.crc32c, None))
    return Analysis(out, uses, strays, deletable, materialised)


def _entry(row: IndexRow) -> Any:
    assert row.entry is not None
    return row.entry


def _end(row: IndexRow) -> int:
    assert row.end is not None
    return row.end


def _start(row: IndexRow) -> int:
    start = row.start
    assert start is not None
    return start


def _use(kind: str, row: IndexRow) -> ObjectUse:
    e = _entry(row)
    return ObjectUse(kind, e.data_key, _start(row), _end(row), e.msg_count, e.byte_offset,
                     e.byte_length, e.crc32c, row.key)


# -- objects ---------------------------------------------------------------------------

_U32 = struct.Struct(">I")


@dataclass
class Checked:
    findings: list[Finding]
    bytes_verified: int = 0
    records_verified: int = 0


class ObjectChecker:
    """HEADs (and with ``deep`` reads) the objects of one task, each HEAD at most once."""

    def __init__(self, stores: Stores, deep: bool, concurrency: int) -> None:
        self.stores = stores
        self.deep = deep
        self._limiter = anyio.CapacityLimiter(max(1, concurrency))
        self._heads: dict[str, ObjectInfo | None] = {}
        self._head_locks: dict[str, anyio.Lock] = {}
        self._headers: dict[str, dict[tuple[str, int, int], dict[str, Any]] | CorruptData] = {}
        self._header_locks: dict[str, anyio.Lock] = {}

    async def head(self, key: str) -> ObjectInfo | None:
        lock = self._head_locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._heads:
                async with self._limiter:
                    self._heads[key] = await self.stores.s3.head(key)
            return self._heads[key]

    async def header(self, key: str, size: int) -> dict[tuple[str, int, int], dict[str, Any]]:
        """The LLS1 header's parts by (topic, partition, body_offset), fetched once."""
        lock = self._header_locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._headers:
                try:
                    self._headers[key] = await self._fetch_header(key, size)
                except CorruptData as exc:
                    self._headers[key] = exc
            cached = self._headers[key]
        if isinstance(cached, CorruptData):
            raise cached
        return cached

    async def _fetch_header(self, key: str, size: int
                            ) -> dict[tuple[str, int, int], dict[str, Any]]:
        if size < 8:
            raise CorruptData("object too small for an LLS1 header")
        async with self._limiter:
            head = await self.stores.s3.get_range(key, 0, 8)
        if head[:4] != codec.MAGIC:
            raise CorruptData("not an LLS1 blob (bad magic)")
        (length,) = _U32.unpack_from(head, 4)
        if length > codec.MAX_HEADER_BYTES or 8 + length > size:
            raise CorruptData(f"LLS1 header length {length} exceeds the blob ({size} bytes)")
        async with self._limiter:
            raw = await self.stores.s3.get_range(key, 8, length)
        try:
            header = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptData(f"LLS1 header is not JSON: {exc!s:.200}") from None
        if not isinstance(header, dict) or header.get("version") != 1 or not isinstance(
                header.get("partitions"), list):
            raise CorruptData("LLS1 header: unknown version or no partitions list")
        parts: dict[tuple[str, int, int], dict[str, Any]] = {}
        for part in header["partitions"]:
            if isinstance(part, dict):
                parts[(str(part.get("topic")), _int(part.get("partition")),
                       _int(part.get("body_offset")))] = part
        return parts

    async def check(self, tp: TopicPartition, use: ObjectUse) -> Checked:
        key = object_key(self.stores.layout, use.data_key)

        def at(kind: str, severity: str, message: str, size: int | None = None) -> Checked:
            return Checked([Finding(kind, severity, message, use.first, use.last,
                                    use.index_key, use.data_key, size=size)])

        if key is None:
            return at("foreign_object", WARNING,
                      f"{use.kind} references an object outside bucket "
                      f"{self.stores.layout.bucket}; not checked")
        info = await self.head(key)
        if info is None:
            if use.kind == "stray":
                return at("stray_object_missing", WARNING, "stray references a missing object")
            return at("missing_object", CORRUPTION, f"{use.kind} references a missing object")
        if use.byte_offset is not None:
            length = use.byte_length or 0
            if use.byte_offset < 8 or use.byte_offset + length > info.size:
                return at("slice_out_of_bounds", CORRUPTION,
                          f"slice [{use.byte_offset}, {use.byte_offset + length}) lies "
                          f"outside the object of {info.size} bytes", info.size)
        elif info.size < 4:
            return at("object_too_small", CORRUPTION,
                      f"object of {info.size} bytes cannot hold a bytes-batch-v1 body",
                      info.size)
        if not self.deep:
            return Checked([])
        try:
            return await self._verify(tp, use, key, info)
        except CorruptData as exc:
            return at("corrupt_data", CORRUPTION, str(exc), info.size)
        except ObjectMissing as exc:
            return at("slice_out_of_bounds", CORRUPTION, str(exc), info.size)

    async def _verify(self, tp: TopicPartition, use: ObjectUse, key: str,
                      info: ObjectInfo) -> Checked:
        found: list[Finding] = []
        crc = use.crc32c
        if use.byte_offset is not None:
            length = use.byte_length or 0
            parts = await self.header(key, info.size)
            part = parts.get((tp.topic, tp.partition, use.byte_offset))
            if part is None or _int(part.get("body_length")) != length or _int(
                    part.get("msg_count")) != use.msg_count or (
                    crc is not None and "crc32c" in part and _int(part.get("crc32c")) != crc):
                found.append(Finding(
                    "header_mismatch", CORRUPTION,
                    f"the LLS1 header has no body of {tp} at {use.byte_offset} with "
                    f"{length} bytes and {use.msg_count} records (header says {part})",
                    use.first, use.last, use.index_key, use.data_key, size=info.size))
            elif crc is None and "crc32c" in part:
                crc = _int(part.get("crc32c"))
            async with self._limiter:
                body = await self.stores.s3.get_range(key, use.byte_offset, length)
        else:
            async with self._limiter:
                body = await self.stores.s3.get(key)
        codec.verify_body(body, crc)
        codec.decode_batch(body, use.msg_count)
        return Checked(found, len(body), use.msg_count)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


# -- the Spark task --------------------------------------------------------------------


class AuditHandler(SnapshotHandler):
    def __init__(self, options: AuditOptions, started_ms: int, stores: Stores) -> None:
        super().__init__(stores)
        self.options = options
        self.started_ms = started_ms
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
        if self.options.delete_strays:
            findings.extend(await self._delete_strays(tp, analysis.deletable_strays))
        rows: list[Tagged] = [("F", f.row(tp)) for f in findings]
        rows += [("R", r) for r in reference_rows(self.stores.layout, snap)]
        pending = snap.control.pending if snap.control is not None else None
        corruption = sum(1 for f in findings if f.severity == CORRUPTION)
        warnings = sum(1 for f in findings if f.severity == WARNING)
        rows.append(("P", (
            tp.topic, tp.partition, snap.high_watermark, snap.cursor, len(snap.index),
            len(analysis.strays), pending.start_offset if pending else None,
            pending.end_offset if pending else None, analysis.pending_materialised,
            snap.compaction.state if snap.compaction else None, snap.stable,
            len({u.data_key for u in analysis.uses}), sum(r.bytes_verified for r in results),
            sum(r.records_verified for r in results), corruption, warnings,
            len(snap.unreadable()), None,
        )))
        return rows

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
                               _entry(row).data_key))
        return out

    def on_error(self, tp: TopicPartition, exc: BaseException) -> list[Tagged]:
        message = f"{type(exc).__name__}: {exc}"
        return [
            ("F", Finding("audit_error", ERROR, message).row(tp)),
            ("P", (tp.topic, tp.partition, None, None, None, None, None, None, None, None,
                   None, None, None, None, None, None, None, message)),
        ]


def make_audit_handler(options: AuditOptions, started_ms: int, stores: Stores) -> AuditHandler:
    return AuditHandler(options, started_ms, stores)


# -- the driver ------------------------------------------------------------------------


def list_objects(spark: SparkSession, settings: Settings, partitions: Sequence[TopicPartition],
                 fanout: int, tasks: int, report: Report, job: str) -> DataFrame:
    """List ``wal-shared/`` and every partition's ``data/`` in Spark tasks, write the
    listing to ``report/objects`` and return it read back (computed exactly once)."""
    from app.storage.keys import KeyLayout

    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    units = listing_units(layout, partitions, fanout)
    describe(spark, f"{job}: listing objects under {len(units)} prefixes")
    body = functools.partial(list_objects_task, settings_payload(settings), job)
    rdd = spark.sparkContext.parallelize(units, partition_slices(len(units), tasks))
    df = spark.createDataFrame(rdd.mapPartitions(body), OBJECT_COLUMNS, verifySchema=False)
    path = report.write_table(df, "objects")
    return spark.read.parquet(path)


def run_audit(spark: SparkSession, settings: Settings, options: AuditOptions,
              report: Report) -> JobOutcome:
    from pyspark.sql import functions as F

    started = now_ms()
    tasks = default_tasks(spark, options.tasks)
    describe(spark, "audit: discovering partitions")
    partitions = discover_on_driver(settings, JOB)
    objects = list_objects(spark, settings, partitions, options.listing_fanout, tasks, report,
                           JOB)
    # Partitions that appeared while listing are audited too.
    partitions = sorted(set(partitions) | set(discover_on_driver(settings, JOB)))
    describe(spark, f"audit: checking {len(partitions)} partitions"
             f"{' (deep)' if options.deep else ''}")
    body = functools.partial(
        snapshot_task, settings_payload(settings), JOB, options.concurrency,
        functools.partial(make_audit_handler, options, started),
    )
    items = [(tp.topic, tp.partition) for tp in partitions]
    tagged = spark.sparkContext.parallelize(
        items, partition_slices(len(items), tasks)).mapPartitions(body)
    computed_once(tagged)  # every table below sees the same reads

    def table(tag: str, columns: str) -> DataFrame:
        rows = tagged.filter(lambda t: t[0] == tag).map(lambda t: t[1])
        return spark.createDataFrame(rows, columns, verifySchema=False)

    findings_path = report.write_table(table("F", FINDING_COLUMNS), "findings")
    partitions_path = report.write_table(table("P", PARTITION_COLUMNS), "partitions")
    references_path = report.write_table(table("R", REFERENCE_COLUMNS), "references")
    tagged.unpersist()
    findings = spark.read.parquet(findings_path)
    parts = spark.read.parquet(partitions_path)
    refs = spark.read.parquet(references_path)

    describe(spark, "audit: finding orphans")
    orphans = (
        objects.join(refs.select("key").where(F.col("key").isNotNull()).distinct(), "key",
                     "left_anti")
        .withColumn("age_ms", F.lit(started) - F.col("last_modified_ms"))
        .withColumn("older_than_horizon", F.col("age_ms") > F.lit(
            options.retry_horizon_ms or settings.retry_horizon_ms))
        .select(*[c.split()[0] for c in ORPHAN_COLUMNS.split(", ")])
    )
    orphans_path = report.write_table(orphans, "orphans")
    orphans = spark.read.parquet(orphans_path)

    by_kind: dict[str, int] = {}
    by_severity: dict[str, int] = {CORRUPTION: 0, WARNING: 0, INFO: 0, ERROR: 0}
    for row in findings.groupBy("kind", "severity").count().collect():
        by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + int(row["count"])
        by_severity[row["severity"]] = by_severity.get(row["severity"], 0) + int(row["count"])
    p = parts.agg(
        F.count("*").alias("partitions"),
        F.sum(F.when(F.col("corruption") > 0, 1).otherwise(0)).alias("with_corruption"),
        F.sum(F.when(F.col("error").isNotNull(), 1).otherwise(0)).alias("failed"),
        F.sum(F.when(F.col("unreadable") > 0, 1).otherwise(0)).alias("unreadable"),
        F.sum("high_watermark").alias("records"),
        F.sum("index_entries").alias("index_entries"),
        F.sum("strays").alias("strays"),
        F.sum("objects_checked").alias("objects_checked"),
        F.sum("bytes_verified").alias("bytes_verified"),
        F.sum("records_verified").alias("records_verified"),
    ).collect()[0]
    o = objects.agg(F.count("*").alias("n"), F.sum("size").alias("bytes")).collect()[0]
    orph = orphans.agg(
        F.count("*").alias("n"), F.sum("size").alias("bytes"),
        F.sum(F.when(F.col("older_than_horizon"), 1).otherwise(0)).alias("old"),
        F.max("age_ms").alias("oldest"),
    ).collect()[0]

    failed = int(p["failed"] or 0)
    unreadable = int(p["unreadable"] or 0)
    corruption = by_severity.get(CORRUPTION, 0)
    if failed:
        status, code = "incomplete", EXIT_FAILED
    elif corruption:
        status, code = "corruption", EXIT_FINDINGS
    else:
        status, code = "ok", EXIT_OK
    finished = now_ms()
    summary: dict[str, Any] = {
        "job": JOB,
        "status": status,
        "exit_code": code,
        "started_ms": started,
        "finished_ms": finished,
        "duration_s": round((finished - started) / 1000, 3),
        "root_prefix": settings.root_prefix,
        "bucket": settings.s3_bucket,
        "options": {k: getattr(options, k) for k in options.__dataclass_fields__},
        "partitions": int(p["partitions"] or 0),
        "partitions_with_corruption": int(p["with_corruption"] or 0),
        "partitions_failed": failed,
        "partitions_unreadable": unreadable,
        "records": int(p["records"] or 0),
        "index_entries": int(p["index_entries"] or 0),
        "strays": int(p["strays"] or 0),
        "objects_checked": int(p["objects_checked"] or 0),
        "bytes_verified": int(p["bytes_verified"] or 0),
        "records_verified": int(p["records_verified"] or 0),
        "findings_by_kind": dict(sorted(by_kind.items())),
        "findings_by_severity": by_severity,
        "objects_listed": int(o["n"] or 0),
        "objects_bytes": int(o["bytes"] or 0),
        "orphans": {
            "count": int(orph["n"] or 0),
            "bytes": int(orph["bytes"] or 0),
            "older_than_horizon": int(orph["old"] or 0),
            "oldest_age_ms": int(orph["oldest"] or 0),
            # an unreadable record may name objects listed here as orphans
            "complete": failed == 0 and unreadable == 0,
        },
    }
    report.write_summary(summary)
    describe(spark, f"audit: {status}: {summary['partitions']} partitions, "
             f"{corruption} corruption findings, {summary['strays']} strays, "
             f"{summary['orphans']['count']} orphans")
    return JobOutcome(summary, code)


def build_parser() -> argparse.ArgumentParser:
    parser = base_parser(JOB, "Check every topic-partition's index, objects and orphans.")
    parser.add_argument("--deep", action="store_true",
                        help="also read and decode every slice and compacted object")
    parser.add_argument("--stale-after", type=parse_duration_ms, default="10m",
                        help="age from which unmaterialised pending appends and "
                             "meta/compaction records are reported as stale (default 10m)")
    parser.add_argument("--retry-horizon", type=parse_duration_ms, default=None,
                        help="orphans older than this are flagged older_than_horizon "
                             "(default: LLOG_RETRY_HORIZON_MS, as vacuum)")
    parser.add_argument("--delete-strays", action="store_true",
                        help="delete strays below the compaction cursor (conditional "
                             "deletes on the version read)")
    parser.add_argument("--listing-fanout", type=int, choices=(1, 16, 256), default=16,
                        help="wal-shared/ is listed as this many hex key ranges")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="partitions audited concurrently within a task")
    return parser


def options_from_args(args: argparse.Namespace) -> AuditOptions:
    return AuditOptions(
        deep=args.deep, stale_after_ms=args.stale_after, retry_horizon_ms=args.retry_horizon,
        delete_strays=args.delete_strays, tasks=args.tasks,
        listing_fanout=args.listing_fanout, concurrency=args.concurrency,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_main(JOB, build_parser(), argv, run_audit, options_from_args)


if __name__ == "__main__":
    from jobs.spark.audit import main as _main  # run the importable module, not __main__

    sys.exit(_main())
