"""The storage ceiling: what the object store and Oxia accept with no broker in the way.

A broker's produce path ends in one S3 PUT per flush and one Oxia write per partition
of it. This measures both through the broker's own facades (app/stores/s3/store.py and
app/stores/oxia/store.py, the same settings) on the stack the broker uses, in the same
run as the broker:

- S3 PUT: objects of a flush's typical sizes, ``concurrency`` at a time (the broker's
  flushes in flight), MiB/s and PUTs/s;
- Oxia: one-record writes through the put coalescer, ``concurrency`` at a time, on as
  many partitions, writes/s and their latency.

Run alone (``.venv/bin/python bench/storage_ceiling.py``) it starts its own Oxia and
MinIO; ``bench/perf.py --sections storage`` runs it beside the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.stores.metrics import StoreMetrics  # noqa: E402
from app.stores.oxia.store import OxiaStore, PutSpec  # noqa: E402
from app.stores.s3.store import S3Store  # noqa: E402

MiB = 1024 * 1024
OBJECT_SIZES = (512 * 1024, 2 * MiB, 4 * MiB)


def _settings(stack: LocalStack) -> Settings:
    return Settings.from_env(**{k.removeprefix("LLOG_").lower(): v
                                for k, v in stack.settings_env().items()})


async def _timed(n: int, concurrency: int, one: Any) -> tuple[float, list[float]]:
    """Run ``one(i)`` n times, ``concurrency`` at a time: wall seconds and latencies."""
    latencies: list[float] = []
    queue = iter(range(n))

    async def worker() -> None:
        for i in queue:
            started = time.perf_counter()
            await one(i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


def _row(kind: str, size: int, concurrency: int, wall: float, latencies: list[float]
         ) -> dict[str, Any]:
    n = len(latencies)
    ordered = sorted(latencies)
    return {"section": "storage", "kind": kind, "bytes": size, "concurrency": concurrency,
            "ops_per_s": n / wall, "mib_per_s": n * size / wall / MiB,
            "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(n - 1, int(n * 0.99))]}


async def measure_storage(stack: LocalStack, seconds: float, concurrency: int = 4
                          ) -> list[dict[str, Any]]:
    settings = _settings(stack)
    rows = []
    async with S3Store(settings, StoreMetrics()) as s3:
        for size in OBJECT_SIZES:
            body = os.urandom(size)
            prefix = f"bench/{uuid.uuid4().hex}"
            # Enough PUTs for ``seconds`` at the rate a short probe shows.
            probe, _ = await _timed(concurrency, concurrency,
                                    lambda i, p=prefix, b=body: s3.put(f"{p}/probe{i}", b))
            n = max(concurrency, int(seconds / probe * concurrency))
            wall, lat = await _timed(n, concurrency,
                                     lambda i, p=prefix, b=body: s3.put(f"{p}/{i}", b))
            rows.append(_row("s3 put", size, concurrency, wall, lat))
    async with OxiaStore(settings, StoreMetrics(), identity="bench") as oxia:
        prefix = f"/bench/{uuid.uuid4().hex}"
        writers = 16

        async def put(i: int) -> None:
            key = f"{prefix}/{i % writers}"
            await oxia.put_group([PutSpec(key, b"x" * 200, key, None)])

        probe, _ = await _timed(writers * 4, writers, put)
        n = max(writers, int(seconds / probe * writers * 4))
        wall, lat = await _timed(n, writers, put)
        rows.append(_row("oxia write", 200, writers, wall, lat))
    return rows


def print_storage(rows: list[dict[str, Any]]) -> None:
    print("\nstorage ceiling (the broker's own S3 and Oxia clients, nothing else running)")
    for r in rows:
        size = f"{r['bytes'] / MiB:.1f} MiB" if r["bytes"] >= MiB else f"{r['bytes']} B"
        if r["bytes"] >= 1024 and r["bytes"] < MiB:
            size = f"{r['bytes'] // 1024} KiB"
        print(f"  {r['kind']:>10} {size:>9} x{r['concurrency']:<3} {r['ops_per_s']:8,.0f} "
              f"ops/s {r['mib_per_s']:7.1f} MiB/s  p50 {r['p50_ms']:6.1f} ms  p99 "
              f"{r['p99_ms']:6.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per row")
    parser.add_argument("--concurrency", type=int, default=4, help="PUTs at a time")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llog-storage-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            rows = asyncio.run(measure_storage(stack, args.duration, args.concurrency))
        finally:
            stack.stop()
    print_storage(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
