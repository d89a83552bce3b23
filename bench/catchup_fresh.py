"""Catch-up of fresh (not compacted) data against compacted data, one client (a script).

Starts real Oxia and MinIO, a writer broker (role write) and reader brokers (roles
write,read, no compaction): this tree's, and with ``--before REV`` one running the code
of that git revision (a worktree of it, bench/baseline.py), to compare in the same
run. The writer fills a
4-partition topic with binary produce (4 partitions x 25 x 1 KiB records per request,
``--connections`` at once) until ``--mib`` MiB; then one client reads it back from
offset 1 through each reader in turn, all four partitions in every request, binary
answers, ``--fetch-bytes`` each: fresh, immediately after the fill; then compacted
(``llog compact-once`` until nothing is left, every partition) and read again.

Each read starts from a cold object cache (a reader restarts before each row), and the
two readers alternate order from one round to the next, so the rows of one run compare.
Prints MiB/s, requests, S3 GETs and Oxia gets per MiB read (the reader's
``llog_s3_requests`` and ``llog_oxia_requests``) and the reader's CPU per MiB.

    .venv/bin/python bench/catchup_fresh.py [--mib 128] [--rounds 2]

``fresh_vs_compacted(stack, logs, ...)`` runs the same on a stack someone else started
(bench/perf.py can import it). It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import baseline  # noqa: E402
import http_bench as hb  # noqa: E402

from app.localstack.broker import broker_process, wait_healthy  # noqa: E402
from app.localstack.processes import ManagedProcess, free_port  # noqa: E402
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

MiB = 1024 * 1024
PARTITIONS = 4
RECORD_BYTES = 1024
BINARY = "application/vnd.llog.records"

_HEAD = struct.Struct(">4sI")
_TOPIC = struct.Struct(">H")
_PARTITION_OK = struct.Struct(">IB")
_OK = struct.Struct(">qqqqBI")
_U32 = struct.Struct(">I")


class Broker:
    """A broker of this tree, or of the code under ``tree``; started for each row, so
    every read begins with a cold object cache."""

    def __init__(self, stack: LocalStack, logs: Path, name: str, tree: Path | None = None,
                 **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**stack.settings_env(), "LLOG_BROKER_ID": f"fresh-{name}",
               "LLOG_ROLES": "write,read", "LLOG_DRAIN_S": "0"}
        env.update({f"LLOG_{k.upper()}": v for k, v in settings.items()})
        log = logs / f"broker-{name}.log"
        self.proc: ManagedProcess = (
            broker_process(f"broker-{name}", self.port, env, log) if tree is None else
            ManagedProcess(f"broker-{name}", baseline.serve_command(tree, self.port), log,
                           env=baseline.environment(tree, env), cwd=tree))

    def start(self) -> Broker:
        self.proc.start()
        wait_healthy(self.proc, self.url, timeout=60)
        return self

    def stop(self) -> None:
        self.proc.stop(timeout=20)

    def s3_gets(self) -> float:
        m = hb.get_json(f"{self.url}/metrics")
        return (hb.metric_sum(m, "llog_s3_requests_total", op="get")
                + hb.metric_sum(m, "llog_s3_requests_total", op="range_get"))

    def oxia_gets(self) -> float:
        return hb.metric_sum(hb.get_json(f"{self.url}/metrics"), "llog_oxia_requests_total",
                             op="get")

    def metrics(self) -> dict[str, Any]:
        return hb.get_json(f"{self.url}/metrics")


def _answer(body: bytes) -> list[tuple[int, int, int]]:
    """``(partition, next offset, high watermark)`` of each result of an LLR1 answer
    (records are skipped, not decoded: the client must not be what is measured)."""
    view = memoryview(body)
    magic, count = _HEAD.unpack_from(view, 0)
    if magic != b"LLR1":
        raise RuntimeError("not an LLR1 answer")
    pos, out = _HEAD.size, []
    for _ in range(count):
        (n,) = _TOPIC.unpack_from(view, pos)
        pos += 2 + n
        partition, ok = _PARTITION_OK.unpack_from(view, pos)
        pos += _PARTITION_OK.size
        if not ok:
            (size,) = _U32.unpack_from(view, pos)
            raise RuntimeError(f"partition {partition} failed: "
                               f"{bytes(view[pos + 4:pos + 4 + size]).decode()}")
        hw, _start, nxt, _first, _encoding, size = _OK.unpack_from(view, pos)
        pos += _OK.size + size
        out.append((partition, nxt, hw))
    return out


def catch_up(url: str, topic: str, fetch_bytes: int) -> dict[str, Any]:
    """Read every partition from offset 1 to its high watermark, all of them in each
    request, binary answers; records and seconds."""
    offsets = dict.fromkeys(range(PARTITIONS), 1)
    done: set[int] = set()
    records = requests = answer_bytes = 0
    started = time.monotonic()
    with httpx.Client(timeout=60) as client:
        while len(done) < PARTITIONS:
            body = {"topic_partitions": [
                        {"topic": topic, "partition": p, "fetch_offset": offsets[p]}
                        for p in range(PARTITIONS)],
                    "max_wait_ms": 0, "max_bytes": fetch_bytes}
            resp = client.post(f"{url}/consume", json=body, headers={"Accept": BINARY})
            resp.raise_for_status()
            requests += 1
            answer_bytes += len(resp.content)
            for partition, nxt, hw in _answer(resp.content):
                records += nxt - offsets[partition]
                offsets[partition] = nxt
                if nxt > hw:
                    done.add(partition)
    return {"records": records, "requests": requests, "answer_bytes": answer_bytes,
            "seconds": time.monotonic() - started}


def fill(url: str, topic: str, mib: int, connections: int) -> dict[str, Any]:
    out = hb.run_loadgen(
        ["-mode", "throughput", "-url", url, "-topic", topic, "-format", "binary",
         "-connections", str(connections), "-partitions", str(PARTITIONS),
         "-entries", str(PARTITIONS), "-records", "25", "-size", str(RECORD_BYTES),
         "-duration", "3600s", "-timeout", "30s", "-total-mib", str(mib)], timeout=3600)
    return {"mib": out["bytes_acked"] / MiB, "mib_per_s": out["mib_per_s"]}


def compact_all(stack: LocalStack, topic: str) -> dict[str, Any]:
    """``llog compact-once`` on every partition until nothing is left."""
    env = {**os.environ, **stack.settings_env(), "LLOG_COMPACTION_MIN_ENTRY_AGE_MS": "0",
           "LLOG_COMPACTION_MAX_BYTES": str(256 * MiB)}
    started, passes = time.monotonic(), 0
    for partition in range(PARTITIONS):
        for _ in range(1000):
            done = subprocess.run(
                [sys.executable, "-m", "app.cli", "compact-once", "--topic", topic,
                 "--partition", str(partition)], env=env, cwd=ROOT, check=True,
                capture_output=True, text=True, timeout=600)
            passes += 1
            outcome = json.loads(done.stdout.strip().splitlines()[-1])
            if outcome.get("action") not in ("compacted", "resumed", "advanced_cursor",
                                             "abandoned"):
                break
    return {"passes": passes, "seconds": time.monotonic() - started}


def _row(broker: Broker, topic: str, fetch_bytes: int, variant: str, data: str
         ) -> dict[str, Any]:
    broker.start()
    try:
        before, oxia_before = broker.s3_gets(), broker.oxia_gets()
        cpu0 = hb.cpu_seconds(broker.proc.pid)
        read = catch_up(broker.url, topic, fetch_bytes)
        gets = broker.s3_gets() - before
        oxia_gets = broker.oxia_gets() - oxia_before
        cpu = hb.cpu_seconds(broker.proc.pid) - cpu0
    finally:
        broker.stop()
    mib = read["records"] * RECORD_BYTES / MiB
    return {"variant": variant, "data": data, "mib": mib,
            "mib_per_s": mib / read["seconds"], "requests": read["requests"],
            "s3_gets": gets, "s3_gets_per_mib": gets / mib if mib else None,
            "oxia_gets_per_mib": oxia_gets / mib if mib else None,
            "server_cpu_s_per_mib": cpu / mib if mib else None}


def fresh_vs_compacted(stack: LocalStack, logs: Path, *, mib: int = 128,
                       fetch_bytes: int = 4 * MiB, connections: int = 32, rounds: int = 1,
                       variants: dict[str, Path | None] | None = None
                       ) -> dict[str, Any]:
    """Fill a topic, read it fresh through each variant (a name and the code tree of
    its broker, None: this one), compact it, read it again. ``rounds`` topics, the
    variants' order alternating; one row per read."""
    variants = {"this tree": None} if variants is None else variants
    logs.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    fills: list[dict[str, Any]] = []
    writer = Broker(stack, logs, "writer", roles="write").start()
    readers = {name: Broker(stack, logs, f"reader-{i}", tree)
               for i, (name, tree) in enumerate(variants.items())}
    try:
        topics = [f"fresh-{uuid.uuid4().hex[:8]}" for _ in range(rounds)]
        for topic in topics:
            fills.append(fill(writer.url, topic, mib, connections))
        for data in ("fresh", "compacted"):
            if data == "compacted":
                for topic in topics:
                    fills.append({"compacted": compact_all(stack, topic)})
            for i, topic in enumerate(topics):
                order = list(readers.items())
                if i % 2:
                    order.reverse()
                for name, reader in order:
                    row = _row(reader, topic, fetch_bytes, name, data)
                    rows.append(row)
                    print(_line(row), flush=True)
    finally:
        writer.stop()
        for reader in readers.values():
            reader.stop()
    return {"rows": rows, "fills": fills, "summary": _summary(rows),
            "settings": {"mib": mib, "fetch_bytes": fetch_bytes, "connections": connections,
                         "rounds": rounds}}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        per: dict[str, float] = {}
        for data in ("fresh", "compacted"):
            picked = [r for r in rows if r["variant"] == variant and r["data"] == data]
            if picked:
                mib = sum(r["mib"] for r in picked)
                seconds = sum(r["mib"] / r["mib_per_s"] for r in picked)
                per[f"{data}_mib_per_s"] = mib / seconds
                per[f"{data}_s3_gets_per_mib"] = sum(r["s3_gets"] for r in picked) / mib
        if "fresh_mib_per_s" in per and "compacted_mib_per_s" in per:
            per["fresh_over_compacted"] = per["fresh_mib_per_s"] / per["compacted_mib_per_s"]
        out[variant] = per
    return out


