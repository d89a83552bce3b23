"""Spark jobs benchmark: backfill, audit (plain and deep) and export throughput.

Generates a Parquet input of ``--records`` records of ``--record-bytes`` bytes spread
over ``--partitions`` partitions, backfills it into a fresh root prefix, then audits
the resulting store (index and HEADs only, then ``--deep``: every slice fetched,
CRC-checked and decoded) and exports it back to Parquet. Reported per job: wall time,
records/s and MiB/s (record payload bytes; for the deep audit the bytes verified).
Runs against an ephemeral local Oxia + MinIO (default) or an existing stack
(``--stack-json .llog/dev/stack.json``).

    .venv/bin/python bench/spark_bench.py                       # small: 200k x 200 B
    .venv/bin/python bench/spark_bench.py --records 10000000 --record-bytes 400 \\
        --partitions 64 --master 'local[*]' --conf spark.driver.memory=6g   # ~4 GiB

Results go to stdout and .llog/bench/spark-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def generate(path: Path, records: int, record_bytes: int, partitions: int, topic: str,
             rows_per_file: int = 1_000_000) -> int:
    """Parquet files with topic, partition, value (binary); returns the payload bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    filler = b"x" * max(0, record_bytes - 16)
    total = 0
    batch = 100_000
    for f, first in enumerate(range(0, records, rows_per_file)):
        last = min(records, first + rows_per_file)
        with pq.ParquetWriter(path / f"part-{f:05d}.parquet", pa.schema([
                ("topic", pa.string()), ("partition", pa.int32()), ("value", pa.binary())]),
                compression="snappy") as writer:
            for start in range(first, last, batch):
                end = min(last, start + batch)
                values = [b"%016d" % i + filler for i in range(start, end)]
                total += sum(len(v) for v in values)
                writer.write_table(pa.table({
                    "topic": pa.array([topic] * (end - start), pa.string()),
                    "partition": pa.array([i % partitions for i in range(start, end)],
                                          pa.int32()),
                    "value": pa.array(values, pa.binary()),
                }))
    return total


def rate(count: float, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--chunk-records", type=int, default=5000)
    parser.add_argument("--blob-bytes", type=int, default=16 * MiB)
    parser.add_argument("--tasks", type=int, default=0)
    parser.add_argument("--stack-json", type=Path, default=None,
                        help="use this running stack instead of starting one")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where input, reports and export go (default: a temp dir)")
    parser.add_argument("--skip-export", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    from app.localstack.stack import LocalStack, StackConfig
    from jobs.spark.audit import AuditOptions, run_audit
    from jobs.spark.backfill import BackfillOptions, run_backfill
    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.job_settings import load_settings
    from jobs.spark.report import Report
    from jobs.spark.session import build_spark, parse_conf

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="llog-spark-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    root = f"bench-{uuid.uuid4().hex[:8]}"
    topic = "bench"
    stack: LocalStack | None = None
    if args.stack_json is None:
        stack = LocalStack(StackConfig.ephemeral(work / "stack"))
        stack.start()
        os.environ.update(stack.settings_env())
    try:
        settings = load_settings(args.stack_json, root)
        t = time.monotonic()
        payload = generate(work / "input", args.records, args.record_bytes, args.partitions,
                           topic)
        print(f"input: {args.records} records, {payload / MiB:.1f} MiB payload "
              f"({time.monotonic() - t:.1f} s to generate)", flush=True)
        conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                **parse_conf(args.conf)}
        spark = build_spark("llog-spark-bench", args.master, conf)
        results: dict[str, Any] = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "spark": spark.version, "master": args.master},
            "input": {"records": args.records, "record_bytes": args.record_bytes,
                      "partitions": args.partitions, "payload_mib": round(payload / MiB, 1)},
        }

        # Warm-up (not timed): JVM, Python workers and their imports.
        run_audit(spark, load_settings(args.stack_json, root + "-warmup"), AuditOptions(),
                  Report(work / "report-warmup"))

        def timed(name: str, fn: Any) -> Any:
            t0 = time.monotonic()
            outcome = fn()
            seconds = time.monotonic() - t0
            assert outcome.exit_code == 0, (name, outcome.summary)
            results[name] = {"seconds": round(seconds, 2)}
            return outcome, seconds

        bf, s = timed("backfill", lambda: run_backfill(spark, settings, BackfillOptions(
            inputs=(str(work / "input"),), input_format="parquet", topic_column="topic",
            partition_column="partition",
            chunk_records=args.chunk_records, blob_bytes=args.blob_bytes, tasks=args.tasks,
        ), Report(work / "report-backfill")))
        results["backfill"].update(
            records_per_s=rate(args.records, s), mib_per_s=rate(payload / MiB, s),
            append_phase_records_per_s=bf.summary["records_per_s"],
            append_phase_mib_per_s=bf.summary["mib_per_s"])

        _, s = timed("audit", lambda: run_audit(spark, settings, AuditOptions(
            tasks=args.tasks), Report(work / "report-audit")))
        results["audit"].update(records_per_s=rate(args.records, s),
                                mib_per_s=rate(payload / MiB, s))
        deep, s = timed("audit_deep", lambda: run_audit(spark, settings, AuditOptions(
            deep=True, tasks=args.tasks), Report(work / "report-audit-deep")))
        verified = deep.summary["bytes_verified"]
        results["audit_deep"].update(records_per_s=rate(deep.summary["records_verified"], s),
                                     mib_per_s=rate(verified / MiB, s),
                                     mib_verified=round(verified / MiB, 1))
        if not args.skip_export:
            _, s = timed("export", lambda: run_export(spark, settings, ExportOptions(
                output=str(work / "export"), mode="overwrite", tasks=args.tasks),
                Report(work / "report-export")))
            results["export"].update(records_per_s=rate(args.records, s),
                                     mib_per_s=rate(payload / MiB, s))
        spark.stop()
    finally:
        if stack is not None:
            stack.stop()
    print(json.dumps(results, indent=2))
    out = Path(".llog/bench")
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"spark-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    target.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {target}")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
