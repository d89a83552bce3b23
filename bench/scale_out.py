"""Brokers added behind the proxy: what each one costs in coordination (a script).

Starts real Oxia and MinIO, then for each case N ``llog serve`` processes behind Caddy
(the reference configuration, as ``llog dev --brokers N`` runs it) and drives them through
the proxy with one Go load generator in the shape of the load that showed brokers
colliding: 16 connections, each request 16 partitions x 5 x 1 KiB records, binary, on a
16-partition topic, after an unmeasured warm-up. Cases:

- ``1``, ``2``, ``3``: that many brokers (one uvicorn worker each);
- ``1x2``: one broker with ``--workers 2`` (its workers write every partition too);
- ``ideal``: 3 brokers addressed directly, no proxy, one load generator per broker
  writing only the partitions rendezvous hashing prefers that broker for
  (``owner_set(0, topic, partition, members, 1)``, app/loadtest/routing.py, over the
  member ids ``{broker_id}.w0``), with ``--ideal-connections`` each: what clients that
  split each request per broker would send. No broker ever writes another's partitions
  and no request makes a second hop: the most affinity can give;
- ``smart`` (``smart2``: 2 brokers): 3 brokers behind Caddy and one load generator that
  asks the proxy for the brokers' map (``GET /cluster``) and sends each partition's
  records straight to the broker preferred for it, each request carrying as many records
  as one through the proxy (``-route members``): a client that gathers each broker's
  records.

``--load-per-member`` gives the load generator ``--connections`` per member (broker
worker) instead of ``--connections`` in all: the load grows with the brokers, as it does
when brokers are added for it.

Each case runs with every ``--affinity`` value (``LLOG_AFFINITY``; every broker also gets
``LLOG_FORWARD_HOST=127.0.0.1``), and with ``--baseline REV`` again with brokers of that
revision (bench/baseline.py), the variants alternating in order from one case to the
next. Every row has a key space of its own (``LLOG_ROOT_PREFIX``) and the same topic
name, so the partitions each broker is preferred for are the same in every row.

Figures are deltas of every broker's ``GET /metrics`` around the measured window (a
``--workers 2`` broker answers its workers' totals), summed: Oxia requests per 1,000
records and per flush (and by operation), commit CAS conflicts per 1,000 records (over the
whole window and over its last 10 s, the steady state), flushes/s, records per flush,
forwarded and fallback groups where the brokers count them; the load generator's
records/s and p50/p99; the CPU of the brokers (workers included), Oxia, MinIO and Caddy,
records per broker CPU-second, and the whole machine's.

    .venv/bin/python bench/scale_out.py [--duration 15] [--affinity off,forward]
        [--cases 1,2,3,1x2,ideal,smart2,smart] [--baseline REV] [--load-per-member]

Prints a table and writes the results as JSON to .llog/bench/scale-out-<time>.json. It
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import baseline  # noqa: E402
import http_bench as hb  # noqa: E402

from app.loadtest.routing import owner_set  # noqa: E402
from app.localstack.broker import broker_process, wait_healthy  # noqa: E402
from app.localstack.processes import ManagedProcess, free_port  # noqa: E402
from app.localstack.proxy import (  # noqa: E402
    ProxyConfig,
    find_binary,
    proxy_process,
    wait_serving,
)
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.settings import Settings  # noqa: E402

PARTITIONS = 16
RECORDS = 5  # per entry
RECORD_BYTES = 1024
TOPIC = "scale"  # one name in every row (each row has its own key space)
STEADY_S = 10.0  # the last seconds of the window, measured apart: the steady state
ROUTES = ("local", "forwarded", "fallback", "in_doubt")


@dataclass(frozen=True)
class Case:
    name: str
    brokers: int
    workers: int = 1
    direct: bool = False  # no proxy: one load generator per broker, its partitions only
    smart: bool = False  # the load generator routes by the brokers' map (-route members)

    def member_ids(self) -> list[str]:
        """The members rendezvous ranks: ``{broker_id}.w{slot}``, one per worker."""
        return [f"{b}.w{w}" for b in broker_ids(self.brokers) for w in range(self.workers)]


# --broker-setting: LLOG_* settings given to every broker of the run.
BROKER_SETTINGS: dict[str, str] = {}

CASES = {c.name: c for c in (Case("1", 1), Case("2", 2), Case("3", 3),
                             Case("1x2", 1, workers=2), Case("ideal", 3, direct=True),
                             Case("smart2", 2, smart=True), Case("smart", 3, smart=True))}


@dataclass(frozen=True)
class Variant:
    affinity: str
    code: str  # "this tree", or the --baseline revision and its commit
    tree: Path | None = None  # None: this tree


def broker_ids(count: int) -> list[str]:
    return [f"b{i}" for i in range(1, count + 1)]


def preferred(members: list[str]) -> dict[str, list[int]]:
    """The partitions of :data:`TOPIC` each member is preferred for (seed 0)."""
    out: dict[str, list[int]] = {m: [] for m in members}
    for p in range(PARTITIONS):
        out[owner_set(0, TOPIC, p, members, 1)[0]].append(p)
    return out


# -- the processes of one row ----------------------------------------------------------


@dataclass
class Broker:
    id: str
    url: str
    proc: ManagedProcess


@dataclass
class Cluster:
    """The brokers of one row (and Caddy in front of them unless the case is direct)."""

    stack: LocalStack
    logs: Path
    case: Case
    variant: Variant
    prefix: str  # LLOG_ROOT_PREFIX: a key space of the row's own
    brokers: list[Broker] = field(default_factory=list)
    proxy: ManagedProcess | None = None
    proxy_url: str | None = None

    def _env(self, broker_id: str) -> dict[str, str]:
        return {**self.stack.settings_env(), "LLOG_ROOT_PREFIX": self.prefix,
                "LLOG_BROKER_ID": broker_id, "LLOG_ROLES": "write,read",
                "LLOG_DRAIN_S": "0", "LLOG_AFFINITY": self.variant.affinity,
                "LLOG_FORWARD_HOST": "127.0.0.1", **BROKER_SETTINGS}

    def _process(self, broker_id: str, port: int) -> ManagedProcess:
        name = f"{self.prefix}-{broker_id}"
        log = self.logs / f"{name}.log"
        env, tree, workers = self._env(broker_id), self.variant.tree, self.case.workers
        if tree is None:
            return broker_process(name, port, env, log, workers=workers)
        return ManagedProcess(name, baseline.serve_command(tree, port, workers=workers), log,
                              env=baseline.environment(tree, env), cwd=tree)

    def start(self) -> None:
        for broker_id in broker_ids(self.case.brokers):
            port = free_port()
            broker = Broker(broker_id, f"http://127.0.0.1:{port}",
                            self._process(broker_id, port))
            self.brokers.append(broker)
            broker.proc.start()
        for broker in self.brokers:
            wait_healthy(broker.proc, broker.url, timeout=90)
        if self.variant.affinity != "off":
            self._wait_for_members()
        if self.case.direct:
            return
        binary = find_binary("caddy")
        assert binary is not None, "Caddy is built from its module; it is never missing"
        config = ProxyConfig(
            kind="caddy", listen_port=free_port(),
            upstreams=[("127.0.0.1", int(b.url.rsplit(":", 1)[1])) for b in self.brokers],
            max_request_bytes=Settings.from_env().max_request_bytes,
            run_dir=self.logs / f"{self.prefix}-proxy")
        self.proxy = proxy_process(config, binary)
        self.proxy.start()
        wait_serving(self.proxy, config)
        self.proxy_url = f"http://127.0.0.1:{config.listen_port}"

    def _wait_for_members(self, timeout: float = 60.0) -> None:
        """Until every broker's view lists every member: rows measure the settled
        cluster, and a client's map (``smart``) is the one the brokers use."""
        want = sorted(self.case.member_ids())
        deadline = time.monotonic() + timeout
        while True:
            try:
                views = [sorted(m["member_id"]
                                for m in hb.get_json(f"{b.url}/cluster")["members"])
                         for b in self.brokers]
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # code from before membership: nothing to wait for
                    return
                raise
            if all(v == want for v in views):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"members not settled in {timeout:.0f} s: {views}")
            time.sleep(0.2)

    def stop(self) -> None:
        for broker in self.brokers:
            with contextlib.suppress(Exception):
                broker.proc.signal(signal.SIGTERM)  # all stop at once
        for broker in self.brokers:
            broker.proc.stop(timeout=30)
        if self.proxy is not None:
            self.proxy.stop(timeout=10)

    def scrape(self) -> list[dict[str, Any]]:
        return [hb.get_json(f"{b.url}/metrics") for b in self.brokers]

    def cpu_seconds(self) -> float:
        """The brokers' CPU, each with its children (the workers of ``--workers N``)."""
        return sum(tree_cpu_seconds(b.proc.pid) for b in self.brokers)


