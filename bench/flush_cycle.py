"""What sets produce's rate and CPU in `llog dev`'s broker: connections, the flush
cycle's settings, workers, and a revision against another, rows alternating.

One stack (real Oxia and MinIO on free ports) for the run; each row a broker of its own
with `llog dev`'s settings (bench/shipped.py's ``dev_broker_env``, no compactor beside
it), a key space of its own, a new uncompressed 4-partition topic written for 2 s, then
the Go load generator for ``--seconds`` with 4 x 25 x 1 KiB binary bodies (the shape of
issue #47), back to back over N connections or at ``--rate`` requests/s. Per row: MiB/s,
request p50/p99, the broker's CPU (every process of its tree, user + system, from
/proc) per MiB and in cores, the machine's busy cores, and flushes/s
(``llog_batcher_flushes_total``).

    .venv/bin/python bench/flush_cycle.py --rows 1x32,1x64,1x128
    .venv/bin/python bench/flush_cycle.py --rows 1x32 --rate 370
    .venv/bin/python bench/flush_cycle.py --rows 1x32,2x32          # workers x connections
    .venv/bin/python bench/flush_cycle.py --rows 1x32 --set LLOG_BATCH_EAGER_FLUSHES=2
    .venv/bin/python bench/flush_cycle.py --rows 1x32,1x128 --baseline 4562653 --rounds 2

``--set`` applies to every broker of the run; ``--baseline REF`` runs each row also on
revision REF (a worktree under .llog/bench/baseline/), alternating with this tree. It
measures and prints; it asserts nothing. Results: .llog/bench/flush-cycle-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import baseline  # noqa: E402
import http_bench as hb  # noqa: E402
import perf  # noqa: E402
import psutil  # noqa: E402
import shipped  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from app.localstack.broker import wait_healthy  # noqa: E402
from app.localstack.processes import ManagedProcess, free_port  # noqa: E402
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

MiB = 1024 * 1024
SHAPE = (4, 25, 1024)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children (a broker's workers)."""
    total = 0.0
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def flushes(url: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics/prometheus", timeout=10) as resp:
        text = resp.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "llog_batcher_flushes" for s in f.samples
               if s.name.endswith("_total"))


def start_broker(stack: LocalStack, tmp: Path, tree: Path | None, workers: int,
                 settings: dict[str, str]) -> tuple[ManagedProcess, str]:
    """A broker with `llog dev`'s settings (of ``tree``'s revision, or this one)."""
    data = tmp / f"dev-{uuid.uuid4().hex[:6]}"
    env = (baseline.dev_env(tree, stack.settings_env(), data) if tree is not None
           else shipped.dev_broker_env(stack, data))
    env.update({"LLOG_DRAIN_S": "0", "LLOG_ROOT_PREFIX": f"fc{uuid.uuid4().hex[:6]}",
                **settings})
    port = free_port()
    log = tmp / f"broker-{port}.log"
    if tree is None:
        argv = baseline.serve_command(ROOT, port, workers=workers)
        proc = ManagedProcess(f"broker-{port}", argv, log, env=baseline.environment(ROOT, env),
                              cwd=ROOT)
    else:
        argv = baseline.serve_command(tree, port, workers=workers)
        proc = ManagedProcess(f"broker-{port}", argv, log,
                              env=baseline.environment(tree, env), cwd=tree)
    proc.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url)
    return proc, url


def row(stack: LocalStack, tmp: Path, tree: Path | None, workers: int, connections: int,
        a: argparse.Namespace) -> dict[str, Any]:
    settings = dict(kv.split("=", 1) for kv in a.set)
    proc, url = start_broker(stack, tmp, tree, workers, settings)
    try:
        if workers > 1:  # the workers find each other (affinity) before the load
            time.sleep(3)  # a settling window, not a wait for an event
        topic = f"fc-{uuid.uuid4().hex[:6]}"
        hb.create_topic(url, topic, SHAPE[0], compression="none")
        hb.run_loadgen(perf.load_args(url, topic, SHAPE, "binary", 2.0, 8), timeout=120)
        args = perf.load_args(url, topic, SHAPE, "binary", a.seconds, connections)
        if a.rate:
            args += ["-rate", str(a.rate)]
        f0, cpu0, box0 = flushes(url), tree_cpu_seconds(proc.pid), hb.box_busy_seconds()
        t0 = time.monotonic()
        out = hb.run_loadgen(args, timeout=a.seconds * 4 + 60)
        wall = time.monotonic() - t0
        cpu, box = tree_cpu_seconds(proc.pid) - cpu0, hb.box_busy_seconds() - box0
        done = flushes(url) - f0
    finally:
        proc.stop(timeout=20)
    mib = out["bytes_acked"] / MiB
    latency = out["latency_ms"]
    return {"workers": workers, "connections": connections, "rate": a.rate or None,
            "settings": settings, "mib_per_s": out["mib_per_s"],
            "p50_ms": latency.get("p50_ms"), "p99_ms": latency.get("p99_ms"),
            "errors": out["errors"] + out.get("status_503", 0) + out.get("other_status", 0),
            "broker_cores": cpu / wall, "broker_ms_per_mib": cpu / mib * 1000 if mib else None,
            "box_cores": box / wall, "flushes_per_s": done / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1x32", help="WORKERSxCONNECTIONS, comma-separated")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="requests/s over all connections (0: back to back)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="LLOG_X=V",
                        help="a broker setting for every row (repeatable)")
    parser.add_argument("--baseline", default=None, metavar="REF")
    a = parser.parse_args()
    plan = [tuple(int(n) for n in item.split("x")) for item in a.rows.split(",")]
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if a.baseline:
        tree, commit = baseline.checkout(a.baseline)
        trees.insert(0, (commit, tree))
    results = []
    print(f"{'code':>12} {'workers':>7} {'conns':>5} {'MiB/s':>7} {'p50 ms':>7} "
          f"{'p99 ms':>7} {'cores':>6} {'ms/MiB':>7} {'box':>5} {'flush/s':>7}")
    with tempfile.TemporaryDirectory(prefix="llog-flush-cycle-") as tmp, \
            LocalStack(StackConfig.ephemeral(Path(tmp) / "stack")) as stack:
        for _ in range(a.rounds):
            for workers, connections in plan:
                for name, tree in trees:
                    r = {"code": name, **row(stack, Path(tmp), tree, workers, connections, a)}
                    results.append(r)
                    print(f"{name:>12} {workers:>7} {connections:>5} {r['mib_per_s']:>7.1f} "
                          f"{r['p50_ms'] or 0:>7.1f} {r['p99_ms'] or 0:>7.1f} "
                          f"{r['broker_cores']:>6.2f} {r['broker_ms_per_mib'] or 0:>7.2f} "
                          f"{r['box_cores']:>5.2f} {r['flushes_per_s']:>7.1f}", flush=True)
    out_dir = ROOT / ".llog" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"flush-cycle-{stamp}.json"
    path.write_text(json.dumps({"args": vars(a), "rows": results}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
