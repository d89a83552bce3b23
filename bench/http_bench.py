"""Broker HTTP benchmark: POST /produce throughput and produce-to-consume latency.

Starts real Oxia and MinIO on free ports in a temporary directory, then for each
scenario a fresh `llog serve` broker (one process, one uvicorn worker) and drives it with
the Go load generator in bench/httpload (closed loop, N keep-alive connections, fixed
duration). Scenarios: 100 B and 1 KiB records x two batch settings; for each record size
the bare FastAPI baseline (bench/bare_app.py: same request model, no storage), the
ceiling of the HTTP layer, measured in the same run; and one produce-to-consume latency
run (one producer sending one record at a time, one long-poll consumer).

Broker-side figures (S3 PUT/s, flushes, Oxia requests per flush, records per flush) are
deltas of the broker's GET /metrics taken around the measured window; each scenario is
preceded by an unmeasured warm-up run that creates the partitions.

    .venv/bin/python bench/http_bench.py [--duration 10] [--connections 32] [--quick]

Prints a table and writes the results to .llog/bench/http-<timestamp>.json. It is a
measurement, not a test: nothing is asserted about the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.loadtest.snapshots import cpu_model  # noqa: E402
from app.localstack.broker import broker_process, wait_healthy  # noqa: E402
from app.localstack.processes import ManagedProcess, ProcessFailed, free_port  # noqa: E402
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

MiB = 1024 * 1024
KiB = 1024
LOADGEN_SRC = ROOT / "bench" / "httpload"
OUT_DIR = ROOT / ".llog" / "bench"
LOADGEN_BIN = OUT_DIR / "httpload"


class BenchError(RuntimeError):
    """A step of the benchmark failed; the message says which and why."""


@dataclass(frozen=True)
class Batch:
    delay_ms: int
    max_bytes: int

    @property
    def label(self) -> str:
        return f"{self.delay_ms} ms / {self.max_bytes // MiB} MiB"


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "bare" or "broker"
    record_bytes: int
    records_per_request: int
    batch: Batch | None = None


# -- the load generator ----------------------------------------------------------------


def go_env() -> dict[str, str]:
    # The machine's toolchain, never a downloaded one; the one module the load generator
    # needs (the HDR histogram, pinned in go.sum) comes through the module proxy.
    return {**os.environ, "GOTOOLCHAIN": "local"}


def build_loadgen() -> Path:
    """``go build`` bench/httpload into .llog/bench/httpload (Go's build cache makes
    repeated builds instant)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    try:
        # The loadgen is its own module, so build from its directory.
        proc = subprocess.run(["go", "build", "-o", str(LOADGEN_BIN), "."], cwd=LOADGEN_SRC,
                              env=go_env(), capture_output=True, text=True, timeout=300)
    except FileNotFoundError:
        raise BenchError("`go` is not on PATH; the load generator needs Go 1.22+") from None
    except subprocess.TimeoutExpired:
        raise BenchError("building bench/httpload took more than 300 s") from None
    if proc.returncode != 0:
        raise BenchError(f"building bench/httpload failed:\n{proc.stderr.strip()}")
    return LOADGEN_BIN


def go_version() -> str:
    try:
        out = subprocess.run(["go", "version"], capture_output=True, text=True, timeout=30,
                             env=go_env())
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"


