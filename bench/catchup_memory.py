"""Catch-up read of a partition of compacted data: peak memory and throughput (a script).

Writes ``--mib`` MiB of ``--record-bytes`` records into one partition on its own real Oxia
and MinIO, compacts all of it, then runs a consumer in a separate process that reads the
partition from offset 1 to the end, ``--fetch-bytes`` per read (as ``POST /consume``
does), once without the reader's object cache and once with the default cache. For each
it reports:

- the consumer's peak RSS (the kernel's ``VmHWM``) against its RSS when idle with its
  clients open and warmed by one tiny read: the growth is what reading costs, to compare
  with the stated bound (five times ``fetch_bytes``: the ranged GET's body as read and
  as joined, its decoded records, the answer, and allocator slack; plus the object
  cache when enabled);
- its read throughput against the physical limit measured in the same run: ranged GETs
  of the same compacted objects, ``--fetch-bytes`` each, one after another, with no
  decoding.

    .venv/bin/python bench/catchup_memory.py [--mib 1024] [--record-bytes 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import psutil

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
TOPIC = "catchup"


def _settings(stack: LocalStack, **extra: Any) -> Settings:
    env = {k[len("LLOG_"):].lower(): v for k, v in stack.settings_env().items()}
    return Settings(**env, **extra)


async def fill_and_compact(settings: Settings, mib: int, record_bytes: int) -> int:
    """Write ``mib`` MiB in 4 MiB appends, then compact all of it; the record count."""
    tp = TopicPartition(TOPIC, 0)
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    metrics = StoreMetrics()
    per_append = max(1, 4 * MiB // record_bytes)
    records = mib * MiB // record_bytes
    async with (OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as oxia,
                S3Store(settings.s3, metrics) as s3):
        writer = LogWriter(oxia, s3, layout, metrics)
        written, started = 0, time.monotonic()
        while written < records:
            n = min(per_append, records - written)
            batch = [i.to_bytes(8, "big") + b"x" * (record_bytes - 8)
                     for i in range(written, written + n)]
            (result,) = await writer.append_shared([AppendGroup(tp, batch)])
            assert isinstance(result, AppendResult), result
            written += n
        print(f"wrote {mib} MiB ({records} records of {record_bytes} B) in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        compactor = Compactor(oxia, s3, layout, CompactionConfig(min_entry_age_ms=0))
        started = time.monotonic()
        while (await compactor.compact_once(tp)).did_work:
            pass
        print(f"compacted in {time.monotonic() - started:.1f} s", flush=True)
    return records


async def consume_all(settings: Settings, fetch_bytes: int) -> dict[str, Any]:
    """The child: read everything, and the raw ranged-GET limit over the same objects."""
    tp = TopicPartition(TOPIC, 0)
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    metrics = StoreMetrics()
    async with (OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as oxia,
                S3Store(settings.s3, metrics) as s3):
        reader = LogReader(oxia, s3, layout,
                           object_cache_bytes=settings.read_object_cache_bytes)
        hw = await reader.high_watermark(tp)
        # One tiny read first: the clients load their models and pools lazily, a cost
        # paid once per process, not per byte read.
        await LogReader(oxia, s3, layout, object_cache_bytes=0).read(tp, 1, max_bytes=1)
        idle_rss = psutil.Process().memory_info().rss
        offset, payload, started = 1, 0, time.monotonic()
        while offset <= hw:
            result = await reader.read(tp, offset, max_bytes=fetch_bytes)
            payload += result.size
            offset = result.next_offset
        read_s = time.monotonic() - started
        peak_rss = _peak_rss()
        raw_bytes, started = 0, time.monotonic()
        async for obj in s3.list(layout.partition_prefix(tp) + "data/compacted/"):
            for start in range(0, obj.size, fetch_bytes):
                raw_bytes += len(await s3.get_range(obj.key, start,
                                                    min(fetch_bytes, obj.size - start)))
        raw_s = time.monotonic() - started
    return {"records": hw, "payload_mib": payload / MiB, "read_s": read_s,
            "read_mib_s": payload / MiB / read_s, "raw_mib_s": raw_bytes / MiB / raw_s,
            "idle_rss_mib": idle_rss / MiB, "peak_rss_mib": peak_rss / MiB,
            "s3_bytes_in_mib": (metrics.registry.get_sample_value(
                "llog_s3_bytes_total", {"direction": "in"}) or 0) / MiB}


def _peak_rss() -> int:
    """The process's peak RSS since it was exec'd (``VmHWM``). Not ``ru_maxrss``: that
    one survives exec, so it would report the parent's peak at fork time."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def run_child(stack: LocalStack, fetch_bytes: int, cache_bytes: int) -> dict[str, Any]:
    env = {**os.environ, **stack.settings_env(),
           "LLOG_READ_OBJECT_CACHE_BYTES": str(cache_bytes)}
    out = subprocess.run([sys.executable, __file__, "--child", "--fetch-bytes",
                          str(fetch_bytes)], env=env, check=True, capture_output=True,
                         text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="data to write (MiB)")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--fetch-bytes", type=int, default=4 * MiB)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        figures = anyio.run(consume_all, Settings.from_env(), args.fetch_bytes)
        print(json.dumps(figures))
        return
    with tempfile.TemporaryDirectory() as tmp, LocalStack(StackConfig.ephemeral(
            Path(tmp), root_prefix=f"bench-{uuid.uuid4().hex[:8]}")) as stack:
        anyio.run(fill_and_compact, _settings(stack), args.mib, args.record_bytes)
        default_cache = Settings.model_fields["read_object_cache_bytes"].default
        for label, cache in (("no object cache", 0), ("default object cache", default_cache)):
            f = run_child(stack, args.fetch_bytes, cache)
            growth = f["peak_rss_mib"] - f["idle_rss_mib"]
            print(f"\n{label} ({cache / MiB:.0f} MiB), fetch {args.fetch_bytes / MiB:.0f} MiB:")
            print(f"  read {f['payload_mib']:.0f} MiB ({f['records']} records) in "
                  f"{f['read_s']:.1f} s = {f['read_mib_s']:.1f} MiB/s; raw ranged GETs "
                  f"{f['raw_mib_s']:.1f} MiB/s; ratio {f['read_mib_s'] / f['raw_mib_s']:.2f}")
            print(f"  downloaded {f['s3_bytes_in_mib']:.0f} MiB for the read and the limit")
            print(f"  RSS idle {f['idle_rss_mib']:.0f} MiB, peak {f['peak_rss_mib']:.0f} MiB: "
                  f"reading grew it by {growth:.0f} MiB (bound stated: 5 x fetch, plus the "
                  f"cache: {(args.fetch_bytes * 5 + cache) / MiB:.0f} MiB)")


if __name__ == "__main__":
    main()
