"""Where a produce request's CPU goes in the broker `llog dev` ships, sampled at saturation.

For each row, starts real Oxia and MinIO on free ports and one broker exactly as `llog
dev` runs it (bench/perf.py's ``dev`` kind: app/localstack/dev.py's environment, data dir
on disk, the compactor beside it), creates a 4-partition topic stored uncompressed, and
drives it with the Go load generator (bench/httpload, --connections keep-alive
connections back to back, fewer for large bodies: --inflight-mib) with bodies of 4
partitions x N records x --record-bytes, N from --records (default 25, 256, 1024: bodies
of about 100 KiB, 1 MiB and 4 MiB), binary (LLP1) and JSON. Each row has two windows of
--duration seconds on the same topic:

- plain: the load alone. The broker's CPU (user + system, from /proc/PID/stat and each
  thread's /proc/PID/task/TID/stat) over the window, divided by the MiB of records and
  the requests acknowledged; Oxia's, MinIO's and the compactor's the same way.
- profiled: the same load while py-spy samples the broker (``record --format raw
  --threads --nonblocking``, no --native; every thread it sees running, so the samples
  add up to the CPU /proc counts: with --gil only the thread holding the GIL, which
  leaves out the event loop's system calls). Each sample goes to the first frame from the
  top of its stack that a rule of RULES claims (library frames such as asyncio's
  or json's claim nothing and leave it to their caller); a stack that only the event
  loop's own frames hold is the event loop, one whose top unclaimed frame is none of
  these is ``other`` (its frames are listed).

Then for each format a least-squares line through the plain windows, broker CPU per
request = a + b x MiB per request: a is what a request costs whatever its size, b what a
MiB costs; and the same for each category, from its share of the profiled window's CPU
per request. Each row has a stack of its own because the rows write a few GiB each, and
MinIO answers 507 once the disk is nearly full.

    .venv/bin/python bench/produce_profile.py --py-spy /path/to/py-spy
    .venv/bin/python bench/produce_profile.py --duration 10 --formats binary --records 25

py-spy: `pip install py-spy`, or --py-spy PATH (default: $PY_SPY, then PATH, then the
venv). It measures and prints; it asserts nothing. Results go to
.llog/bench/produce-profile-<time>.json, the raw samples beside it (one file per
profiled window, py-spy's collapsed stacks: a flame graph's input).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import http_bench as hb  # noqa: E402
import perf  # noqa: E402

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
MiB = perf.MiB
PARTITIONS = 4

HTTP = "HTTP parsing, uvicorn protocol"
BODY = "body reading"
ASGI = "ASGI chain (hot lane, middlewares)"
HANDLER = "produce handler's own code"
ENVELOPE = "envelope (parse, columns)"
CHECKS = "checks (limits, topic, auth)"
BATCHING = "batching (batcher, writer, waiters)"
SLICE = "slice building (LLS1 blob)"
CHECKSUM = "checksum (CRC32C)"
COMPRESSION = "compression"
S3 = "S3 PUT"
OXIA = "Oxia write (commit)"
TAIL = "tail cache, watchers"
METRICS = "metrics, logging"
ANSWER = "the answer"
LOOP = "event loop (uvloop, tasks)"
OTHER = "other"
ORDER = [HTTP, BODY, ASGI, HANDLER, ENVELOPE, CHECKS, BATCHING, SLICE, CHECKSUM,
         COMPRESSION, S3, OXIA, TAIL, METRICS, ANSWER, LOOP, OTHER]

# Which frames each category claims: "path prefix" (every function below it) or "path
# prefix:function,function". A rule that names functions wins over one that does not,
# then the longest prefix. Paths are relative to the tree (app/...), to site-packages, or
# to the standard library.
RULES: dict[str, list[str]] = {
    HTTP: ["uvicorn/", "httptools/", "h11/"],
    BODY: ["app/wire/content_encoding.py", "app/routes/produce_body.py:read_decoded",
           "uvicorn/protocols/http/:on_body,receive,on_message_complete",
           "starlette/requests.py"],
    ASGI: ["app/routes/", "app/telemetry/request_id.py", "app/broker/loop_watchdog.py",
           "app/drain.py", "starlette/", "fastapi/"],
    HANDLER: ["app/broker/produce_call.py", "app/routes/produce.py"],
    ENVELOPE: ["app/storage/columnar.py", "app/storage/batch.py", "app/storage/log_record.py",
               "app/wire/produce.py", "app/routes/produce_body.py", "app/routes/models.py",
               "pydantic"],
    CHECKS: ["app/broker/produce_call.py:_check_limits,_check_records,commit_deadline_ms,"
             "_place", "app/routes/access.py", "app/auth/", "app/broker/topic_view.py",
             "app/storage/topic_catalog.py", "app/storage/topic_compression.py",
             "app/broker/roles.py", "app/storage/names.py"],
    BATCHING: ["app/batching/", "app/storage/writer.py", "app/storage/appends.py",
               "app/storage/partition_append.py", "app/broker/appends.py",
               "app/cluster/"],  # affinity: the partition's preferred broker
    SLICE: ["app/storage/codec.py", "app/storage/writer.py:_pack",
            "app/storage/partition_append.py:body",
            "app/storage/batch.py:partition_body,_as_v3,records_size",
            "app/storage/columnar.py:join,join_cuts,cut,_column_bytes,encode,encode_values,"
            "encode_timed,values_columns,encodable,_starts"],
    CHECKSUM: ["app/storage/codec.py:crc32c,verify_body",
               "app/stores/s3/store.py:_crc32c,_checksum", "crc32c/"],
    COMPRESSION: ["app/storage/compression.py", "zstandard/"],
    S3: ["app/stores/s3/", "botocore/", "aiobotocore/", "aiohttp/"],
    OXIA: ["app/storage/writer.py:_commit,_set_state,commit_one,ensure_partition,attempt",
           "app/storage/metadata.py",  # the control and index records, as JSON
           "app/stores/oxia/", "app/storage/cas.py", "app/storage/partition_commit.py",
           "app/storage/control_cache.py", "app/storage/log_positions.py",
           "app/storage/idempotency.py", "app/storage/own_writes.py", "app/storage/keys.py",
           "grpc/", "oxia/", "google/protobuf/", "betterproto"],
    TAIL: ["app/tailcache/", "app/broker/watch.py", "app/broker/positions.py",
           "app/storage/object_cache.py"],
    METRICS: ["app/broker/produce_call.py:done,_count", "app/routes/hot_lane.py:observing_send",
              "prometheus_client/", "prometheus_fastapi_instrumentator/",
              "app/broker/metrics.py", "app/batching/metrics.py", "app/stores/metrics.py",
              "app/telemetry/", "app/observability.py", "logging/"],
    ANSWER: ["app/broker/answers.py", "starlette/responses.py",
             "uvicorn/protocols/http/:send,on_response_complete"],
    # The roots of the loop thread: they claim nothing.
    "": ["uvicorn/server.py:run", "uvicorn/_compat.py", "app/telemetry/workers.py",
         "clients/python/src/llog_client/_cli.py",
         "app/cli.py"],
}


def _rules() -> list[tuple[str, frozenset[str] | None, str]]:
    """RULES as (prefix, functions or None, category), in the order they are tried."""
    out = []
    for category, specs in RULES.items():
        for spec in specs:
            prefix, _, names = spec.partition(":")
            out.append((prefix, frozenset(names.split(",")) if names else None, category))
    return sorted(out, key=lambda r: (r[1] is None, -len(r[0])))


CATEGORIES = _rules()
# Frames that claim nothing: the event loop's and the interpreter's own, and libraries
# a step calls (their time is their caller's).
GENERIC = ("asyncio/", "anyio/", "sniffio/", "uvloop/", "contextlib.py", "selectors.py",
           "functools.py", "typing.py", "dataclasses.py", "enum.py", "abc.py",
           "threading.py", "queue.py", "concurrent/", "weakref.py", "socket.py", "ssl.py",
           "json/", "uuid.py", "base64.py", "struct.py", "copy.py", "collections/",
           "re/", "<frozen", "runpy.py", "app/cli.py", "app/telemetry/workers.py",
           "uvicorn/main.py", "importlib/", "random.py", "secrets.py", "_weakrefset.py",
           "typing_extensions.py", "<string>", "cachetools/")
# Worker threads whose own frames claim nothing, by the name py-spy gives them: the
# oxia package's gRPC channel polls in "Thread-N (_poll_wrapper)".
THREAD_NAMES = {"_poll_wrapper": OXIA, "oxia": OXIA}
# A sample whose top frame is one of these waits (a thread that py-spy saw as running).
WAITS = {("threading.py", "wait"), ("queue.py", "get"), ("selectors.py", "select"),
         ("concurrent/futures/thread.py", "_worker")}


def _stdlib_dir() -> str:
    import sysconfig

    return sysconfig.get_paths()["stdlib"].rstrip("/") + "/"


STDLIB = _stdlib_dir()


# -- samples ----------------------------------------------------------------------------


def frame_of(text: str) -> tuple[str, str]:
    """``function (path[:line])`` of py-spy's raw output as (function, short path)."""
    name, _, rest = text.partition(" (")
    where = rest.rstrip(")").rsplit(":", 1)[0] if rest else ""
    if "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    elif where.startswith(str(ROOT) + "/"):
        where = where[len(str(ROOT)) + 1:]
    elif where.startswith(STDLIB):
        where = where[len(STDLIB):]
    return name, where