def _line(row: dict[str, Any]) -> str:
    return (f"{row['variant']:<16} {row['data']:<10} {row['mib']:7.1f} MiB "
            f"{row['mib_per_s']:7.1f} MiB/s {row['requests']:5d} requests "
            f"{row['s3_gets_per_mib']:6.2f} GETs/MiB "
            f"{row['oxia_gets_per_mib']:6.2f} Oxia gets/MiB "
            f"{row['server_cpu_s_per_mib'] * 1000:6.1f} ms CPU/MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=128, help="MiB written per topic")
    parser.add_argument("--rounds", type=int, default=1, help="topics (variants alternate)")
    parser.add_argument("--before", metavar="REV",
                        help="also read through a broker running this git revision")
    parser.add_argument("--fetch-bytes", type=int, default=4 * MiB)
    parser.add_argument("--connections", type=int, default=32, help="of the fill")
    args = parser.parse_args()
    hb.build_loadgen()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="llog-fresh-") as tmp:
        variants: dict[str, Path | None] = {"this tree": None}
        if args.before:
            tree, commit = baseline.checkout(args.before)
            variants[f"at {args.before} = {commit}"] = tree
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            results = fresh_vs_compacted(stack, Path(tmp) / "logs", mib=args.mib,
                                         fetch_bytes=args.fetch_bytes,
                                         connections=args.connections, rounds=args.rounds,
                                         variants=variants)
        finally:
            stack.stop()
    results["machine"] = {**hb.machine_info(), "loadavg_end": list(os.getloadavg())}
    out = hb.OUT_DIR / f"catchup-fresh-{started}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print()
    for variant, per in results["summary"].items():
        print(f"{variant:<16} " + "  ".join(
            f"{k} {v:.2f}" for k, v in per.items()))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
