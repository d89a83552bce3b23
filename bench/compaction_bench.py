"""Compaction benchmark on real Oxia + MinIO (a script, not a test).

Fills ``--partitions`` partitions with ``--appends`` small appends each (every
``append_shared`` call carries one group per partition, as the broker's batcher does),
then measures:

- catch-up read throughput of one partition before compaction: ``LogReader.read`` in a
  loop from offset 1 to the high watermark, ``--fetch-bytes`` per read, as a consumer
  that starts from the beginning does;
- compaction throughput: ``compact_once`` on every partition (one task per partition)
  until nothing is left, in MiB/s of compacted blob bytes written and records/s;
- the same catch-up read after compaction.

    .venv/bin/python bench/compaction_bench.py [--partitions 4] [--appends 1000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from app.compaction.compactor import CompactionConfig, Compactor
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.reader import LogReader
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store

MiB = 1024 * 1024


@dataclass
class ReadFigures:
    records: int
    payload_mib: float
    seconds: float
    reads: int
    records_per_s: float
    mib_per_s: float
    s3_gets: float
    oxia_requests: float


@dataclass
class CompactionFigures:
    runs: int
    entries_replaced: int
    records: int
    blob_mib: float
    seconds: float
    mib_per_s: float
    records_per_s: float
    entries_per_s: float
    s3_gets: float
    s3_puts: float


def _counter(metrics: StoreMetrics, name: str, **labels: str) -> float:
    total = 0.0
    for metric in metrics.registry.collect():
        if metric.name != name:
            continue
        for sample in metric.samples:
            if sample.name.endswith("_total") and all(
                sample.labels.get(k) == v for k, v in labels.items()
            ):
                total += sample.value
    return total


def _s3(metrics: StoreMetrics, op: str) -> float:
    return _counter(metrics, "llog_s3_requests", op=op)


async def fill(writer: LogWriter, tps: list[TopicPartition], appends: int, records: int,
               record_bytes: int, appenders: int) -> float:
    record = b"x" * record_bytes
    remaining = appends
    started = time.monotonic()

    async def appender() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            results = await writer.append_shared(
                [AppendGroup(tp, [record] * records) for tp in tps])
            assert all(isinstance(r, AppendResult) for r in results), results

    async with anyio.create_task_group() as tg:
        for _ in range(appenders):
            tg.start_soon(appender)
    return time.monotonic() - started


async def catch_up(reader: LogReader, metrics: StoreMetrics, tp: TopicPartition,
                   fetch_bytes: int) -> ReadFigures:
    gets0 = _s3(metrics, "get") + _s3(metrics, "range_get")
    oxia0 = _counter(metrics, "llog_oxia_requests")
    offset, count, size, reads = 1, 0, 0, 0
    started = time.monotonic()
    while True:
        result = await reader.read(tp, offset, max_bytes=fetch_bytes)
        reads += 1
        count += len(result.records)
        size += result.size
        offset = result.next_offset
        if offset > result.high_watermark:
            break
    seconds = time.monotonic() - started
    return ReadFigures(count, size / MiB, seconds, reads, count / seconds,
                       size / MiB / seconds,
                       _s3(metrics, "get") + _s3(metrics, "range_get") - gets0,
                       _counter(metrics, "llog_oxia_requests") - oxia0)


async def compact_all(compactor: Compactor, metrics: StoreMetrics,
                      tps: list[TopicPartition]) -> CompactionFigures:
    gets0 = _s3(metrics, "get") + _s3(metrics, "range_get")
    puts0 = _s3(metrics, "put")
    runs = entries = records = blob = 0
    started = time.monotonic()

    async def one(tp: TopicPartition) -> None:
        nonlocal runs, entries, records, blob
        while True:
            outcome = await compactor.compact_once(tp)
            if not outcome.did_work:
                return
            runs += 1
            entries += outcome.entries
            records += outcome.records
            blob += outcome.bytes

    async with anyio.create_task_group() as tg:
        for tp in tps:
            tg.start_soon(one, tp)
    seconds = time.monotonic() - started
    return CompactionFigures(runs, entries, records, blob / MiB, seconds, blob / MiB / seconds,
                             records / seconds, entries / seconds,
                             _s3(metrics, "get") + _s3(metrics, "range_get") - gets0,
                             _s3(metrics, "put") - puts0)


async def run_bench(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    topic = f"cbench-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(args.partitions)]
    config = CompactionConfig(max_bytes=settings.compaction_max_bytes,
                              max_entries=settings.compaction_max_entries,
                              min_entries=2, min_entry_age_ms=0)
    async with (OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as oxia,
                S3Store(settings.s3, metrics) as s3):
        writer = LogWriter(oxia, s3, layout, metrics)
        fill_s = await fill(writer, tps, args.appends, args.records, args.record_bytes,
                            args.appenders)
        reader = LogReader(oxia, s3, layout)
        before = await catch_up(reader, metrics, tps[0], args.fetch_bytes)
        compaction = await compact_all(Compactor(oxia, s3, layout, config), metrics, tps)
        after = await catch_up(reader, metrics, tps[0], args.fetch_bytes)
    assert before.records == after.records == args.appends * args.records
    return {"fill_seconds": fill_s, "read_before": asdict(before),
            "compaction": asdict(compaction), "read_after": asdict(after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--appends", type=int, default=1000, help="appends per partition")
    parser.add_argument("--records", type=int, default=10, help="records per append")
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--appenders", type=int, default=8, help="concurrent fill appenders")
    parser.add_argument("--fetch-bytes", type=int, default=256 * 1024,
                        help="max_bytes per catch-up read")
    parser.add_argument("--max-entries", type=int, default=1000,
                        help="LLOG_COMPACTION_MAX_ENTRIES")
    parser.add_argument("--quick", action="store_true", help="200 appends (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.appends = 200

    with tempfile.TemporaryDirectory(prefix="llog-cbench-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            values: dict[str, Any] = {k[5:].lower(): v for k, v in stack.settings_env().items()}
            settings = Settings(**values, broker_id="cbench", compaction_min_entry_age_ms=0,
                                compaction_max_entries=args.max_entries)
            results = anyio.run(run_bench, settings, args)
        finally:
            stack.stop()

    results["settings"] = {
        "partitions": args.partitions, "appends_per_partition": args.appends,
        "records_per_append": args.records, "record_bytes": args.record_bytes,
        "fetch_bytes": args.fetch_bytes, "compaction_max_entries": args.max_entries,
        "compaction_max_bytes": settings.compaction_max_bytes,
    }
    results["machine"] = {"nproc": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()}
    s, b, c, a = results["settings"], results["read_before"], results["compaction"], \
        results["read_after"]
    print(f"compaction benchmark: {s['partitions']} partitions x {s['appends_per_partition']} "
          f"appends x {s['records_per_append']} records x {s['record_bytes']} B "
          f"(filled in {results['fill_seconds']:.1f} s); "
          f"max_entries {s['compaction_max_entries']}, "
          f"fetch {s['fetch_bytes'] // 1024} KiB; machine {results['machine']}")
    print(f"compaction: {c['runs']} runs replaced {c['entries_replaced']} WAL entries, "
          f"{c['records']} records, {c['blob_mib']:.2f} MiB in {c['seconds']:.2f} s = "
          f"{c['mib_per_s']:.2f} MiB/s, {c['records_per_s']:.0f} records/s, "
          f"{c['entries_per_s']:.0f} entries/s ({c['s3_gets']:.0f} S3 GETs, "
          f"{c['s3_puts']:.0f} PUTs)")
    for name, r in (("before", b), ("after", a)):
        print(f"catch-up read {name:>6} compaction: {r['records']} records "
              f"({r['payload_mib']:.2f} MiB payload) in {r['seconds']:.2f} s = "
              f"{r['records_per_s']:.0f} records/s, {r['mib_per_s']:.2f} MiB/s; "
              f"{r['reads']} reads, {r['s3_gets']:.0f} S3 GETs, "
              f"{r['oxia_requests']:.0f} Oxia requests")
    out = Path(".llog/bench")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"compaction-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