def read_samples(path: Path) -> list[tuple[str, list[tuple[str, str]], int]]:
    """py-spy's raw file: (thread, frames from the root to the top, count) per line; the
    thread is py-spy's first frame with --threads, ``thread (TID): NAME``."""
    out = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        thread = ""
        while parts and (parts[0].startswith("thread (") or parts[0].startswith("process ")):
            thread = parts.pop(0) if parts[0].startswith("thread (") else thread
        out.append((thread, [frame_of(p) for p in parts], int(count)))
    return out


def _rule(function: str, where: str) -> str | None:
    """The category a frame is claimed for, "" for a frame that claims nothing, None
    for a frame no rule knows."""
    name = function.rsplit(".", 1)[-1]  # py-spy names methods Class.method
    for prefix, functions, category in CATEGORIES:
        if where.startswith(prefix) and (functions is None or name in functions):
            return category
    return "" if where.startswith(GENERIC) or not where else None


def classify(frames: list[tuple[str, str]]) -> tuple[str, str]:
    """(category, the frame that claimed it) of one stack, from its top frame down."""
    for function, where in reversed(frames):
        category = _rule(function, where)
        if category is None:
            return OTHER, f"{function} ({where})"
        if category:
            return category, f"{function} ({where})"
    top = frames[-1] if frames else ("?", "?")
    return LOOP, f"{top[0]} ({top[1]})"


