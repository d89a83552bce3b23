"""Log-engine benchmark: ``append_shared`` throughput without HTTP, on real Oxia + MinIO.

For 1 and 16 partitions per append and 100 B and 1 KiB records, several concurrent
appenders call ``append_shared`` in a loop for a fixed time. Reported: appends/s
(``append_shared`` calls), partition commits/s, records/s, MiB/s, and the Oxia round
trips and S3 requests per append, from the engine's own counters. Baselines measured in
the same run on the same servers: bare S3 PUTs of a blob of the same size, and bare Oxia
CAS puts, i.e. the cost floor of one append's two storage steps.

    .venv/bin/python bench/engine_bench.py [--duration 10] [--appenders 8] [--quick]
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

from app.errors import VersionMismatch
from app.localstack.stack import LocalStack, StackConfig
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store

MiB = 1024 * 1024


@dataclass
class Row:
    name: str
    partitions: int
    record_bytes: int
    records_per_partition: int
    appenders: int
    seconds: float
    appends_per_s: float
    commits_per_s: float
    records_per_s: float
    mib_per_s: float
    oxia_ops_per_append: float
    oxia_ops_per_commit: float
    s3_requests_per_append: float
    p50_ms: float
    p99_ms: float


def _counter(metrics: StoreMetrics, name: str) -> float:
    total = 0.0
    for metric in metrics.registry.collect():
        if metric.name == name:
            total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def run_engine(settings: Settings, partitions: int, record_bytes: int,
                     per_partition: int, appenders: int, duration: float) -> Row:
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    record = b"x" * record_bytes
    latencies: list[float] = []
    appends = 0
    async with (
        OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as ox,
        S3Store(settings.s3, metrics) as s3,
        LogWriter(ox, s3, layout, metrics) as writer,
    ):
        for tp in tps:  # initialisation is a one-off, not part of the steady state
            await writer.ensure_partition(tp)
        groups = [AppendGroup(tp, [record] * per_partition) for tp in tps]
        oxia_before = _counter(metrics, "llog_oxia_requests")  # round trips
        s3_before = _counter(metrics, "llog_s3_requests")
        started = time.monotonic()
        deadline = started + duration

        async def appender() -> None:
            nonlocal appends
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                results = await writer.append_shared(groups)
                latencies.append(time.monotonic() - t0)
                bad = [r for r in results if not isinstance(r, AppendResult)]
                if bad:
                    raise RuntimeError(f"append failed: {bad[0]!r}")
                appends += 1

        async with anyio.create_task_group() as tg:
            for _ in range(appenders):
                tg.start_soon(appender)
        elapsed = time.monotonic() - started
    # Leaving the writer waited for background index materialisation: count it too.
    oxia_ops = _counter(metrics, "llog_oxia_requests") - oxia_before
    s3_ops = _counter(metrics, "llog_s3_requests") - s3_before
    commits = appends * partitions
    records = commits * per_partition
    return Row(
        name="engine", partitions=partitions, record_bytes=record_bytes,
        records_per_partition=per_partition, appenders=appenders, seconds=elapsed,
        appends_per_s=appends / elapsed, commits_per_s=commits / elapsed,
        records_per_s=records / elapsed, mib_per_s=records * record_bytes / elapsed / MiB,
        oxia_ops_per_append=oxia_ops / max(appends, 1),
        oxia_ops_per_commit=oxia_ops / max(commits, 1),
        s3_requests_per_append=s3_ops / max(appends, 1),
        p50_ms=_pct(latencies, 0.5), p99_ms=_pct(latencies, 0.99),
    )


async def baseline_s3(settings: Settings, blob_bytes: int, concurrency: int,
                      duration: float) -> dict[str, float]:
    metrics = StoreMetrics()
    blob = os.urandom(blob_bytes)
    count = 0
    async with S3Store(settings.s3, metrics) as s3:
        deadline = time.monotonic() + duration

        async def put_loop() -> None:
            nonlocal count
            while time.monotonic() < deadline:
                await s3.put(f"{settings.root_prefix}/bench-baseline/{uuid.uuid4().hex}", blob)
                count += 1

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(put_loop)
        elapsed = time.monotonic() - started
    return {"puts_per_s": count / elapsed, "mib_per_s": count * blob_bytes / elapsed / MiB}


async def baseline_oxia_cas(settings: Settings, keys: int, concurrency: int,
                            duration: float) -> dict[str, float]:
    """CAS puts on ``keys`` control-sized records, the writer's commit step alone."""
    metrics = StoreMetrics()
    count = 0
    value = b'{"log_state":"OPEN","sequence_counter":1,"pending":{"append_id":"x"}}' * 3
    async with OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as ox:
        prefix = f"{settings.root_prefix}/bench-cas-{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + duration

        async def cas_loop(worker: int) -> None:
            nonlocal count
            key = f"{prefix}/{worker % keys}"
            pk = f"cas:{worker % keys}"
            version = None
            while time.monotonic() < deadline:
                try:
                    version = await ox.put(key, value, pk, expected_version=version)
                    count += 1
                except VersionMismatch:
                    record = await ox.get(key, pk)
                    version = record.version_id if record else None

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for w in range(concurrency):
                tg.start_soon(cas_loop, w)
        elapsed = time.monotonic() - started
    return {"cas_per_s": count / elapsed}