def run_loadgen(args: list[str], timeout: float) -> dict[str, Any]:
    """Run the load generator, return its JSON; kill it if it overruns ``timeout``."""
    proc = subprocess.Popen([str(LOADGEN_BIN), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"the load generator ran over {timeout:.0f} s: {' '.join(args)}") from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.returncode != 0:
        raise BenchError(f"the load generator failed (exit {proc.returncode}): "
                         f"{stderr.strip()[-2000:]}")
    try:
        result: dict[str, Any] = json.loads(stdout)
    except ValueError:
        raise BenchError(f"the load generator printed no JSON: {stdout[-500:]!r}") from None
    return result


def throughput_args(url: str, path: str, sc: Scenario, topic: str, duration: float,
                    connections: int, partitions: int) -> list[str]:
    return ["-mode", "throughput", "-url", url, "-path", path, "-topic", topic,
            "-connections", str(connections), "-partitions", str(partitions),
            "-records", str(sc.records_per_request), "-size", str(sc.record_bytes),
            "-duration", f"{duration}s", "-timeout", "30s"]


# -- metrics ---------------------------------------------------------------------------


class TopicRefused(BenchError):
    """The broker refused a topic's settings (400 or 422 naming one of them): it does not
    know the setting (a broker older than it) or refuses its value."""


def create_topic(url: str, topic: str, partitions: int, **settings: Any) -> None:
    """Create ``topic`` with ``partitions`` and any other ``settings`` of ``POST /topics``
    (``compression``...) through the broker at ``url`` (409, it exists already, is fine;
    a refusal that names one of ``settings`` is :class:`TopicRefused`)."""
    req = urllib.request.Request(
        f"{url}/topics", method="POST",
        data=json.dumps({"topic": topic, "partitions": partitions, **settings}).encode(),
        headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # exists already
            return
        answer = exc.read()[:2000]
        if exc.code in (400, 422) and _names_a_setting(answer, settings):
            raise TopicRefused(f"creating {topic} with {settings}: the broker answered "
                               f"{exc.code} {answer[:300]!r}") from None
        raise BenchError(f"creating {topic}: {exc.code} {answer[:300]!r}") from None


def _names_a_setting(answer: bytes, settings: dict[str, Any]) -> bool:
    """Whether an error answer's details (``loc``) name one of ``settings``."""
    try:
        details = json.loads(answer).get("details") or []
    except (ValueError, AttributeError):
        return False
    locs = {str(part) for d in details if isinstance(d, dict)
            for part in (d.get("loc") if isinstance(d.get("loc"), list) else [d.get("loc")])}
    return bool(locs & set(settings))


def get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def metric_sum(snapshot: dict[str, Any], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if absent)."""
    total = 0.0
    for label_text, value in snapshot.get("metrics", {}).get(name, {}).items():
        have = dict(part.split("=", 1) for part in label_text.split(",") if "=" in part)
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def metric_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    out = {
        "s3_put": delta("llog_s3_requests_total", op="put"),
        "s3_requests": delta("llog_s3_requests_total"),
        "s3_errors": delta("llog_s3_requests_total") - delta("llog_s3_requests_total",
                                                             outcome="ok"),
        "oxia_requests": delta("llog_oxia_requests_total"),
        "flushes": delta("llog_batcher_flushes_total"),
        "flush_bytes": delta("llog_batcher_flush_bytes_sum"),
        "flush_requests": delta("llog_batcher_flush_requests_sum"),
        "flush_partitions": delta("llog_batcher_flush_partitions_sum"),
        "flush_seconds": delta("llog_batcher_flush_seconds_sum"),
        "produce_records": delta("llog_produce_records_total"),
        "produce_bytes": delta("llog_produce_bytes_total"),
        "cas_conflicts": delta("llog_commit_cas_conflicts_total"),
        "batcher_rejected": delta("llog_batcher_rejected_total"),
    }
    for label_text in after.get("metrics", {}).get("llog_oxia_requests_total", {}):
        have = dict(p.split("=", 1) for p in label_text.split(",") if "=" in p)
        if "op" in have:
            key = f"oxia_{have['op']}"
            if key not in out:
                out[key] = delta("llog_oxia_requests_total", op=have["op"])
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, 0 if unknown."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def box_busy_seconds() -> float:
    """CPU time the whole machine has spent busy (every core, every process)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


# -- scenarios -------------------------------------------------------------------------


@dataclass
class Ctx:
    stack: LocalStack
    logdir: Path  # server logs; kept only when something failed
    duration: float
    warmup: float
    settle: float
    connections: int
    partitions: int
    roles: str


@contextlib.contextmanager
def _serving(proc: ManagedProcess, url: str) -> Iterator[None]:
    """``proc`` started and answering at ``url`` for the block, stopped after it."""
    proc.start()
    try:
        wait_healthy(proc, url, timeout=60)
        yield
    finally:
        proc.stop(timeout=20)


def _server_row(ctx: Ctx, sc: Scenario, url: str, path: str, topic: str,
                proc: ManagedProcess, with_metrics: bool) -> dict[str, Any]:
    """Warm up, then one measured load-generator run against a running server."""
    timeout = ctx.duration + 90
    if ctx.warmup > 0:
        warm = run_loadgen(throughput_args(url, path, sc, topic, ctx.warmup, ctx.connections,
                                           ctx.partitions), timeout)
        if warm["ok"] == 0:
            raise BenchError(f"{sc.name}: no request succeeded during warm-up; "
                             f"samples: {warm['error_samples']}\n{proc.log_tail()}")
    proc.check_alive()
    if ctx.settle > 0:
        time.sleep(ctx.settle)
    before = get_json(f"{url}/metrics") if with_metrics else {}
    cpu0 = cpu_seconds(proc.pid)
    storage = {name: p for name, p in (("oxia", ctx.stack.oxia), ("minio", ctx.stack.minio))
               if p is not None}
    storage_cpu0 = {name: cpu_seconds(p.pid) for name, p in storage.items()}
    t0 = time.monotonic()
    load = run_loadgen(throughput_args(url, path, sc, topic, ctx.duration, ctx.connections,
                                       ctx.partitions), timeout)
    wall = time.monotonic() - t0
    after = get_json(f"{url}/metrics") if with_metrics else {}
    proc.check_alive()
    row: dict[str, Any] = {
        "scenario": sc.name, "kind": sc.kind, "record_bytes": sc.record_bytes,
        "records_per_request": sc.records_per_request,
        "batch_max_delay_ms": sc.batch.delay_ms if sc.batch else None,
        "batch_max_bytes": sc.batch.max_bytes if sc.batch else None,
        "connections": ctx.connections, "partitions": ctx.partitions, "topic": topic,
        "records_per_s": load["records_per_s"], "mib_per_s": load["mib_per_s"],
        "requests_per_s": load["requests_per_s"],
        "p50_ms": load["latency_ms"]["p50_ms"], "p90_ms": load["latency_ms"]["p90_ms"],
        "p99_ms": load["latency_ms"]["p99_ms"], "max_ms": load["latency_ms"]["max_ms"],
        "ok": load["ok"], "status_503": load["status_503"],
        "other_status": load["other_status"], "errors": load["errors"],
        "server_cpu_cores": (cpu_seconds(proc.pid) - cpu0) / wall,
        "storage_cpu_cores": {name: (cpu_seconds(p.pid) - storage_cpu0[name]) / wall
                              for name, p in storage.items()},
        "loadgen_cpu_cores": load["loadgen_cpu_s"] / load["elapsed_s"],
        "loadgen": load,
    }
    if with_metrics:
        d = metric_deltas(before, after)
        flushes = d["flushes"]
        row.update({
            "metrics_window_s": wall,
            "s3_put_per_s": d["s3_put"] / wall,
            "flushes_per_s": flushes / wall,
            "oxia_requests_per_flush": d["oxia_requests"] / flushes if flushes else None,
            "records_per_flush": d["produce_records"] / flushes if flushes else None,
            "requests_per_flush": d["flush_requests"] / flushes if flushes else None,
            "mib_per_flush": d["flush_bytes"] / flushes / MiB if flushes else None,
            "flush_ms_mean": d["flush_seconds"] / flushes * 1000 if flushes else None,
            "metric_deltas": d,
        })
    return row


def run_bare(ctx: Ctx, sc: Scenario) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = ManagedProcess(
        f"bare-{sc.name}",
        [sys.executable, str(ROOT / "bench" / "bare_app.py"), "--port", str(port)],
        ctx.logdir / f"{sc.name}.log",
        env={**os.environ},
        cwd=ROOT,
    )
    with _serving(proc, url):
        return _server_row(ctx, sc, url, "/produce", f"bare-{uuid.uuid4().hex[:8]}", proc,
                           with_metrics=False)


def broker_env(ctx: Ctx, name: str, batch: Batch, extra: dict[str, Any]) -> dict[str, str]:
    return {
        **ctx.stack.settings_env(),
        "LLOG_BATCH_MAX_BYTES": str(batch.max_bytes),
        "LLOG_BATCH_MAX_DELAY_MS": str(batch.delay_ms),
        "LLOG_BROKER_ID": f"bench-{name}",
        "LLOG_ROLES": ctx.roles,
        "LLOG_LOADTEST_SCENARIO": json.dumps({"bench": "http", "scenario": name, **extra}),
    }


def run_broker(ctx: Ctx, sc: Scenario) -> dict[str, Any]:
    assert sc.batch is not None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = broker_env(ctx, sc.name, sc.batch, {
        "record_bytes": sc.record_bytes, "records_per_request": sc.records_per_request,
        "connections": ctx.connections, "partitions": ctx.partitions,
    })
    proc = broker_process(f"broker-{sc.name}", port, env,
                          ctx.logdir / f"{sc.name}.log")
    with _serving(proc, url):
        return _server_row(ctx, sc, url, "/produce", f"bench-{uuid.uuid4().hex[:8]}", proc,
                           with_metrics=True)


def run_e2e(ctx: Ctx, batch: Batch, record_bytes: int, duration: float) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = broker_env(ctx, "e2e", batch, {"record_bytes": record_bytes})
    proc = broker_process("broker-e2e", port, env, ctx.logdir / "e2e.log")
    max_wait_ms = 5000
    warmup = max(ctx.warmup, 0.5)
    with _serving(proc, url):
        load = run_loadgen(
            ["-mode", "e2e", "-url", url, "-topic", f"e2e-{uuid.uuid4().hex[:8]}",
             "-size", str(record_bytes), "-duration", f"{duration}s", "-warmup", f"{warmup}s",
             "-max-wait-ms", str(max_wait_ms), "-drain", "15s", "-timeout", "30s"],
            timeout=duration + warmup + 15 + max_wait_ms / 1000 + 30 + 60,
        )
        proc.check_alive()
    return {
        "batch_max_delay_ms": batch.delay_ms, "batch_max_bytes": batch.max_bytes,
        "record_bytes": record_bytes, "max_wait_ms": max_wait_ms, "duration_s": duration,
        "warmup_s": warmup, "produced": load["produced"], "consumed": load["consumed"],
        "missing": load["missing"], "produce_errors": load["produce_errors"],
        "consume_errors": load["consume_errors"], "drained": load["drained"],
        "produce_latency_ms": load["produce_latency_ms"],
        "e2e_latency_ms": load["e2e_latency_ms"], "loadgen": load,
    }


# -- report ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"nproc": affinity or os.cpu_count(), "cpu_count": os.cpu_count(),
            "cpu_model": cpu_model() or "", "python": platform.python_version(), "go": go_version(),
            "platform": platform.platform(), "loadavg_start": list(os.getloadavg())}


def _fmt(value: Any, spec: str, width: int) -> str:
    if value is None:
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def _size(n: int) -> str:
    return f"{n // KiB} KiB" if n >= KiB and n % KiB == 0 else f"{n} B"


def _brief(error: str) -> str:
    """First and last line of an error (process failures end with their log's tail)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return "unknown error"
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text[:200]


def print_report(results: dict[str, Any]) -> None:
    s = results["settings"]
    m = results["machine"]
    print()
    print(f"llog HTTP benchmark: POST /produce, closed loop, {s['connections']} keep-alive "
          f"connections, {s['partitions']} partitions round-robin (1 partition per request), "
          f"{s['duration_s']:g} s measured per scenario after {s['warmup_s']:g} s warm-up; "
          f"broker = 1 `llog serve` process, 1 uvicorn worker, LLOG_ROLES={s['roles']}; "
          f"real Oxia ({s['oxia_shards']} shard) + MinIO on loopback, same machine")
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model'] or 'unknown model'}), "
          f"Python {m['python']}, {m['go']}, {m['platform']}, load average "
          f"{m['loadavg_start'][0]:.2f} at start, {m['loadavg_end'][0]:.2f} at end")
    print()
    head = (f"{'scenario':<22} {'record':>6} {'rec/req':>7} {'records/s':>10} {'MiB/s':>7} "
            f"{'p50 ms':>7} {'p99 ms':>7} {'S3 PUT/s':>8} {'Oxia ops/flush':>14} "
            f"{'rec/flush':>9} {'503s':>5} {'errors':>6} {'srv CPU':>7} {'% bare':>6}")
    print(head)
    print("-" * len(head))
    for r in results["rows"]:
        if "error" in r:
            print(f"{r['scenario']:<22} FAILED: {_brief(r['error'])}")
            continue
        errors = r["errors"] + r["other_status"]
        print(f"{r['label']:<22} {_size(r['record_bytes']):>6} {r['records_per_request']:>7} "
              f"{r['records_per_s']:>10,.0f} {r['mib_per_s']:>7.2f} {r['p50_ms']:>7.1f} "
              f"{r['p99_ms']:>7.1f} {_fmt(r.get('s3_put_per_s'), '.1f', 8)} "
              f"{_fmt(r.get('oxia_requests_per_flush'), '.1f', 14)} "
              f"{_fmt(r.get('records_per_flush'), ',.0f', 9)} {r['status_503']:>5} "
              f"{errors:>6} {r['server_cpu_cores']:>7.2f} "
              f"{_fmt(r.get('pct_of_bare'), '.0f', 6)}")
    print()
    print("records/s, MiB/s: acknowledged (HTTP 200) records and record bytes per second; "
          "p50/p99: produce request latency (client side, 200s only); S3 PUT/s: broker S3 "
          "PUTs per second; Oxia ops/flush: Oxia requests per batcher flush (one shared WAL "
          "blob each); rec/flush: records per flush; srv CPU: CPU cores used by the server "
          "process; % bare: records/s relative to the bare FastAPI app for the same record "
          "size (the HTTP-layer ceiling)")
    e = results.get("e2e")
    if e and "error" not in e:
        lat, prod = e["e2e_latency_ms"], e["produce_latency_ms"]
        print()
        print(f"produce-to-consume latency (1 producer sending one {_size(e['record_bytes'])} "
              f"record per request back to back, 1 long-poll consumer max_wait_ms "
              f"{e['max_wait_ms']}, batch {e['batch_max_delay_ms']} ms / "
              f"{e['batch_max_bytes'] // MiB} MiB, {e['duration_s']:g} s): "
              f"{lat['count']} records, p50 {lat['p50_ms']:.1f} ms, p90 {lat['p90_ms']:.1f} ms, "
              f"p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms; produce request p50 "
              f"{prod['p50_ms']:.1f} ms, p99 {prod['p99_ms']:.1f} ms; missing "
              f"{e['missing']}, errors {e['produce_errors'] + e['consume_errors']}")
    elif e:
        print(f"\nproduce-to-consume latency: FAILED: {_brief(e['error'])}")


# -- main ------------------------------------------------------------------------------


def _terminate(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# (flag, type, default, help) of every option but --quick.
_OPTIONS: list[tuple[str, type, Any, str]] = [
    ("--duration", float, 10.0, "measured seconds per scenario (default 10)"),
    ("--connections", int, 32, "concurrent keep-alive connections (default 32)"),
    ("--partitions", int, 8, "partitions written round-robin (default 8)"),
    ("--records-100b", int, 50, "records per request with 100 B records (default 50)"),
    ("--records-1k", int, 10, "records per request with 1 KiB records (default 10)"),
    ("--warmup", float, 1.0, "unmeasured seconds before each scenario (default 1)"),
    ("--e2e-duration", float, None,
     "seconds of the produce-to-consume run (default: --duration)"),
    ("--e2e-size", int, 100, "record size of the produce-to-consume run (default 100)"),
    ("--roles", str, "write,read", "LLOG_ROLES of the broker (default write,read: no "
     "compaction, so S3 and Oxia counts are the produce path's alone)"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, text in _OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 2 s per scenario, 0.5 s warm-up")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.warmup = 2.0, 0.5
    if args.duration <= 0 or args.connections < 1 or args.partitions < 1:
        parser.error("--duration, --connections and --partitions must be positive")
    if args.records_100b < 1 or args.records_1k < 1 or args.warmup < 0:
        parser.error("records per request must be at least 1 and --warmup not negative")
    args.e2e_duration = args.e2e_duration or args.duration
    return args


def _forget_llog_environment() -> None:
    """Only the variables this run sets may configure the brokers (they inherit ours)."""
    stray = [k for k in os.environ if k.startswith("LLOG_") and k != "LLOG_BIN_CACHE_DIR"]
    for key in stray:
        del os.environ[key]
    if stray:
        print(f"http_bench: ignoring {', '.join(sorted(stray))} from the environment")


BATCHES = [Batch(2, 4 * MiB), Batch(10, 8 * MiB)]


def scenarios_of(args: argparse.Namespace) -> list[Scenario]:
    """For each record size: the bare app, then the broker with each batch setting."""
    out: list[Scenario] = []
    for size, per_request in ((100, args.records_100b), (KiB, args.records_1k)):
        tag = _size(size).replace(" ", "")
        out.append(Scenario(f"bare-{tag}", "bare", size, per_request))
        for b in BATCHES:
            out.append(Scenario(f"broker-{tag}-{b.delay_ms}ms-{b.max_bytes // MiB}MiB",
                                "broker", size, per_request, b))
    return out


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "duration_s": args.duration, "warmup_s": args.warmup,
        "connections": args.connections, "partitions": args.partitions,
        "records_per_request": {"100": args.records_100b, "1024": args.records_1k},
        "batches": [{"max_delay_ms": b.delay_ms, "max_bytes": b.max_bytes} for b in BATCHES],
        "roles": args.roles, "broker_workers": 1, "oxia_shards": 1,
        "e2e_duration_s": args.e2e_duration, "e2e_record_bytes": args.e2e_size,
        "quick": args.quick,
    }


def run_scenarios(ctx: Ctx, args: argparse.Namespace, results: dict[str, Any]) -> bool:
    """Every scenario, then the produce-to-consume run, into ``results``; True if any
    failed (the others still run)."""
    failed = False
    bare: dict[int, float] = {}
    for sc in scenarios_of(args):
        print(f"http_bench: {sc.name} ({args.duration:g} s)", flush=True)
        try:
            row = run_bare(ctx, sc) if sc.kind == "bare" else run_broker(ctx, sc)
        except (BenchError, ProcessFailed, OSError) as exc:
            failed = True
            print(f"http_bench: {sc.name} failed: {exc}", file=sys.stderr)
            results["rows"].append({"scenario": sc.name, "error": str(exc)})
            continue
        row["label"] = ("bare FastAPI" if sc.kind == "bare"
                        else f"broker {sc.batch.label}" if sc.batch else sc.name)
        if sc.kind == "bare":
            bare[sc.record_bytes] = row["records_per_s"]
        ceiling = bare.get(sc.record_bytes)
        row["pct_of_bare"] = 100 * row["records_per_s"] / ceiling if ceiling else None
        results["rows"].append(row)
    print(f"http_bench: produce-to-consume latency ({args.e2e_duration:g} s)", flush=True)
    try:
        results["e2e"] = run_e2e(ctx, BATCHES[0], args.e2e_size, args.e2e_duration)
    except (BenchError, ProcessFailed, OSError) as exc:
        failed = True
        print(f"http_bench: e2e failed: {exc}", file=sys.stderr)
        results["e2e"] = {"error": str(exc)}
    return failed


def run_on_stack(args: argparse.Namespace, results: dict[str, Any], logdir: Path) -> bool:
    """Oxia and MinIO in a temporary directory for :func:`run_scenarios`; keeps their logs
    in ``logdir`` if anything failed."""
    with tempfile.TemporaryDirectory(prefix="llog-http-bench-") as tmp:
        workdir = Path(tmp)
        print("http_bench: starting Oxia and MinIO", flush=True)
        stack = LocalStack(StackConfig.ephemeral(workdir / "stack"))
        stack.start()
        failed = True
        try:
            ctx = Ctx(stack=stack, logdir=logdir, duration=args.duration,
                      warmup=args.warmup, settle=0.0 if args.quick else 1.0,
                      connections=args.connections, partitions=args.partitions,
                      roles=args.roles)
            failed = run_scenarios(ctx, args, results)
        finally:
            stack.stop()
            if failed:  # the stack's own logs die with the temporary directory
                with contextlib.suppress(OSError):
                    shutil.copytree(workdir / "stack" / "logs", logdir / "stack",
                                    dirs_exist_ok=True)
    return failed


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    os.chdir(ROOT)
    _forget_llog_environment()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    print("http_bench: building the load generator", flush=True)
    build_loadgen()
    machine = machine_info()
    results: dict[str, Any] = {"started_at": stamp, "settings": _settings(args),
                               "machine": machine, "rows": [], "e2e": None}
    logdir = OUT_DIR / f"http-{stamp}-logs"
    try:
        failed = run_on_stack(args, results, logdir)
    except KeyboardInterrupt:
        print(f"http_bench: interrupted; servers stopped; logs in {logdir.relative_to(ROOT)}",
              file=sys.stderr)
        return 130
    except (BenchError, ProcessFailed) as exc:
        print(f"http_bench: {exc}", file=sys.stderr)
        return 1
    if failed:
        print(f"http_bench: logs kept in {logdir.relative_to(ROOT)}", file=sys.stderr)
    else:
        shutil.rmtree(logdir, ignore_errors=True)
    machine["loadavg_end"] = list(os.getloadavg())
    print_report(results)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"http-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nresults: {path.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