def on_loop_thread(thread: str) -> bool:
    """Whether py-spy's thread label (``thread (TID): NAME``) is the main thread's, the
    event loop's."""
    return thread.endswith(": MainThread")


def waiting(frames: list[tuple[str, str]]) -> bool:
    """Whether a stack's top frame is a wait (a thread py-spy took as running)."""
    return bool(frames) and (frames[-1][1], frames[-1][0].rsplit(".", 1)[-1]) in WAITS


def breakdown(path: Path, rate: float) -> dict[str, Any]:
    """The samples of one profiled window by category and thread, with the frames that
    claimed them and the top frames of ``other``."""
    by: Counter[tuple[str, str]] = Counter()
    claimed: Counter[str] = Counter()
    tops: Counter[str] = Counter()
    idle = 0
    threads: set[str] = set()
    for thread, frames, count in read_samples(path):
        if waiting(frames):
            idle += count
            continue
        category, frame = classify(frames)
        kind = "loop" if on_loop_thread(thread) else "threads"
        if kind == "threads" and category == LOOP:  # a worker thread's own frames
            category = next((c for n, c in THREAD_NAMES.items() if n in thread), OTHER)
        by[(category, kind)] += count
        claimed[f"{category} <- {frame}"] += count
        if frames:
            tops[f"{frames[-1][0]} ({frames[-1][1]})"] += count
        threads.add(thread)
    total = sum(by.values())
    shares = {c: {k: by[(c, k)] / total if total else 0.0 for k in ("loop", "threads")}
              for c in ORDER}
    return {"samples": total, "idle_samples": idle, "rate_hz": rate,
            "sampled_s": total / rate, "threads_seen": len(threads), "shares": shares,
            "claimed_by": claimed.most_common(40), "top_frames": tops.most_common(25)}