def _machine() -> dict[str, Any]:
    return {"nproc": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario")
    parser.add_argument("--appenders", type=int, default=8, help="concurrent appenders")
    parser.add_argument("--quick", action="store_true", help="2 s scenarios (smoke run)")
    args = parser.parse_args()
    duration = 2.0 if args.quick else args.duration

    scenarios = [  # (partitions, record bytes, records per partition per append)
        (1, 100, 100), (1, 1024, 100), (16, 100, 100), (16, 1024, 100),
    ]
    with tempfile.TemporaryDirectory(prefix="llog-bench-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            env = stack.settings_env()
            settings = Settings(**{k[5:].lower(): v for k, v in env.items()},
                                broker_id="bench")

            async def run_all() -> dict[str, Any]:
                rows = [await run_engine(settings, p, size, n, args.appenders, duration)
                        for p, size, n in scenarios]
                base = {
                    "s3_put_16k": await baseline_s3(settings, 16 * 1024, args.appenders,
                                                    duration),
                    "s3_put_1m": await baseline_s3(settings, 1 * MiB, args.appenders, duration),
                    "oxia_cas_1key": await baseline_oxia_cas(settings, 1, 1, duration),
                    "oxia_cas_16keys": await baseline_oxia_cas(settings, 16, 16, duration),
                }
                return {"rows": [asdict(r) for r in rows], "baselines": base}

            results = anyio.run(run_all)
        finally:
            stack.stop()

    results["settings"] = {"duration_s": duration, "appenders": args.appenders,
                           "oxia_max_threads": 32}
    results["machine"] = _machine()
    print(f"engine benchmark: {duration:.0f} s per scenario, {args.appenders} concurrent "
          f"appenders, 100 records per partition per append; machine {results['machine']}")
    header = (f"{'partitions':>10} {'record':>7} {'appends/s':>10} {'commits/s':>10} "
              f"{'records/s':>11} {'MiB/s':>7} {'oxia/commit':>11} {'s3/append':>9} "
              f"{'p50 ms':>7} {'p99 ms':>7}")
    print(header)
    for r in results["rows"]:
        print(f"{r['partitions']:>10} {r['record_bytes']:>6}B {r['appends_per_s']:>10.1f} "
              f"{r['commits_per_s']:>10.1f} {r['records_per_s']:>11.0f} {r['mib_per_s']:>7.2f} "
              f"{r['oxia_ops_per_commit']:>11.2f} {r['s3_requests_per_append']:>9.2f} "
              f"{r['p50_ms']:>7.1f} {r['p99_ms']:>7.1f}")
    b = results["baselines"]
    print(f"baseline S3 PUT 16 KiB: {b['s3_put_16k']['puts_per_s']:.0f} PUT/s; "
          f"1 MiB: {b['s3_put_1m']['puts_per_s']:.0f} PUT/s "
          f"({b['s3_put_1m']['mib_per_s']:.1f} MiB/s); "
          f"Oxia CAS 1 key serial: {b['oxia_cas_1key']['cas_per_s']:.0f}/s, "
          f"16 keys x16: {b['oxia_cas_16keys']['cas_per_s']:.0f}/s")
    out = Path(".llog/bench")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"engine-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
