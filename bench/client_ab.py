"""The Python client's producers against one `llog dev` broker, this tree's client and a
baseline revision's in the same run, rows alternating.

One stack (real Oxia and MinIO on free ports) and one broker of this tree with `llog
dev`'s settings (bench/shipped.py's ``dev_broker_env``, no compactor beside it); with
--baseline-broker a second, of the baseline revision, on the same stack, takes that
revision's rows (the whole path before and after: client and broker). Each row is one
run of a revision's bench/peer_clients.py KIND (its client on its ``PYTHONPATH``) into
a new uncompressed 4-partition topic: records of --record-bytes, round-robin over the
partitions, back to back for --seconds, or paced at --rate records/s (each record's
latency from when it was due to its acknowledgement, the first --warmup seconds
untimed). Per row: records/s, MiB/s, the client's CPU per record
(``time.process_time()`` of its process), the p50/p99 of paced records, errors, and
the producer's retries.

    .venv/bin/python bench/client_ab.py --baseline 35f0acb --rate 45000 --rounds 3
    .venv/bin/python bench/client_ab.py --baseline 35f0acb --kinds llog-producer
    .venv/bin/python bench/client_ab.py --baseline dde4b95 --baseline-broker

It measures and prints; it asserts nothing. Results: .llog/bench/client-ab-<time>.json.
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

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import baseline  # noqa: E402
import flush_cycle  # noqa: E402
import http_bench as hb  # noqa: E402

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

PARTITIONS = 4


def client_row(tree: Path, kind: str, url: str, a: argparse.Namespace) -> dict[str, Any]:
    """One run of ``tree``'s peer client ``kind`` with ``tree``'s llog_client."""
    topic = f"ab-{uuid.uuid4().hex[:6]}"
    hb.create_topic(url, topic, PARTITIONS, compression="none")
    flags = ["--seconds", str(a.seconds), "--record-bytes", str(a.record_bytes)]
    if a.rate:
        flags += ["--rate", str(a.rate), "--warmup", str(a.warmup)]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(tree / "clients" / "python" / "src"),
                                          str(tree)])}
    done = subprocess.run([sys.executable, str(tree / "bench" / "peer_clients.py"), kind,
                           url, topic, *flags], capture_output=True, text=True, env=env,
                          timeout=a.seconds + a.warmup + 180, cwd=tree)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-600:]}
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="llog-async-producer,llog-producer",
                        help="bench/peer_clients.py producer kinds, comma-separated")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="records/s (0: back to back)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--baseline", default=None, metavar="REF")
    parser.add_argument("--baseline-broker", action="store_true",
                        help="the baseline's client against a broker of the baseline "
                             "(both brokers on the one stack), not this tree's")
    a = parser.parse_args()
    trees: list[tuple[str, Path]] = [("this tree", ROOT)]
    if a.baseline:
        tree, commit = baseline.checkout(a.baseline)
        trees.insert(0, (commit, tree))
    results = []
    print(f"{'code':>12} {'kind':>20} {'rec/s':>8} {'MiB/s':>7} {'us/rec':>7} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'errors':>6} {'retries':>7}")
    with tempfile.TemporaryDirectory(prefix="llog-client-ab-") as tmp, \
            LocalStack(StackConfig.ephemeral(Path(tmp) / "stack")) as stack:
        proc, url = flush_cycle.start_broker(stack, Path(tmp), None, 1, {})
        urls = {name: url for name, _ in trees}
        base_proc = None
        if a.baseline and a.baseline_broker:  # the baseline's client to its own broker
            base_proc, urls[trees[0][0]] = flush_cycle.start_broker(stack, Path(tmp),
                                                                    trees[0][1], 1, {})
        try:
            for _ in range(a.rounds):
                for kind in a.kinds.split(","):
                    for name, tree in trees:
                        r = {"code": name, "kind": kind,
                             **client_row(tree, kind, urls[name], a)}
                        results.append(r)
                        if "error" in r:
                            print(f"{name:>12} {kind:>20} failed: {r['error']}", flush=True)
                            continue
                        latency = r.get("latency_ms") or {}
                        retries = (r.get("producer_metrics") or {}).get("retries")
                        print(f"{name:>12} {kind:>20} {r['records_per_s']:>8.0f} "
                              f"{r['mib_per_s']:>7.1f} {r['cpu_us_per_record'] or 0:>7.2f} "
                              f"{latency.get('p50_ms') or 0:>7.1f} "
                              f"{latency.get('p99_ms') or 0:>7.1f} {r['errors']:>6} "
                              f"{retries if retries is not None else '-':>7}", flush=True)
        finally:
            proc.stop(timeout=20)
            if base_proc is not None:
                base_proc.stop(timeout=20)
    out_dir = ROOT / ".llog" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = out_dir / f"client-ab-{stamp}.json"
    path.write_text(json.dumps({"args": vars(a), "rows": results}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