# -- CPU from /proc ---------------------------------------------------------------------


def _stat_cpu(path: Path) -> tuple[str, float]:
    """(comm, user + system seconds) of a /proc stat file."""
    text = path.read_text()
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return comm, (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_of(pid: int) -> dict[str, Any]:
    """The process's CPU seconds, its main thread's, and every other thread's by name."""
    try:
        _, total = _stat_cpu(Path(f"/proc/{pid}/stat"))
    except (OSError, ValueError):
        return {"total": 0.0, "main": 0.0, "threads": {}}
    main = 0.0
    threads: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm, seconds = _stat_cpu(task / "stat")
        except (OSError, ValueError):
            continue  # a thread that ended
        if task.name == str(pid):
            main = seconds
        else:
            threads[comm] = threads.get(comm, 0.0) + seconds
    return {"total": total, "main": main, "threads": threads}


def cpu_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    names = set(before["threads"]) | set(after["threads"])
    return {"total": after["total"] - before["total"], "main": after["main"] - before["main"],
            "threads": {n: after["threads"].get(n, 0.0) - before["threads"].get(n, 0.0)
                        for n in sorted(names)}}


# -- one row ----------------------------------------------------------------------------


def py_spy_command(a: argparse.Namespace, pid: int, seconds: int, out: Path) -> list[str]:
    return [a.py_spy, "record", "--pid", str(pid), "--rate", str(a.rate), "--duration",
            str(seconds), "--format", "raw", "--output", str(out), "--threads",
            "--nonblocking", "--full-filenames", "--nolineno", *(["--gil"] if a.gil else [])]


def window(run: perf.Run, server: perf.Server, load: list[str], profile: Path | None
           ) -> dict[str, Any]:
    """One load generator run against ``server`` with the processes' CPU over it, and
    py-spy sampling the broker into ``profile`` when given."""
    a = run.args
    others = {"compactor": [c.pid for c in server.companions],
              **{k: [v] for k, v in run.stack.pids().items()}}
    before = cpu_of(server.proc.pid)
    others0 = {k: sum(cpu_of(p)["total"] for p in v) for k, v in others.items()}
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    gen = subprocess.Popen([str(hb.LOADGEN_BIN), *load], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    spy = None
    if profile is not None:
        time.sleep(0.5)  # the connections open and the load is on
        spy = subprocess.Popen(py_spy_command(a, server.proc.pid, max(1, int(a.duration) - 1),
                                              profile), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    out, err = gen.communicate(timeout=a.duration * 4 + 120)
    wall = time.monotonic() - t0
    cpu = cpu_delta(before, cpu_of(server.proc.pid))
    others1 = {k: sum(cpu_of(p)["total"] for p in v) for k, v in others.items()}
    spy_out = spy.communicate(timeout=120)[0] if spy is not None else ""
    if gen.returncode != 0:
        raise hb.BenchError(f"the load generator failed: {err.strip()[-500:]}")
    if spy is not None and spy.returncode != 0:
        raise hb.BenchError(f"py-spy failed: {spy_out.strip()[-500:]}")
    return {"load": json.loads(out), "wall_s": wall, "cpu": cpu, "loadavg_1m": load0,
            "others_cpu_s": {k: others1[k] - others0[k] for k in others}}


def figures(w: dict[str, Any]) -> dict[str, Any]:
    """A window's throughput and the CPU per MiB and per request of each process."""
    load, wall, cpu = w["load"], w["wall_s"], w["cpu"]
    mib = load["bytes_acked"] / MiB
    ok = load["ok"]
    return {"mib_per_s": load["mib_per_s"], "requests_per_s": load["requests_per_s"],
            "records_per_s": load["records_per_s"], "p50_ms": load["latency_ms"]["p50_ms"],
            "p99_ms": load["latency_ms"]["p99_ms"], "ok": ok, "mib": mib,
            "status_503": load["status_503"],
            "errors": load["errors"] + load["other_status"], "statuses": load["statuses"],
            "error_samples": load["error_samples"][:5],
            "broker_cores": cpu["total"] / wall, "loop_thread_cores": cpu["main"] / wall,
            "broker_ms_per_mib": cpu["total"] * 1e3 / mib if mib else None,
            "loop_ms_per_mib": cpu["main"] * 1e3 / mib if mib else None,
            "broker_ms_per_request": cpu["total"] * 1e3 / ok if ok else None,
            "others_ms_per_mib": {k: v * 1e3 / mib if mib else None
                                  for k, v in w["others_cpu_s"].items()},
            "threads_cpu_s": cpu["threads"], "loadavg_1m": w["loadavg_1m"]}


def measure_row(run: perf.Run, server: perf.Server, fmt: str, records: int, raw: Path
                ) -> dict[str, Any]:
    """A fresh uncompressed topic, written for a moment, then the plain window and the
    profiled one."""
    a = run.args
    shape = (PARTITIONS, records, a.record_bytes)
    topic = f"prof-{fmt}-{records}-{uuid.uuid4().hex[:6]}"
    hb.create_topic(server.url, topic, PARTITIONS, compression="none")
    perf.warm(server, shape, fmt, topic, seconds=a.warmup)
    body_mib = PARTITIONS * records * a.record_bytes / MiB
    conns = (min(a.connections, max(1, int(a.inflight_mib / body_mib))) if a.inflight_mib
             else a.connections)
    load = perf.load_args(server.url, topic, shape, fmt, a.duration, conns)
    plain = window(run, server, load, None)
    profile = raw / f"{fmt}-{records}.txt"
    profiled = window(run, server, load, profile)
    body = plain["load"]["request_body_bytes"]
    return {"format": fmt, "records_per_partition": records, "shape": shape,
            "connections": conns, "request_body_bytes": body, "record_mib_per_request": body_mib,
            "plain": figures(plain), "profiled": figures(profiled),
            "profile": breakdown(profile, a.rate), "raw": str(profile)}


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def fit(rows: list[dict[str, Any]], fmt: str) -> dict[str, Any] | None:
    """Broker CPU per request = a + b x MiB per request, least squares over the plain
    windows of ``fmt``: a in ms per request, b in ms per MiB; and the same for each
    category, from its share of the profiled window's CPU per request."""
    mine = [r for r in rows if r["format"] == fmt and r["plain"]["broker_ms_per_request"]
            and r["profiled"]["broker_ms_per_request"]]
    if len(mine) < 2:
        return None
    points = [(r["record_mib_per_request"], r["plain"]["broker_ms_per_request"])
              for r in mine]
    a, b = line(points)
    steps = {}
    for category in ORDER:
        a_c, b_c = line([(r["record_mib_per_request"], r["profiled"]["broker_ms_per_request"]
                          * sum(r["profile"]["shares"][category].values())) for r in mine])
        steps[category] = {"ms_per_request": a_c, "ms_per_mib": b_c}
    return {"format": fmt, "ms_per_request": a, "ms_per_mib": b, "points": points,
            "residuals_ms": [y - (a + b * x) for x, y in points], "steps": steps}


# -- report -----------------------------------------------------------------------------


def _label(row: dict[str, Any]) -> str:
    return f"{row['format'][:3]} {row['request_body_bytes'] / 1024:,.0f}K"


def print_rows(results: dict[str, Any]) -> None:
    s = results["settings"]
    print(f"\nProduce at saturation, `llog dev`'s broker as shipped, {s['connections']} "
          f"connections (at most {s['inflight_mib']:g} MiB in flight), {PARTITIONS} "
          f"partitions x N x {s['record_bytes']} B records per request, topics "
          f"uncompressed, {s['duration']:.0f} s per window; commit {results['commit']}, "
          f"{results['machine']['nproc']} CPUs")
    print(f"{'row':>10} {'N':>5} {'conns':>5} {'window':>8} {'req/s':>7} {'MiB/s':>7} "
          f"{'p99 ms':>7} {'fails':>5} {'brk cores':>9} {'loop cores':>10} {'ms/MiB':>7} "
          f"{'loop ms/MiB':>11} {'ms/req':>7} {'Oxia ms/MiB':>11} {'MinIO ms/MiB':>12} {'load':>5}")
    for r in results["rows"]:
        for name in ("plain", "profiled"):
            f = r[name]
            o = f["others_ms_per_mib"]
            print(f"{_label(r):>10} {r['records_per_partition']:>5} {r['connections']:>5} "
                  f"{name:>8} "
                  f"{f['requests_per_s']:>7,.0f} {f['mib_per_s']:>7.1f} {f['p99_ms']:>7.1f} "
                  f"{f['status_503'] + f['errors']:>5} {f['broker_cores']:>9.2f} "
                  f"{f['loop_thread_cores']:>10.2f} {perf._f(f['broker_ms_per_mib'], '.2f', 7)} "
                  f"{perf._f(f['loop_ms_per_mib'], '.2f', 11)} "
                  f"{perf._f(f['broker_ms_per_request'], '.2f', 7)} "
                  f"{perf._f(o.get('oxia'), '.2f', 11)} {perf._f(o.get('minio'), '.2f', 12)} "
                  f"{f['loadavg_1m']:>5.2f}")
    for line in results["fits"]:
        print(f"fit {line['format']}: broker CPU per request = {line['ms_per_request']:.3f} ms "
              f"+ {line['ms_per_mib']:.2f} ms x MiB of records (residuals "
              + ", ".join(f"{x:+.3f}" for x in line["residuals_ms"]) + " ms)")


def print_profile(results: dict[str, Any]) -> None:
    rows = results["rows"]
    seen = "GIL holder only" if results["settings"]["gil"] else "running threads"
    print(f"\nShares of the py-spy samples ({seen}; loop thread + other threads), and as "
          "ms of broker CPU per MiB (share x the profiled window's ms/MiB)")
    print(f"{'category':<36}" + "".join(f"{_label(r):>16}" for r in rows))
    for category in ORDER:
        cells = []
        for r in rows:
            sh = r["profile"]["shares"][category]
            total = sh["loop"] + sh["threads"]
            per_mib = (r["profiled"]["broker_ms_per_mib"] or 0.0) * total
            cells.append(f"{total * 100:>8.1f}% {per_mib:>6.2f}")
        print(f"{category:<36}" + "".join(cells))
    print(f"{'  of which other threads':<36}" + "".join(
        f"{sum(v['threads'] for v in r['profile']['shares'].values()) * 100:>8.1f}%{'':>7}"
        for r in rows))
    print(f"{'samples (s of GIL/CPU seen)':<36}" + "".join(
        f"{r['profile']['samples']:>9,} {r['profile']['sampled_s']:>5.1f}s" for r in rows))
    fits = results["fits"]
    print("\nEach step as a + b x MiB (its share of the profiled CPU per request, fitted "
          "over the sizes): a in µs per request, b in ms per MiB")
    print(f"{'category':<36}" + "".join(f"{f['format'] + ' a µs':>12}{'b ms/MiB':>10}"
                                        for f in fits))
    for category in ORDER:
        print(f"{category:<36}" + "".join(
            f"{f['steps'][category]['ms_per_request'] * 1e3:>12.0f}"
            f"{f['steps'][category]['ms_per_mib']:>10.2f}" for f in fits))
    first = rows[0]["profile"]
    print(f"\nTop frames of {_label(rows[0])} (category <- the frame that claimed it):")
    for frame, count in first["claimed_by"][:15]:
        print(f"  {count / first['samples'] * 100:5.1f}%  {frame}")


# -- main -------------------------------------------------------------------------------


def find_py_spy(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("PY_SPY"), shutil.which("py-spy"),
                      str(Path(sys.executable).parent / "py-spy")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


# --option: (type, default, help); a bool default is a --option/--no-option switch.
OPTIONS: dict[str, tuple[type, Any, str]] = {
    "duration": (float, 15.0, "seconds of each window (plain, then profiled)"),
    "warmup": (float, 2.0, "seconds of load on each new topic before its windows"),
    "connections": (int, 32, "the load generator's connections"),
    "inflight-mib": (float, 48.0, "fewer connections for large bodies, so that at most this "
                                  "many MiB of records are in flight (the shipped "
                                  "LLOG_BATCH_BUFFER_MAX_BYTES is 64 MiB: past it the broker "
                                  "answers 503); 0: --connections for every size"),
    "records": (str, "25,256,1024", "records per partition per request (comma-separated)"),
    "record-bytes": (int, 1024, "bytes of each record"),
    "formats": (str, "binary,json", "request bodies: binary (LLP1), json"),
    "rate": (int, 100, "py-spy samples per second"),
    "gil": (bool, False, "sample only the thread holding the GIL (default: every thread "
                         "py-spy sees running, which adds up to the CPU /proc counts)"),
    "py-spy": (str, None, "the py-spy binary"),
    "reanalyse": (str, None, "no run: sort the raw samples of an earlier run's JSON again "
                             "(after a change to RULES) and print it"),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, (kind, default, text) in OPTIONS.items():
        if kind is bool:
            parser.add_argument(f"--{name}", action=argparse.BooleanOptionalAction,
                                default=default, help=text)
        else:
            parser.add_argument(f"--{name}", type=kind, default=default, help=text)
    args = parser.parse_args()
    args.records = [int(n) for n in str(args.records).split(",")]
    args.formats = str(args.formats).split(",")
    return args


def _commit() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--", "app") else ""
    return git("rev-parse", "--short", "HEAD") + dirty


def on_fresh_stack(args: argparse.Namespace, fmt: str, records: int, raw: Path
                   ) -> dict[str, Any]:
    """One row on a stack and broker of its own: each row starts from the same state
    (no compaction backlog, no objects of the rows before it), and a row's objects (a
    few GiB at 200 MiB/s) go with its stack before the next row writes."""
    with tempfile.TemporaryDirectory(prefix="llog-profile-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        run = perf.Run(args, stack, Path(tmp) / "logs")
        try:
            server = perf.start_kind(run, "dev", "profile")
            return measure_row(run, server, fmt, records, raw)
        finally:
            run.stop()
            stack.stop()


def run_all(args: argparse.Namespace, raw: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for fmt in args.formats:
        for records in args.records:
            rows.append(on_fresh_stack(args, fmt, records, raw))
            print(f"  {fmt} x {records}: {rows[-1]['plain']['mib_per_s']:.1f} MiB/s",
                  file=sys.stderr)
    return rows


def reanalyse(path: Path) -> int:
    results = json.loads(path.read_text())
    for row in results["rows"]:
        row["profile"] = breakdown(Path(row["raw"]), row["profile"]["rate_hz"])
    rows = results["rows"]
    results["fits"] = [f for f in (fit(rows, x) for x in results["settings"]["formats"]) if f]
    path.write_text(json.dumps(results, indent=2, default=str))
    print_rows(results)
    print_profile(results)
    return 0


def main() -> int:
    args = parse_args()
    if args.reanalyse:
        return reanalyse(Path(args.reanalyse))
    args.py_spy = find_py_spy(args.py_spy)
    if args.py_spy is None:
        print("produce_profile.py: no py-spy (pip install py-spy, or --py-spy PATH)",
              file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, perf._terminate)
    hb.build_loadgen()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    raw = hb.OUT_DIR / f"produce-profile-{started}"
    raw.mkdir(parents=True, exist_ok=True)
    machine = hb.machine_info()
    rows = run_all(args, raw)
    results = {"settings": vars(args), "commit": _commit(),
               "broker": perf.BROKER_KINDS["dev"],
               "machine": {**machine, "loadavg_end": list(os.getloadavg())},
               "py_spy": subprocess.run([args.py_spy, "--version"], capture_output=True,
                                        text=True, check=False).stdout.strip(),
               "rows": rows, "fits": [f for f in (fit(rows, x) for x in args.formats) if f]}
    out = hb.OUT_DIR / f"produce-profile-{started}.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    print_rows(results)
    print_profile(results)
    print(f"\nresults: {out}\nraw samples: {raw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