def tree_cpu_seconds(pid: int) -> float:
    total = hb.cpu_seconds(pid)
    with contextlib.suppress(psutil.Error):
        total += sum(hb.cpu_seconds(c.pid) for c in psutil.Process(pid).children(True))
    return total


def create_topic(url: str) -> None:
    hb.create_topic(url, TOPIC, PARTITIONS)


# -- the load --------------------------------------------------------------------------


def loadgen_args(url: str, seconds: float, connections: int,
                 partition_set: list[int] | None = None) -> list[str]:
    args = ["-mode", "throughput", "-url", url, "-topic", TOPIC, "-format", "binary",
            "-connections", str(connections), "-partitions", str(PARTITIONS),
            "-entries", str(PARTITIONS), "-records", str(RECORDS),
            "-size", str(RECORD_BYTES), "-duration", f"{seconds}s", "-timeout", "30s"]
    if partition_set is not None:
        args += ["-partition-set", ",".join(map(str, partition_set))]
    return args


def loads_of(cluster: Cluster, seconds: float, args: argparse.Namespace
             ) -> list[list[str]]:
    """Through the proxy: one load generator (``smart``: routing by the brokers' map).
    Direct: one per broker, writing the partitions its broker is preferred for."""
    members = len(cluster.case.member_ids())
    if cluster.proxy_url is not None:
        connections = args.connections * (members if args.load_per_member else 1)
        routed = ["-route", "members"] if cluster.case.smart else []
        return [loadgen_args(cluster.proxy_url, seconds, connections) + routed]
    owned = preferred(cluster.case.member_ids())
    return [loadgen_args(b.url, seconds, args.ideal_connections, owned[f"{b.id}.w0"])
            for b in cluster.brokers if owned[f"{b.id}.w0"]]


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([str(hb.LOADGEN_BIN), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _collect(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.returncode != 0:
        raise hb.BenchError(f"the load generator failed (exit {proc.returncode}): "
                            f"{err.strip()[-500:]}")
    result: dict[str, Any] = json.loads(out)
    return result


def run_loads(all_args: list[list[str]], timeout: float) -> list[dict[str, Any]]:
    procs = [_spawn(a) for a in all_args]
    try:
        return [_collect(p, timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)


# -- metrics ---------------------------------------------------------------------------


def summed(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, float]:
    """Deltas of the figures this script reports, summed over the brokers. Series a
    broker does not have (another revision's) count 0."""

    def delta(name: str, **labels: str) -> float:
        return sum(hb.metric_sum(a, name, **labels) - hb.metric_sum(b, name, **labels)
                   for b, a in zip(before, after, strict=True))

    out = {
        "oxia_requests": delta("llog_oxia_requests_total"),
        "flushes": delta("llog_batcher_flushes_total"),
        "flush_partitions": delta("llog_batcher_flush_partitions_sum"),
        "produce_records": delta("llog_produce_records_total"),
        "appended_records": delta("llog_appended_records_total"),
        "cas_conflicts": delta("llog_commit_cas_conflicts_total"),
        "cas_retries": delta("llog_cas_retries_total"),
        "s3_put": delta("llog_s3_requests_total", op="put"),
        "forward_frames": delta("llog_forward_frames_total"),
        "affinity_fallbacks": delta("llog_affinity_fallbacks_total"),
    }
    for route in ROUTES:
        out[f"groups_{route}"] = delta("llog_affinity_groups_total", route=route)
    ops = {dict(p.split("=", 1) for p in labels.split(",") if "=" in p).get("op")
           for snapshot in after
           for labels in snapshot.get("metrics", {}).get("llog_oxia_requests_total", {})}
    for op in sorted(o for o in ops if o):
        out[f"oxia_{op}"] = delta("llog_oxia_requests_total", op=op)
    return out


def has_series(snapshots: list[dict[str, Any]], name: str) -> bool:
    return any(name in s.get("metrics", {}) for s in snapshots)


def per_1k(count: float, records: float) -> float | None:
    return count / records * 1000 if records else None


# -- one row ---------------------------------------------------------------------------


def measure_row(stack: LocalStack, logs: Path, case: Case, variant: Variant,
                args: argparse.Namespace) -> dict[str, Any]:
    cluster = Cluster(stack, logs, case, variant, f"scale-{uuid.uuid4().hex[:8]}")
    try:
        cluster.start()
        create_topic(cluster.proxy_url or cluster.brokers[0].url)
        if args.warmup > 0:  # every partition written; connections and caches warm
            run_loads(loads_of(cluster, args.warmup, args), timeout=args.warmup + 120)
        return _measured(cluster, args)
    finally:
        cluster.stop()


def _measured(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    case, variant = cluster.case, cluster.variant
    stack = cluster.stack
    servers = {"oxia": stack.oxia.pid if stack.oxia else None,
               "minio": stack.minio.pid if stack.minio else None,
               "proxy": cluster.proxy.pid if cluster.proxy else None}
    loadavg = list(os.getloadavg())
    before = cluster.scrape()
    cpu0 = cluster.cpu_seconds()
    server_cpu0 = {k: hb.cpu_seconds(p) for k, p in servers.items() if p}
    box0 = hb.box_busy_seconds()
    t0 = time.monotonic()
    procs = [_spawn(a) for a in loads_of(cluster, args.duration, args)]
    middle: list[dict[str, Any]] | None = None
    t_mid = 0.0
    try:
        if args.duration > STEADY_S + 1:
            time.sleep(max(0.0, t0 + args.duration - STEADY_S - time.monotonic()))
            middle, t_mid = cluster.scrape(), time.monotonic()
        loads = [_collect(p, args.duration + 120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
    wall = time.monotonic() - t0
    after = cluster.scrape()
    t_end = time.monotonic()
    box = hb.box_busy_seconds() - box0
    broker_cpu = cluster.cpu_seconds() - cpu0
    server_cpu = {k: (hb.cpu_seconds(p) - server_cpu0[k]) / wall
                  for k, p in servers.items() if p}
    for b in cluster.brokers:
        b.proc.check_alive()
    d = summed(before, after)
    acked = sum(x["records_acked"] for x in loads)
    # Records committed by the writers (counted once, where appended): the denominator
    # of the ratios, so that forwarded records are not counted at both brokers.
    records = d["appended_records"] or acked
    flushes = d["flushes"]
    processes = case.brokers * case.workers
    groups = sum(d[f"groups_{r}"] for r in ROUTES)
    row: dict[str, Any] = {
        "case": case.name, "brokers": case.brokers, "workers": case.workers,
        "direct": case.direct, "affinity": variant.affinity, "code": variant.code,
        "root_prefix": cluster.prefix, "loadavg_start": loadavg, "window_s": wall,
        "records_per_s": sum(x["records_per_s"] for x in loads),
        "mib_per_s": sum(x["mib_per_s"] for x in loads),
        "requests_per_s": sum(x["requests_per_s"] for x in loads),
        # Several load generators (ideal): the slowest one's percentiles.
        "p50_ms": max(x["latency_ms"]["p50_ms"] for x in loads),
        "p99_ms": max(x["latency_ms"]["p99_ms"] for x in loads),
        "errors": sum(x["errors"] + x["other_status"] + x["status_503"] for x in loads),
        "records_acked": acked,
        "oxia_per_1k_records": per_1k(d["oxia_requests"], records),
        "oxia_per_flush": d["oxia_requests"] / flushes if flushes else None,
        "oxia_per_1k_by_op": {k.removeprefix("oxia_"): per_1k(v, records)
                              for k, v in d.items()
                              if k.startswith("oxia_") and k != "oxia_requests"},
        "cas_conflicts_per_1k_records": per_1k(d["cas_conflicts"], records),
        "cas_retries_per_1k_records": per_1k(d["cas_retries"], records),
        "flushes_per_s": flushes / wall,
        "flushes_per_s_per_process": flushes / wall / processes,
        "records_per_flush": records / flushes if flushes else None,
        "partitions_per_flush": d["flush_partitions"] / flushes if flushes else None,
        "s3_puts_per_s": d["s3_put"] / wall,
        "forwarded_pct": (100 * d["groups_forwarded"] / groups
                          if has_series(after, "llog_affinity_groups_total") and groups
                          else None),
        "fallbacks": (d["groups_fallback"] + d["affinity_fallbacks"]
                      if has_series(after, "llog_affinity_groups_total") else None),
        "forward_frames": (d["forward_frames"]
                           if has_series(after, "llog_forward_frames_total") else None),
        # smart: requests its member took no connection for, sent through the proxy
        "client_fallbacks": (sum(x.get("fallbacks", 0) for x in loads)
                             if case.smart else None),
        "broker_cpu_s": broker_cpu,
        "broker_cpu_cores": broker_cpu / wall,
        "records_per_broker_cpu_s": acked / broker_cpu if broker_cpu else None,
        "oxia_cpu_cores": server_cpu.get("oxia"),
        "minio_cpu_cores": server_cpu.get("minio"),
        "proxy_cpu_cores": server_cpu.get("proxy"),
        "loadgen_cpu_cores": sum(x["loadgen_cpu_s"] for x in loads) / wall,
        "box_cpu_cores": box / wall,
        "metric_deltas": d,
        "loads": loads,
    }
    if case.brokers * case.workers > 1:
        row["preferred"] = preferred(case.member_ids())
    if middle is not None:
        s = summed(middle, after)
        steady = s["appended_records"]
        row.update({"steady_window_s": t_end - t_mid,
                    "steady_cas_conflicts_per_1k_records": per_1k(s["cas_conflicts"], steady),
                    "steady_oxia_per_1k_records": per_1k(s["oxia_requests"], steady),
                    "steady_metric_deltas": s})
    return row


# -- the run ---------------------------------------------------------------------------


def rows_to_run(cases: list[Case], variants: list[Variant]
                ) -> list[tuple[Case, Variant]]:
    """Each case with each variant, their order reversed every other case (so no variant
    always meets the machine first). ``ideal`` runs with each affinity value too: no
    request needs forwarding there, but with affinity on the brokers are members and share
    the flush budget (app/batching/batcher.py, pacing). ``smart`` needs the members' map:
    affinity on, and this tree (a ``--baseline`` may predate ``GET /cluster``)."""
    out: list[tuple[Case, Variant]] = []
    for i, case in enumerate(cases):
        chosen = [v for v in variants
                  if not case.smart or (v.affinity != "off" and v.tree is None)]
        out += [(case, v) for v in (chosen if i % 2 == 0 else chosen[::-1])]
    return out


def _f(value: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


COLUMNS = [  # (header, key, format, width)
    ("case", "case", "", 5), ("affinity", "affinity", "", 8),
    ("rec/s", "records_per_s", ",.0f", 7),
    ("Oxia/1k", "oxia_per_1k_records", ".1f", 7),
    ("Oxia/flush", "oxia_per_flush", ".2f", 10),
    ("CAS/1k", "cas_conflicts_per_1k_records", ".1f", 6),
    ("CAS/1k 10s", "steady_cas_conflicts_per_1k_records", ".1f", 10),
    ("flush/s", "flushes_per_s", ".1f", 7),
    ("/proc", "flushes_per_s_per_process", ".1f", 5),
    ("rec/flush", "records_per_flush", ".0f", 9),
    ("fwd %", "forwarded_pct", ".0f", 5), ("fallbk", "fallbacks", ".0f", 6),
    ("p50", "p50_ms", ".0f", 4), ("p99", "p99_ms", ".0f", 4),
    ("brk CPU", "broker_cpu_cores", ".2f", 7),
    ("rec/CPU-s", "records_per_broker_cpu_s", ",.0f", 9),
    ("Oxia", "oxia_cpu_cores", ".2f", 4), ("MinIO", "minio_cpu_cores", ".2f", 5),
    ("Caddy", "proxy_cpu_cores", ".2f", 5), ("box", "box_cpu_cores", ".2f", 4),
    ("load", "load1", ".1f", 4), ("err", "errors", "d", 3),
]


def print_report(results: dict[str, Any]) -> None:
    s, m = results["settings"], results["machine"]
    print()
    print(f"scale-out: {s['partitions']} partitions, {s['connections']} connections through "
          f"Caddy ({s['ideal_connections']} per broker direct for ideal), "
          f"{s['partitions']} x {s['records']} x {s['record_bytes']} B binary per request, "
          f"{s['duration_s']:g} s per row after {s['warmup_s']:g} s warm-up; "
          f"machine: {m['nproc']} CPUs, {m['cpu_model']}, load "
          f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end")
    print_rows(results["rows"])


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The rows' table, one per code tree, and what the columns mean (also printed by
    bench/perf.py's cost section)."""
    codes = list(dict.fromkeys(r["code"] for r in rows))
    head = " ".join(f"{h:>{w}}" for h, _, _, w in COLUMNS)
    for code in codes:
        print(f"\n{code}")
        print(head)
        print("-" * len(head))
        for r in rows:
            if r["code"] != code:
                continue
            if "error" in r:
                print(f"{r['case']:>5} {r['affinity']:>8} FAILED: {hb._brief(r['error'])}")
                continue
            r = {**r, "load1": r["loadavg_start"][0]}
            print(" ".join(_f(r.get(k), spec, w) for _, k, spec, w in COLUMNS))
    print("\nOxia requests per 1,000 records, by operation:")
    for r in rows:
        if "error" not in r:
            ops = "  ".join(f"{op} {v:.1f}" for op, v in r["oxia_per_1k_by_op"].items()
                            if v is not None and v >= 0.05)
            print(f"  {r['case']:>5} {r['affinity']:>8} {r['code'][:24]:<24} {ops}")
    print("\nrec/s: acknowledged records per second; Oxia/1k, CAS/1k: Oxia requests and "
          "commit CAS conflicts per 1,000 records committed (summed over the brokers); "
          f"CAS/1k 10s: the same over the window's last {STEADY_S:g} s; flush/s: batcher "
          "flushes per second, /proc per broker process (worker); fwd %: produce groups "
          "forwarded to their preferred broker; p50/p99: produce latency (ms); brk CPU: "
          "cores used by the brokers (workers included); rec/CPU-s: records per broker "
          "CPU-second; Oxia, MinIO, Caddy, box: cores used by each and by the whole "
          "machine; load: 1-minute load average when the row started")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0,
                        help="measured seconds per row (default 15)")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="unmeasured seconds of the same load first (default 3)")
    parser.add_argument("--connections", type=int, default=16,
                        help="load generator connections through the proxy (default 16)")
    parser.add_argument("--ideal-connections", type=int, default=None,
                        help="ideal: connections of each broker's load generator "
                             "(default: --connections)")
    parser.add_argument("--load-per-member", action="store_true",
                        help="through the proxy, --connections per member (broker worker): "
                             "the load grows with the brokers instead of staying fixed")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of {', '.join(CASES)} (default: all)")
    parser.add_argument("--affinity", default="off",
                        help="LLOG_AFFINITY values, comma-separated (default off)")
    parser.add_argument("--broker-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="an LLOG_* setting for every broker of every row (repeatable), "
                             "e.g. LLOG_BATCH_MAX_INFLIGHT=1")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run every case with brokers of this git revision")
    args = parser.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    args.affinities = [a for a in args.affinity.split(",") if a]
    if not args.affinities or args.duration <= 0 or args.connections < 1:
        parser.error("--affinity needs a value; --duration and --connections positive")
    args.ideal_connections = args.ideal_connections or args.connections
    for item in args.broker_setting:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("LLOG_"):
            parser.error(f"--broker-setting {item!r}: expected LLOG_NAME=VALUE")
        BROKER_SETTINGS[name] = value
    return args


def main() -> int:
    args = parse_args()
    os.chdir(ROOT)
    for key in [k for k in os.environ if k.startswith("LLOG_") and k != "LLOG_BIN_CACHE_DIR"]:
        del os.environ[key]  # only what this run sets configures the brokers
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    hb.build_loadgen()
    variants = [Variant(a, "this tree") for a in args.affinities]
    if args.baseline:
        tree, commit = baseline.checkout(args.baseline)
        variants += [Variant(a, f"at {args.baseline} = {commit}", tree)
                     for a in args.affinities]
    cases = [CASES[c] for c in args.cases.split(",")]
    results: dict[str, Any] = {
        "started_at": stamp, "machine": hb.machine_info(), "rows": [],
        "settings": {"duration_s": args.duration, "warmup_s": args.warmup,
                     "connections": args.connections,
                     "ideal_connections": args.ideal_connections,
                     "load_per_member": args.load_per_member,
                     "broker_settings": dict(BROKER_SETTINGS),
                     "partitions": PARTITIONS, "records": RECORDS,
                     "record_bytes": RECORD_BYTES, "format": "binary",
                     "cases": args.cases, "affinity": args.affinities,
                     "baseline": args.baseline, "proxy": "caddy", "oxia_shards": 1,
                     "rendezvous": "owner_set(0, topic, partition, members, 1), members "
                                   "{broker_id}.w{worker}"}}
    failed = False
    with tempfile.TemporaryDirectory(prefix="llog-scale-out-") as tmp:
        logs = Path(tmp) / "logs"
        logs.mkdir()
        stack = LocalStack(StackConfig.ephemeral(Path(tmp) / "stack"))
        stack.start()
        try:
            for case, variant in rows_to_run(cases, variants):
                print(f"scale_out: case {case.name}, affinity {variant.affinity}, "
                      f"{variant.code}", flush=True)
                try:
                    row = measure_row(stack, logs, case, variant, args)
                except (hb.BenchError, OSError, RuntimeError) as exc:
                    failed = True
                    print(f"scale_out: failed: {exc}", file=sys.stderr)
                    row = {"case": case.name, "affinity": variant.affinity,
                           "code": variant.code, "error": str(exc)}
                results["rows"].append(row)
        finally:
            stack.stop()
    results["machine"]["loadavg_end"] = list(os.getloadavg())
    print_report(results)
    hb.OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = hb.OUT_DIR / f"scale-out-{stamp}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {out.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
