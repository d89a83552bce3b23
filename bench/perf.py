"""The broker against the ceiling of its HTTP layer, measured in one run.

Starts real Oxia and MinIO on free ports, the ceiling app (bench/ceiling_app.py: FastAPI
and uvicorn as the broker runs them, orjson, every record walked, no storage), the floor
app (bench/floor_app.py: the ceiling plus the storage steps a durable produce or a
catch-up read needs, with the broker's own storage clients and nothing else) and
`llog serve` brokers (one process, one uvicorn worker each), and drives them with the Go
load generator (bench/httpload). Sections, each printed as a table with its settings:

- storage: the storage ceiling (bench/storage_ceiling.py): S3 PUTs of a flush's sizes
  and Oxia writes through the broker's own clients, with no broker running.
- produce: JSON and binary (LLP1) produce against the JSON ceiling for the same records,
  in two request shapes (4 partitions x 25 records x 1 KiB, 4 x 250 x 100 B), plus the
  largest binary shape for records per second, with the floor's rows beside them;
  server CPU per request from /proc, and the whole machine's CPU (box CPU: the load
  generator, MinIO and Oxia share the same cores).
  Then the brokers users run, one at a time and alternating at each connection count,
  4 x 25 x 1 KiB JSON and binary: the tuned broker, `llog dev` as shipped and the
  Kubernetes reference, their settings taken from what ships (bench/shipped.py).
- records: what keys and headers cost: JSON produce of the same values plain, with a
  16-byte key, and with a key and two headers.
- catchup: one partition of --catchup-mib MiB (1 KiB records, written with binary
  produce) read from offset 1 as fast as the broker answers, JSON and binary (LLR1),
  against the ceiling serving answers of the same size from memory and the floor reading
  them from S3 (binary, one GET per answer, one ahead); then the partition is compacted
  (`llog compact-once` until nothing is left) and read again. Then catch-up as users
  meet it: a 4-partition topic written 4 x 25 x 1 KiB binary per request, read by one
  client (the Go load generator; the same with a quarter of each request's bytes per
  partition, as Kafka's consumers fetch; one Python client) asking for all 4 partitions
  in every request, binary answers: fresh (WAL objects), then compacted.
- latency: a second broker; produce to one, long-poll the other, paced at a quarter of
  the measured maximum; produce and produce-to-consume percentiles against the batch
  window.
- cost: how Oxia and S3 requests grow with partitions per flush (1, 16, 256) and with
  brokers on one stack (1, 2, 3), and how flushes behave under saturation. Then brokers
  behind Caddy as `llog dev --brokers N` runs them (bench/scale_out.py's rows, its code):
  1, 2, 3 brokers and one broker with 2 workers, each with affinity off and forward (and
  off at --baseline), --scale-out-duration seconds each (0 leaves them out).
- compression: per corpus of bench/corpus.py (JSON events, access-log lines, random
  bytes) and per topic codec (--codecs: none, zstd[:LEVEL]; with --baseline, none at
  that revision too), a broker on a key space of its own: produce (4 partitions, about
  25 KiB of records per entry, binary, the records from the corpus), catch-up of all of
  it fresh and after compaction; MiB/s of records, bytes stored per record and the
  ratio (listed from MinIO), broker and MinIO CPU, S3 PUTs, GETs and Oxia requests per
  MiB (the inputs of bench/cost_model.py). A broker that does not know the topic
  setting `compression` (its 400 or 422 names the field) refuses the rows of codecs
  other than none, by name.
- peer (not by default): Kafka 4.3.1 and llog one after the other, same records:
  produce (records of each --record-sizes, back to back, then paced at --peer-pace of
  each producer's figure for latency) and catch-up (fresh and compacted), llog_client's
  producers and consumers beside confluent-kafka's, aiokafka's and the Go load
  generator's on the same broker, each client's CPU per record (bench/peer.py; needs
  Java, Maven, confluent-kafka, aiokafka).

    .venv/bin/python bench/perf.py [--quick] [--sections storage,produce,records,...]
    .venv/bin/python bench/perf.py --sections peer [--quick]
    .venv/bin/python bench/perf.py --sections peer --peer-broker dev --catchup-mib 256

It measures and prints; it asserts nothing. Results also go to .llog/bench/perf-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import baseline  # noqa: E402
import http_bench as hb  # noqa: E402
import peer  # noqa: E402
import scale_out  # noqa: E402
import shipped  # noqa: E402
import storage_ceiling  # noqa: E402

from app.localstack.broker import broker_process, wait_healthy  # noqa: E402
from app.localstack.dev import SHIPPED_COMPRESSION, start_compactor  # noqa: E402
from app.localstack.processes import ManagedProcess, free_port  # noqa: E402
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402

MiB = 1024 * 1024
SHAPES = [(4, 25, 1024), (4, 250, 100)]  # entries x records x bytes per request
MAX_SHAPE = (4, 1000, 100)


@dataclass
class Server:
    name: str
    url: str
    proc: ManagedProcess
    metrics: bool  # a broker answers GET /metrics
    scratch: Path | None = None  # removed when the server stops (a tmpfs tail cache)
    # Processes that run beside it and stop with it (the compactor of `llog dev`).
    companions: list[ManagedProcess] = field(default_factory=list)


@dataclass
class Run:
    args: argparse.Namespace
    stack: LocalStack
    logs: Path
    servers: list[Server] = field(default_factory=list)
    # --baseline: a worktree of that revision and its short hash (bench/baseline.py)
    baseline: tuple[Path, str] | None = None

    def stop(self) -> None:
        for server in self.servers:
            server.proc.stop(timeout=20)
            for companion in server.companions:
                companion.stop(timeout=20)
            if server.scratch is not None:
                shutil.rmtree(server.scratch, ignore_errors=True)


def _serve(run: Run, server: Server) -> Server:
    server.proc.start()
    wait_healthy(server.proc, server.url, timeout=60)
    run.servers.append(server)
    return server


def start_ceiling(run: Run, record_bytes: int) -> Server:
    port = free_port()
    proc = ManagedProcess(
        f"ceiling-{record_bytes}",
        [sys.executable, str(ROOT / "bench" / "ceiling_app.py"), "--port", str(port),
         "--record-bytes", str(record_bytes)],
        run.logs / f"ceiling-{record_bytes}.log", env={**os.environ}, cwd=ROOT)
    return _serve(run, Server(proc.name, f"http://127.0.0.1:{port}", proc, metrics=False))


def start_floor(run: Run) -> Server:
    """bench/floor_app.py on this run's stack, with the brokers' batch window."""
    port = free_port()
    proc = ManagedProcess(
        "floor", [sys.executable, str(ROOT / "bench" / "floor_app.py"), "--port", str(port),
                  "--window-ms", str(run.args.window_ms),
                  "--fetch-bytes", str(run.args.fetch_bytes)],
        run.logs / "floor.log", env={**os.environ, **run.stack.settings_env()}, cwd=ROOT)
    return _serve(run, Server(proc.name, f"http://127.0.0.1:{port}", proc, metrics=False))


def tuned_env(run: Run, name: str) -> dict[str, str]:
    return {**run.stack.settings_env(), "LLOG_BROKER_ID": f"perf-{name}",
            "LLOG_ROLES": "write,read", "LLOG_DRAIN_S": "0",
            "LLOG_BATCH_MAX_DELAY_MS": str(run.args.window_ms)}


def start_broker(run: Run, name: str, *, base: bool = False, **settings: str) -> Server:
    """The tuned broker; with ``base``, of the --baseline revision."""
    env = tuned_env(run, name)
    env.update({f"LLOG_{k.upper()}": v for k, v in settings.items()})
    return _launch(run, name, env, base=base)


def _launch(run: Run, name: str, env: dict[str, str], *, base: bool = False,
            scratch: Path | None = None) -> Server:
    port = free_port()
    log = run.logs / f"broker-{name}.log"
    if base:
        assert run.baseline is not None, "--baseline was not given"
        tree = run.baseline[0]
        proc = ManagedProcess(f"broker-{name}", baseline.serve_command(tree, port), log,
                              env=baseline.environment(tree, env), cwd=tree)
    else:
        proc = broker_process(f"broker-{name}", port, env, log)
    try:
        return _serve(run, Server(proc.name, f"http://127.0.0.1:{port}", proc,
                                  metrics=True, scratch=scratch))
    except BaseException:
        proc.stop(timeout=20)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise


# The brokers users run (bench/shipped.py): their settings come from what ships.
BROKER_KINDS = {
    "tuned": "this benchmark's broker: roles write,read, batch window --window-ms",
    "dev": "`llog dev` as shipped (app/localstack/dev.py), data dir on disk, with the "
           "compactor it runs beside the broker (a --baseline revision's broker alone)",
    "k8s": "the Kubernetes reference (deploy/k8s/base), tail cache on tmpfs, auth off",
}


def kinds(run: Run) -> list[str]:
    """The kinds measured: BROKER_KINDS, and each again as the --baseline revision
    ships it (``dev@base``...)."""
    return [*BROKER_KINDS, *([f"{k}@base" for k in BROKER_KINDS] if run.baseline else [])]


def key_space(kind: str, space: str) -> dict[str, str]:
    """The settings that put a ``kind`` broker (and ``llog compact-once``) in the key
    space ``space``: `llog dev`'s brokers have one each (``start_kind``), the others
    share the stack's."""
    return {"LLOG_ROOT_PREFIX": f"perf-{space}"} if kind.partition("@")[0] == "dev" else {}


def start_kind(run: Run, kind: str, name: str, *, space: str | None = None,
               compactor: bool = True) -> Server:
    """A broker of ``kind`` (BROKER_KINDS): the tuned one, or as ``llog dev`` or the
    Kubernetes reference configure it; ``kind@base``: the same, of the --baseline
    revision with that revision's settings (its dev.py and its deploy/k8s files).
    ``space``: the key space of an earlier broker of that name, to read what it wrote
    (`llog dev`'s; default: one of its own); ``compactor`` off: `llog dev`'s broker
    without the compactor beside it (a read that must meet what was written)."""
    kind, _, suffix = kind.partition("@")
    base = suffix == "base"
    tree = run.baseline[0] if base and run.baseline else ROOT
    scratch = None
    if kind == "tuned":
        env = tuned_env(run, name)
    elif kind == "dev":
        # As `llog dev --data-dir` has it: a directory of the run, on the run's disk.
        data_dir = run.logs.parent / f"dev-{name}"
        env = (baseline.dev_env(tree, run.stack.settings_env(), data_dir) if base
               else shipped.dev_broker_env(run.stack, data_dir))
        # A key space of its own, as a developer's `llog dev` stack holds only their own
        # data: its compactor must not compact what the rows before it wrote.
        own = key_space(kind, space or name)
        env.update({"LLOG_DRAIN_S": "0", "LLOG_BROKER_ID": f"perf-{name}", **own})
        if not base and compactor:  # and its compactor beside it, as `llog dev` runs them
            server = _launch(run, name, env)
            compactor, url = start_compactor(run.stack, data_dir, env=own)
            server.companions.append(compactor)
            wait_healthy(compactor, url)
            return server
    elif kind == "k8s":
        scratch = shipped.tmpfs_dir("llog-perf-k8s-tail-")  # the emptyDir, medium Memory
        env = shipped.k8s_broker_env(run.stack, scratch,
                                     base=tree / "deploy" / "k8s" / "base")
    else:
        raise ValueError(f"no broker kind {kind!r}")
    return _launch(run, name, env, base=base, scratch=scratch)


def create_topic(server: Server, topic: str, partitions: int) -> None:
    """Create the topic (the Kubernetes reference does not create topics on first use)."""
    hb.create_topic(server.url, topic, partitions)


def stop_server(run: Run, server: Server) -> None:
    server.proc.stop(timeout=20)
    for companion in server.companions:
        companion.stop(timeout=20)
    run.servers.remove(server)
    if server.scratch is not None:
        shutil.rmtree(server.scratch, ignore_errors=True)


# -- one measured load -----------------------------------------------------------------


def load_args(url: str, topic: str, shape: tuple[int, int, int], fmt: str, seconds: float,
              connections: int, partitions: int | None = None) -> list[str]:
    entries, records, size = shape
    return ["-mode", "throughput", "-url", url, "-topic", topic, "-format", fmt,
            "-connections", str(connections), "-partitions", str(partitions or entries),
            "-entries", str(entries), "-records", str(records), "-size", str(size),
            "-duration", f"{seconds}s", "-timeout", "30s"]


def measure(run: Run, servers: list[Server], per_server_args: list[list[str]]
            ) -> dict[str, Any]:
    """Run one load generator per server at once; figures summed over the servers."""
    import subprocess

    befores = [hb.get_json(f"{s.url}/metrics") if s.metrics else {} for s in servers]
    cpu0 = [hb.cpu_seconds(s.proc.pid) for s in servers]
    box0 = hb.box_busy_seconds()
    t0 = time.monotonic()
    procs = [subprocess.Popen([str(hb.LOADGEN_BIN), *a], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in per_server_args]
    loads = []
    for p in procs:
        out, err = p.communicate(timeout=run.args.duration * 4 + 120)
        if p.returncode != 0:
            raise hb.BenchError(f"the load generator failed: {err.strip()[-500:]}")
        loads.append(json.loads(out))
    wall = time.monotonic() - t0
    box = hb.box_busy_seconds() - box0
    afters = [hb.get_json(f"{s.url}/metrics") if s.metrics else {} for s in servers]
    cpu = sum(hb.cpu_seconds(s.proc.pid) - c for s, c in zip(servers, cpu0, strict=True))
    requests = sum(x["ok"] for x in loads)
    row: dict[str, Any] = {
        "records_per_s": sum(x["records_per_s"] for x in loads),
        "mib_per_s": sum(x["mib_per_s"] for x in loads),
        "requests_per_s": sum(x["requests_per_s"] for x in loads),
        "p50_ms": max(x["latency_ms"]["p50_ms"] for x in loads),
        "p99_ms": max(x["latency_ms"]["p99_ms"] for x in loads),
        "errors": sum(x["errors"] + x["other_status"] + x["status_503"] for x in loads),
        "server_cpu_cores": cpu / wall,
        # Every process on the machine: the load generator, MinIO and Oxia included.
        "box_cpu_cores": box / wall,
        "cpu_us_per_request": cpu / requests * 1e6 if requests else None,
        "loads": loads,
    }
    if all(s.metrics for s in servers):
        deltas = [hb.metric_deltas(b, a) for b, a in zip(befores, afters, strict=True)]
        total = {k: sum(d.get(k, 0.0) for d in deltas) for k in deltas[0]}
        flushes = total["flushes"]
        row.update({
            "flushes_per_s": flushes / wall,
            "records_per_flush": total["produce_records"] / flushes if flushes else None,
            "partitions_per_flush": total["flush_partitions"] / flushes if flushes else None,
            "oxia_requests_per_flush": total["oxia_requests"] / flushes if flushes else None,
            "s3_requests_per_flush": total["s3_requests"] / flushes if flushes else None,
            "oxia_requests_per_s": total["oxia_requests"] / wall,
            "s3_puts_per_s": total["s3_put"] / wall,
        })
    return row


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def warm(server: Server, shape: tuple[int, int, int], fmt: str, topic: str,
         partitions: int | None = None, seconds: float = 1.0) -> None:
    """Write to the topic first: it exists, and the broker has touched its partitions
    (the first write to a partition initialises it and registers it in the catalog)."""
    hb.run_loadgen(load_args(server.url, topic, shape, fmt, seconds, 8, partitions),
                   timeout=120)


# -- sections --------------------------------------------------------------------------


def produce_section(run: Run) -> list[dict[str, Any]]:
    a = run.args
    rows = []
    broker = start_broker(run, "produce")
    floor = start_floor(run)
    try:
        for shape in [*SHAPES, MAX_SHAPE]:
            ceiling = start_ceiling(run, shape[2])
            try:
                targets = ([("ceiling", ceiling, "json", a.connections)]
                           if shape != MAX_SHAPE else [])
                # The least a durable produce costs here (bench/floor_app.py).
                targets += ([("floor", floor, fmt, conns) for conns in a.broker_connections
                             for fmt in ("json", "binary")] if shape != MAX_SHAPE else [])
                # The broker batches: its throughput grows with the requests in flight.
                targets += [("broker", broker, fmt, conns) for conns in a.broker_connections
                            for fmt in ("json", "binary")]
                for kind, server, fmt, conns in targets:
                    rows.append(produce_row(run, "produce", kind, server, shape, fmt, conns))
            finally:
                stop_server(run, ceiling)
    finally:
        stop_server(run, floor)
        stop_server(run, broker)
    for row in rows:
        ceiling_row = next((r for r in rows if r["target"] == "ceiling"
                            and r["shape"][2] == row["shape"][2]), None)
        if ceiling_row and ceiling_row["records_per_s"]:
            row["ratio"] = row["records_per_s"] / ceiling_row["records_per_s"]
    return rows + shipped_rows(run)


def produce_row(run: Run, section: str, kind: str, server: Server,
                shape: tuple[int, int, int], fmt: str, conns: int, *, create: bool = False
                ) -> dict[str, Any]:
    """One closed-loop produce row against ``server`` on a new topic (created first with
    ``create``: a broker may not create topics on first use)."""
    topic = _topic("u" if create else "p")
    if create:
        create_topic(server, topic, shape[0])
    warm(server, shape, fmt, topic)
    row = measure(run, [server], [load_args(server.url, topic, shape, fmt,
                                            run.args.duration, conns)])
    return {"section": section, "target": kind, "format": fmt, "shape": shape,
            "connections": conns, **row}


def shipped_rows(run: Run) -> list[dict[str, Any]]:
    """The tuned broker, `llog dev` as shipped and the Kubernetes reference, one after
    the other at each connection count (so each kind meets the same machine), 4 x 25 x
    1 KiB per request. One broker runs at a time: dev's compactor (a --baseline dev
    broker's in-process compaction) must not run while another kind is measured."""
    a = run.args
    shape = SHAPES[0]
    rows: list[dict[str, Any]] = []
    for conns in a.broker_connections:
        for kind in kinds(run):
            server = start_kind(run, kind, f"{kind.replace('@', '-')}-{conns}")
            try:
                for fmt in ("json", "binary"):
                    rows.append(produce_row(run, "shipped", kind, server, shape, fmt, conns,
                                            create=True))
            finally:
                stop_server(run, server)
    for row in rows:
        same = "tuned@base" if row["target"].endswith("@base") else "tuned"  # same revision
        tuned = next(r for r in rows if r["target"] == same
                     and r["format"] == row["format"] and r["connections"] == row["connections"])
        row["ratio"] = row["records_per_s"] / tuned["records_per_s"] if tuned[
            "records_per_s"] else None
    return rows


RECORD_KINDS = [("values", []), ("key 16 B", ["-key-bytes", "16"]),
                ("key + 2 headers", ["-key-bytes", "16", "-headers", "2"])]


def records_section(run: Run) -> list[dict[str, Any]]:
    """What keys and headers cost: JSON produce of the same values with and without."""
    a = run.args
    rows = []
    broker = start_broker(run, "records")
    try:
        for shape in SHAPES:
            for kind, extra in RECORD_KINDS:
                topic = _topic("r")
                warm(broker, shape, "json", topic)
                row = measure(run, [broker], [load_args(
                    broker.url, topic, shape, "json", a.duration, a.connections) + extra])
                rows.append({"section": "records", "kind": kind, "shape": shape, **row})
    finally:
        stop_server(run, broker)
    for row in rows:
        plain = next(r for r in rows if r["shape"] == row["shape"] and r["kind"] == "values")
        row["ratio"] = row["records_per_s"] / plain["records_per_s"]
    return rows


def catchup_section(run: Run) -> list[dict[str, Any]]:
    a = run.args
    broker = start_broker(run, "catchup")
    ceiling = start_ceiling(run, 1024)
    floor = start_floor(run)
    topic = _topic("c")
    rows: list[dict[str, Any]] = []
    try:
        filled = hb.run_loadgen(
            [*load_args(broker.url, topic, (1, 256, 1024), "binary", 3600, 8, 1),
             "-total-mib", str(a.catchup_mib)], timeout=3600)
        rows.append({"section": "catchup", "target": "fill", "format": "binary",
                     "mib": filled["bytes_acked"] / MiB, "mib_per_s": filled["mib_per_s"]})
        for kind, server in (("ceiling", ceiling), ("floor", floor), ("broker", broker),
                             ("compacted", broker)):
            if kind == "compacted":
                rows.append(compact_all(run, topic))
            # The floor reads stored bodies and sends them: binary answers only.
            for fmt in ("binary",) if kind == "floor" else ("binary", "json"):
                rows.append(catchup_row(run, server, kind, fmt, topic))
    finally:
        stop_server(run, floor)
        stop_server(run, ceiling)
        stop_server(run, broker)
    for row in rows:
        ref = next((r for r in rows if r["target"] == "ceiling"
                    and r["format"] == row.get("format")), None)
        if row["target"] in ("floor", "broker", "compacted") and ref and ref["mib_per_s"]:
            row["ratio"] = row["mib_per_s"] / ref["mib_per_s"]
    return rows + users_catchup_rows(run)


def users_catchup_rows(run: Run) -> list[dict[str, Any]]:
    """Catch-up as users meet it: a topic of 4 partitions written as users write it (4 x
    25 x 1 KiB binary per request), read by one client asking for all 4 partitions in
    every request (binary answers, --fetch-bytes): fresh, right after it was written
    (nothing compacted: the reader meets WAL objects), then after compacting every
    partition. The Go load generator (the partitions sharing each request's budget in
    request order, then with a quarter each) and one plain Python client read; the broker
    restarts before each read, so no read starts with objects another one cached."""
    a = run.args
    topic = _topic("cu")
    rows: list[dict[str, Any]] = []
    broker = start_broker(run, "users-fill")
    try:
        create_topic(broker, topic, SHAPES[0][0])
        filled = hb.run_loadgen(
            [*load_args(broker.url, topic, SHAPES[0], "binary", 3600, a.connections),
             "-total-mib", str(a.catchup_mib)], timeout=3600)
    finally:
        stop_server(run, broker)
    rows.append({"section": "catchup4", "target": "fill", "format": "binary",
                 "mib": filled["bytes_acked"] / MiB, "mib_per_s": filled["mib_per_s"]})
    for state in ("fresh", "compacted"):
        if state == "compacted":
            rows.append({**compact_all(run, topic, range(SHAPES[0][0])),
                         "section": "catchup4"})
        for reader in peer.READERS:
            for base in (False, True) if run.baseline else (False,):
                broker = start_broker(run, f"users-{state}-{reader}{'-base' * base}",
                                      base=base)
                try:
                    cpu0 = hb.cpu_seconds(broker.proc.pid)
                    out = peer.timed(functools.partial(
                        peer.read, broker.url, topic, reader, a.catchup_mib, a.fetch_bytes))
                    cpu = (hb.cpu_seconds(broker.proc.pid) - cpu0) / out["seconds"]
                finally:
                    stop_server(run, broker)
                rows.append({"section": "catchup4", "target": state, "reader": reader,
                             "broker": "base" if base else "this", "format": "binary",
                             "server_cpu_cores": cpu, **out})
    for row in rows:
        if row["target"] == "fresh":
            done = next(r for r in rows if r["target"] == "compacted"
                        and r["reader"] == row["reader"] and r["broker"] == row["broker"])
            row["ratio"] = row["mib_per_s"] / done["mib_per_s"] if done["mib_per_s"] else None
    return rows


def catchup_row(run: Run, server: Server, kind: str, fmt: str, topic: str
                ) -> dict[str, Any]:
    a = run.args
    cpu0 = hb.cpu_seconds(server.proc.pid)
    box0 = hb.box_busy_seconds()
    t0 = time.monotonic()
    out = hb.run_loadgen(
        ["-mode", "catchup", "-url", server.url, "-topic", topic,
         "-format", fmt, "-max-bytes", str(a.fetch_bytes),
         "-catchup-mib", str(a.catchup_mib), "-timeout", "60s"], timeout=3600)
    wall = time.monotonic() - t0
    cpu = (hb.cpu_seconds(server.proc.pid) - cpu0) / wall
    return {"section": "catchup", "target": kind, "format": fmt,
            "mib_per_s": out["mib_per_s"], "records_per_s": out["records_per_s"],
            "requests": out["requests"], "caught_up": out["caught_up"],
            "p50_ms": out["latency_ms"]["p50_ms"],
            "p99_ms": out["latency_ms"]["p99_ms"], "errors": out["errors"],
            "server_cpu_cores": cpu, "box_cpu_cores": (hb.box_busy_seconds() - box0) / wall,
            "mib": out["record_bytes"] / MiB}


def compact_all(run: Run, topic: str, partitions: Iterable[int] = (0,),
                extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Compact ``partitions`` of ``topic`` until nothing is left (``llog compact-once``),
    with ``extra_env`` (a root prefix of its own...) over the stack's settings."""
    import subprocess

    env = {**os.environ, **run.stack.settings_env(), "LLOG_COMPACTION_MIN_ENTRY_AGE_MS": "0",
           "LLOG_COMPACTION_MAX_BYTES": str(256 * MiB), **(extra_env or {})}
    t0 = time.monotonic()
    passes, compacted = 0, 0
    for partition in partitions:
        for _ in range(1000):
            done = subprocess.run([sys.executable, "-m", "app.cli", "compact-once", "--topic",
                                   topic, "--partition", str(partition)], env=env, cwd=ROOT,
                                  check=True, capture_output=True, text=True, timeout=600)
            outcome = json.loads(done.stdout.strip().splitlines()[-1])
            passes += 1
            compacted += outcome.get("bytes", 0)
            if outcome.get("action") not in ("compacted", "resumed", "advanced_cursor",
                                             "abandoned"):
                break
    return {"section": "catchup", "target": "compact", "passes": passes,
            "mib": compacted / MiB, "seconds": time.monotonic() - t0}


def latency_section(run: Run, produce_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    a = run.args
    rows = []
    writer = start_broker(run, "lat-writer")
    reader = start_broker(run, "lat-reader")
    try:
        for fmt in ("json", "binary"):
            shape = SHAPES[0]
            best = max((r for r in produce_rows if r["target"] == "broker"
                        and r["format"] == fmt and tuple(r["shape"]) == shape),
                       key=lambda r: r["requests_per_s"], default=None)
            if best is None:
                topic = _topic("m")
                warm(writer, shape, fmt, topic)
                best = measure(run, [writer], [load_args(writer.url, topic, shape, fmt,
                                                         a.duration, a.connections)])
            fixed = [float(r) for r in a.latency_rates.split(",") if r] if fmt == "json" else []
            for rate in [*fixed, best["requests_per_s"] / 4]:
                rows.append(_latency_row(run, writer, reader, fmt, shape, rate,
                                         best["requests_per_s"]))
    finally:
        stop_server(run, reader)
        stop_server(run, writer)
    return rows


def _latency_row(run: Run, writer: Server, reader: Server, fmt: str,
                 shape: tuple[int, int, int], rate: float, most: float) -> dict[str, Any]:
    """Produce to ``writer`` at ``rate`` requests/s while consumers long-poll ``reader``."""
    a = run.args
    topic = _topic("l")
    warm(writer, shape, fmt, topic)
    out = hb.run_loadgen(
        ["-mode", "e2e", "-url", writer.url, "-consume-url", reader.url,
         "-topic", topic, "-format", fmt, "-rate", f"{rate:.1f}",
         "-connections", str(a.connections), "-partitions", str(shape[0]),
         "-entries", str(shape[0]), "-records", str(shape[1]), "-size", str(shape[2]),
         "-duration", f"{a.duration}s", "-warmup", "1s", "-max-wait-ms", "5000",
         "-drain", "15s", "-timeout", "30s"], timeout=a.duration + 120)
    return {"section": "latency", "format": fmt, "shape": shape,
            "rate_requests_per_s": rate, "max_requests_per_s": most,
            "window_ms": a.window_ms,
            "produce": out["produce_latency_ms"], "e2e": out["e2e_latency_ms"],
            "produced": out["produced"], "consumed": out["consumed"],
            "missing": out["missing"],
            "errors": out["produce_errors"] + out["consume_errors"]}


def cost_section(run: Run) -> list[dict[str, Any]]:
    a = run.args
    rows = []
    shape = (1, 25, 1024)
    broker = start_broker(run, "cost")
    try:
        for partitions in (1, 16, 256):
            topic = _topic("f")
            warm(broker, (1, 1, 16), "binary", topic, partitions, seconds=3.0)
            row = measure(run, [broker], [load_args(broker.url, topic, shape, "binary",
                                                    a.duration, a.connections, partitions)])
            rows.append({"section": "cost", "kind": "partitions", "partitions": partitions,
                         "brokers": 1, "connections": a.connections, **row})
        for connections in (4, a.connections, a.connections * 4):
            topic = _topic("s")
            warm(broker, shape, "binary", topic, 16)
            row = measure(run, [broker], [load_args(broker.url, topic, (4, 25, 1024),
                                                    "binary", a.duration, connections, 16)])
            rows.append({"section": "cost", "kind": "saturation", "partitions": 16,
                         "brokers": 1, "connections": connections, **row})
    finally:
        stop_server(run, broker)
    for count in (1, 2, 3):
        brokers = [start_broker(run, f"cost{count}-{i}") for i in range(count)]
        try:
            topic = _topic("b")
            for b in brokers:
                warm(b, (1, 1, 16), "binary", topic, 16)
            per = max(1, a.connections // count)
            row = measure(run, brokers, [load_args(b.url, topic, (4, 25, 1024), "binary",
                                                   a.duration, per, 16) for b in brokers])
            rows.append({"section": "cost", "kind": "brokers", "partitions": 16,
                         "brokers": count, "connections": per * count, **row})
        finally:
            for b in brokers:
                stop_server(run, b)
    return rows + proxy_rows(run)


SCALE_OUT_CASES = ("1", "2", "3", "1x2", "smart")


def proxy_rows(run: Run) -> list[dict[str, Any]]:
    """Brokers behind Caddy, with and without affinity, and 3 brokers whose client routes
    each partition to its broker (``smart``): bench/scale_out.py's rows (the issue's load:
    16 connections, 16 partitions x 5 x 1 KiB binary per request), the brokers at their
    shipped settings, each row its own key space on this run's stack."""
    a = run.args
    if a.scale_out_duration <= 0:
        return []
    args = argparse.Namespace(duration=a.scale_out_duration, warmup=3.0, connections=16,
                              ideal_connections=16, load_per_member=False)
    variants = [scale_out.Variant(affinity, "this tree") for affinity in ("off", "forward")]
    if run.baseline is not None:
        variants.append(scale_out.Variant("off", f"at {a.baseline}", run.baseline[0]))
    run.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    for case, variant in scale_out.rows_to_run([scale_out.CASES[c] for c in SCALE_OUT_CASES],
                                               variants):
        try:
            row = scale_out.measure_row(run.stack, run.logs, case, variant, args)
        except (hb.BenchError, OSError, RuntimeError) as exc:
            row = {"case": case.name, "affinity": variant.affinity, "code": variant.code,
                   "error": str(exc)}
        rows.append({"section": "cost", "kind": "proxy", **row})
    return rows


# -- compression -----------------------------------------------------------------------

COMPRESSION_PARTITIONS = 4
COMPRESSION_REQUEST_BYTES = 25 * 1024  # record bytes per entry, as 4 x 25 x 1 KiB


def corpus_files(run: Run) -> dict[str, tuple[Path, int]]:
    """bench/corpus.py's corpora written for the load generator (``-records-file``),
    --corpus-mib each: long enough that no body repeats within a zstd window; the
    records per entry that make about 25 KiB of records, like 25 x 1 KiB."""
    import corpus

    out = {}
    for name in corpus.CORPORA:
        path = run.logs.parent / f"corpus-{name}.records"
        items = corpus.records(name, run.args.corpus_mib * MiB)
        path.write_bytes(corpus.pack(items))
        mean = sum(map(len, items)) / len(items)
        out[name] = (path, max(1, round(COMPRESSION_REQUEST_BYTES / mean)))
    return out


def topic_compression(codec: str) -> dict[str, Any]:
    """``zstd[:LEVEL]`` or ``none`` as POST /topics fields (docs/http-api.md)."""
    name, _, level = codec.partition(":")
    return {"compression": name, **({"compression_level": int(level)} if level else {})}


def create_compressed_topic(server: Server, topic: str, codec: str) -> str:
    """Create ``topic`` stored with ``codec``; what the broker was asked. A broker that
    does not know the setting (its refusal names it) stores raw: for ``none`` the topic is created
    without it, for any other codec the row is refused (:class:`hb.TopicRefused`)."""
    try:
        hb.create_topic(server.url, topic, COMPRESSION_PARTITIONS, **topic_compression(codec))
        return codec
    except hb.TopicRefused as exc:
        if topic_compression(codec)["compression"] != "none":
            raise hb.TopicRefused(
                f"{server.name} cannot store {codec}: {exc}. This broker has no per-topic "
                "compression setting (POST /topics compression, docs/http-api.md)") from None
    hb.create_topic(server.url, topic, COMPRESSION_PARTITIONS)
    return "none (the broker has no compression setting)"


def stored_objects(run: Run, prefix: str) -> dict[str, float]:
    """Bytes and objects under a root prefix, by kind: WAL objects, compacted chunk
    objects and the rest (listed from MinIO)."""
    client = run.stack.s3_client()
    out = {f"{kind}_{what}": 0.0 for kind in ("wal", "chunk", "other")
           for what in ("bytes", "objects")}
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=run.stack.config.bucket, Prefix=f"{prefix}/"):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                kind = ("wal" if "/wal-shared/" in key or "/data/wal/" in key else
                        "chunk" if "/data/compacted/" in key else "other")
                out[f"{kind}_bytes"] += obj["Size"]
                out[f"{kind}_objects"] += 1
    finally:
        client.close()
    return out


def _storage_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """S3 and Oxia requests, and the bytes stored before and after compression."""
    def delta(name: str, **labels: str) -> float:
        return hb.metric_sum(after, name, **labels) - hb.metric_sum(before, name, **labels)

    return {"s3_put": delta("llog_s3_requests_total", op="put"),
            "s3_get": delta("llog_s3_requests_total", op="get")
            + delta("llog_s3_requests_total", op="range_get"),
            "s3_requests": delta("llog_s3_requests_total"),
            "oxia_requests": delta("llog_oxia_requests_total"),
            "flushes": delta("llog_batcher_flushes_total"),
            "stored_raw_bytes": delta("llog_stored_raw_bytes_total"),
            "stored_bytes": delta("llog_stored_bytes_total")}


def _timed_on(run: Run, server: Server, step: Any) -> dict[str, Any]:
    """``step()``'s output with the broker's and MinIO's CPU seconds and the storage
    counters of the broker over it."""
    minio = run.stack.minio
    assert minio is not None
    before = hb.get_json(f"{server.url}/metrics")
    cpu0, m0 = hb.cpu_seconds(server.proc.pid), hb.cpu_seconds(minio.pid)
    out = step()
    after = hb.get_json(f"{server.url}/metrics")
    return {"out": out, "broker_cpu_s": hb.cpu_seconds(server.proc.pid) - cpu0,
            "minio_cpu_s": hb.cpu_seconds(minio.pid) - m0,
            **_storage_deltas(before, after)}


def compression_section(run: Run) -> list[dict[str, Any]]:
    """Per corpus (JSON events, access-log lines, random bytes) and per codec of
    --codecs (and ``none`` at --baseline), one row: produce, then catch-up fresh and
    after compaction, each broker on a key space of its own."""
    a = run.args
    run.logs.mkdir(parents=True, exist_ok=True)
    files = corpus_files(run)
    rows: list[dict[str, Any]] = []
    for name, (path, per_entry) in files.items():
        variants = [(codec, False) for codec in a.codecs.split(",")]
        if run.baseline is not None:  # the previous revision beside this one's none
            variants.insert(1, ("none", True))
        for codec, base in variants:
            try:
                row = compression_row(run, name, path, per_entry, codec, base)
            except (hb.BenchError, OSError, RuntimeError) as exc:
                row = {"error": str(exc)}
            rows.append({"section": "compression", "corpus": name, "codec": codec,
                         "broker": "base" if base else "this", **row})
    return rows


def compression_row(run: Run, name: str, path: Path, per_entry: int, codec: str,
                    base: bool) -> dict[str, Any]:
    a = run.args
    tag = f"cz-{name}-{codec.replace(':', '')}{'-base' * base}"
    prefix = f"perf-{tag}-{uuid.uuid4().hex[:6]}"
    topic = _topic("z")
    shape = (COMPRESSION_PARTITIONS, per_entry, 1)  # -size is the corpus's

    def produce(url: str, seconds: float) -> dict[str, Any]:
        return hb.run_loadgen([*load_args(url, topic, shape, "binary", seconds, a.connections),
                               "-records-file", str(path)], timeout=seconds + 120)

    broker = start_broker(run, f"{tag}-produce", base=base, root_prefix=prefix)
    try:
        asked = create_compressed_topic(broker, topic, codec)
        warm = produce(broker.url, 1.0)
        written = _timed_on(run, broker, functools.partial(produce, broker.url, a.duration))
    finally:
        stop_server(run, broker)
    out = written.pop("out")
    record_bytes = warm["bytes_acked"] + out["bytes_acked"]
    records = warm["records_acked"] + out["records_acked"]
    fresh_store = stored_objects(run, prefix)
    mib = record_bytes / MiB
    row: dict[str, Any] = {
        "asked": asked, "records": records, "record_mib": mib,
        "produce_mib_per_s": out["mib_per_s"], "produce_records_per_s": out["records_per_s"],
        "produce_errors": out["errors"] + out["other_status"],
        "produce": {**_per_mib(written, out["bytes_acked"] / MiB),
                    "flushes_per_s": written["flushes"] / out["elapsed_s"]},
        "stored_fresh": fresh_store,
        "stored_bytes_per_record": fresh_store["wal_bytes"] / records if records else None,
        "ratio_fresh": record_bytes / fresh_store["wal_bytes"] if fresh_store["wal_bytes"]
        else None,
        "ratio_counted": (written["stored_raw_bytes"] / written["stored_bytes"]
                          if written["stored_bytes"] else None),
    }
    for state in ("fresh", "compacted"):
        if state == "compacted":
            row["compact"] = compact_all(run, topic, range(COMPRESSION_PARTITIONS),
                                         {"LLOG_ROOT_PREFIX": prefix})
            row["stored_compacted"] = stored_objects(run, prefix)
            chunk = row["stored_compacted"]["chunk_bytes"]
            row["ratio_compacted"] = record_bytes / chunk if chunk else None
        broker = start_broker(run, f"{tag}-{state}", base=base, root_prefix=prefix)
        try:
            read = _timed_on(run, broker, functools.partial(
                peer.read, broker.url, topic, "go", math.ceil(mib), a.fetch_bytes))
        finally:
            stop_server(run, broker)
        got = read.pop("out")
        row[f"catchup_{state}"] = {"mib_per_s": got["mib_per_s"], "complete": got["complete"],
                                   "errors": got["errors"], **_per_mib(read, got["mib"])}
    return row


def _per_mib(step: dict[str, Any], mib: float) -> dict[str, Any]:
    """A step's counters and CPU, and each per MiB of records."""
    return {**step, **{f"{k}_per_mib": (v / mib if mib else None) for k, v in step.items()
                       if k in ("broker_cpu_s", "minio_cpu_s", "s3_put", "s3_get",
                                "oxia_requests")}}


def peer_section(run: Run) -> dict[str, Any]:
    """Kafka, then llog (``--peer-broker``), on this machine one after the other
    (bench/peer.py): produce back to back and paced, records of each --record-sizes,
    and a catch-up read of the same amount of 1 KiB records; every Python client's CPU
    per record beside the Go load generator's."""
    a = run.args
    sizes = a.record_sizes
    kafka = peer.kafka_side(run.logs.parent, a.duration, a.catchup_mib, sizes, a.peer_pace,
                            a.peer_paced_seconds)
    llog: dict[str, Any] = {"load_before": peer.idle_load(), "rows": []}
    broker = start_kind(run, a.peer_broker, "peer")
    try:
        llog["rows"] += peer_produce_rows(run, broker, sizes)
        llog["rows"] += peer_paced_rows(run, broker, llog["rows"], peer.paced_bytes(sizes))
        topic = _topic("pc")
        _peer_create(run, broker, topic)
        llog["fill"] = hb.run_loadgen(
            [*load_args(broker.url, topic, peer.SHAPE, "binary", 3600, a.peer_connections),
             "-total-mib", str(a.catchup_mib)], timeout=3600)
    finally:
        stop_server(run, broker)
    for state in ("fresh", "compacted"):
        if state == "compacted":
            llog["compact"] = compact_all(run, topic, range(peer.SHAPE[0]),
                                          key_space(a.peer_broker, "peer"))
        llog["rows"] += peer_catchup_rows(run, topic, state)
    return {"section": "peer", "kafka": kafka, "llog": llog,
            "table": peer.table(llog, kafka), "paced": peer.paced(llog, kafka),
            "settings": {"broker": f"{a.peer_broker} ({BROKER_KINDS[a.peer_broker]})",
                         "seconds": a.duration, "connections": a.peer_connections,
                         "paced_connections": a.peer_paced_connections,
                         "paced_seconds": a.peer_paced_seconds,
                         "catchup_mib": a.catchup_mib, "record_sizes": sizes,
                         "pace": a.peer_pace, "compression": a.peer_compression
                         or f"the broker's default ({_default_compression(a.peer_broker)})"}}


def _default_compression(kind: str) -> str:
    """What a topic created without ``compression`` gets from a broker of ``kind``."""
    return {"dev": SHIPPED_COMPRESSION, "k8s": "deploy/k8s/base's"}.get(kind, "none")


def _peer_create(run: Run, broker: Server, topic: str) -> None:
    """A topic of the peer section: 4 partitions, --peer-compression if given."""
    codec = run.args.peer_compression
    hb.create_topic(broker.url, topic, peer.SHAPE[0], **(topic_compression(codec)
                                                         if codec else {}))


def _peer_topic(run: Run, broker: Server, shape: tuple[int, int, int], fmt: str) -> str:
    """A topic of its own for one row, written for a second first (``warm``)."""
    topic = _topic("pp")
    _peer_create(run, broker, topic)
    warm(broker, shape, fmt, topic)
    return topic


def peer_produce_rows(run: Run, broker: Server, sizes: list[int]) -> list[dict[str, Any]]:
    """llog's producers, records of each size: the Go load generator (binary; JSON too
    at 1 KiB), then llog_client's producers, each in a process of its own."""
    a = run.args
    rows = []
    for size in sizes:
        shape = peer.shape_for(size)
        for fmt in ("json", "binary") if size == peer.SHAPE[2] else ("binary",):
            topic = _peer_topic(run, broker, shape, fmt)
            rows.append(peer.row("produce", f"go-{fmt}", size, peer.timed(functools.partial(
                _go_produce, broker.url, topic, shape, fmt, a.duration,
                a.peer_connections))))
        before = ["llog-produce"] if size == peer.SHAPE[2] else []
        for kind in [*before, "llog-producer", "llog-async-producer"]:
            topic = _peer_topic(run, broker, shape, "binary")
            rows.append(peer.row("produce", kind, size, peer.attempt(functools.partial(
                peer.timed, functools.partial(
                    peer.client, kind, broker.url, topic, seconds=a.duration,
                    record_bytes=size, tasks=a.peer_connections,
                    timeout=a.duration + 180)))))
    return rows


def _go_produce(url: str, topic: str, shape: tuple[int, int, int], fmt: str,
                seconds: float, connections: int, rate: float | None = None
                ) -> dict[str, Any]:
    """The Go load generator's produce, back to back or at ``rate`` requests/s."""
    pacing = [] if rate is None else ["-rate", f"{rate:.3f}"]
    return peer.go_produced(hb.run_loadgen(
        [*load_args(url, topic, shape, fmt, seconds, connections), *pacing],
        timeout=seconds + 120))


def peer_paced_rows(run: Run, broker: Server, rows: list[dict[str, Any]], size: int
                    ) -> list[dict[str, Any]]:
    """llog_client's producers at --peer-pace of their own records/s, records of
    ``size``, each beside the Go load generator at the same records/s."""
    a = run.args
    out = []
    shape = peer.shape_for(size)
    for kind in ("llog-producer", "llog-async-producer"):
        rate = peer.pace_rate(rows, kind, size, a.peer_pace)
        if rate is None:
            continue
        topic = _peer_topic(run, broker, shape, "binary")
        seconds = a.peer_paced_seconds
        mine = peer.attempt(functools.partial(peer.timed, functools.partial(
            peer.client, kind, broker.url, topic, seconds=seconds, record_bytes=size,
            rate=rate, warmup=peer.PACED_WARMUP_S, timeout=seconds + 180)))
        go_shape = peer.paced_shape(shape, mine)
        topic = _peer_topic(run, broker, go_shape, "binary")
        go = peer.attempt(functools.partial(peer.timed, functools.partial(
            _go_produce, broker.url, topic, go_shape, "binary", seconds,
            a.peer_paced_connections, rate / (go_shape[0] * go_shape[1]))))
        out.append(peer.row("paced", kind, size, mine, of_max=a.peer_pace, go=go))
    return out


def peer_catchup_rows(run: Run, topic: str, state: str) -> list[dict[str, Any]]:
    """Each reader of peer.PEER_READERS reads ``topic`` (``state``: fresh or compacted)
    from a broker started for it, in the writer's key space: no read starts with what
    another cached. `llog dev`'s broker runs without its compactor here: it would
    compact the partitions while the fresh reads go on (entries 30 s old), and each
    reader would meet other objects."""
    a = run.args
    rows = []
    for reader in peer.PEER_READERS:
        broker = start_kind(run, a.peer_broker, f"peer-{state}-{reader}", space="peer",
                            compactor=False)
        try:
            out = peer.attempt(functools.partial(peer.timed, functools.partial(
                peer.read, broker.url, topic, reader, a.catchup_mib)))
        finally:
            stop_server(run, broker)
        rows.append(peer.row(f"catchup_{state}", reader, peer.SHAPE[2], out))
    return rows


# -- report ----------------------------------------------------------------------------


def _f(value: Any, spec: str = ",.0f", width: int = 9) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def _shape(shape: Any) -> str:
    e, r, s = shape
    return f"{e}x{r}x{s if s < 1024 else str(s // 1024) + 'K'}"


def print_report(results: dict[str, Any]) -> None:
    s, m = results["settings"], results["machine"]
    print(f"\nllog performance: {m['nproc']} CPUs ({m['cpu_model']}), Python {m['python']}, "
          f"load average {m['loadavg_start'][0]:.2f} at start; real Oxia + MinIO on "
          f"loopback; brokers: 1 process, 1 uvicorn worker, batch window "
          f"{s['window_ms']} ms; {s['connections']} connections, {s['duration']} s per row")
    rows = results["rows"]
    prod = [r for r in rows if r["section"] == "produce"]
    if prod:
        print("\nproduce (closed loop; shape = entries x records x bytes per request; ratio "
              "= records/s over the JSON ceiling's for the same record size; floor = the "
              "ceiling plus a durable write's storage steps; box CPU = every process)")
        print(f"{'shape':>10} {'target':>8} {'format':>6} {'conns':>5} {'records/s':>10} "
              f"{'MiB/s':>7} "
              f"{'p50 ms':>7} {'p99 ms':>7} {'CPU us/req':>10} {'srv CPU':>7} {'box CPU':>7} "
              f"{'rec/flush':>9} {'flush/s':>7} {'ratio':>6} {'errors':>6}")
        for r in prod:
            print(f"{_shape(r['shape']):>10} {r['target']:>8} {r['format']:>6} "
                  f"{r.get('connections', s['connections']):>5} {r['records_per_s']:>10,.0f} "
                  f"{r['mib_per_s']:>7.1f} {r['p50_ms']:>7.1f} "
                  f"{r['p99_ms']:>7.1f} {_f(r['cpu_us_per_request'], ',.0f', 10)} "
                  f"{r['server_cpu_cores']:>7.2f} {_f(r.get('box_cpu_cores'), '.2f', 7)} "
                  f"{_f(r.get('records_per_flush'))} "
                  f"{_f(r.get('flushes_per_s'), '.0f', 7)} {_f(r.get('ratio'), '.2f', 6)} "
                  f"{r['errors']:>6}")
    ship = [r for r in rows if r["section"] == "shipped"]
    if ship:
        print("\nas users run it (4 x 25 x 1 KiB per request; one broker at a time, kinds "
              "alternating at each connection count; ratio = records/s over the tuned "
              "broker's, same format and connections)")
        for kind, what in BROKER_KINDS.items():
            print(f"  {kind:>5}: {what}")
        print(f"{'target':>8} {'format':>6} {'conns':>5} {'requests/s':>10} {'MiB/s':>7} "
              f"{'p50 ms':>7} {'p99 ms':>7} {'CPU us/req':>10} {'srv CPU':>7} {'box CPU':>7} "
              f"{'ratio':>6} {'errors':>6}")
        for r in ship:
            print(f"{r['target']:>8} {r['format']:>6} {r['connections']:>5} "
                  f"{r['requests_per_s']:>10,.0f} {r['mib_per_s']:>7.1f} {r['p50_ms']:>7.1f} "
                  f"{r['p99_ms']:>7.1f} {_f(r['cpu_us_per_request'], ',.0f', 10)} "
                  f"{r['server_cpu_cores']:>7.2f} {_f(r.get('box_cpu_cores'), '.2f', 7)} "
                  f"{_f(r.get('ratio'), '.2f', 6)} {r['errors']:>6}")
    recs = [r for r in rows if r["section"] == "records"]
    if recs:
        print("\nkeys and headers (JSON produce of the same values; ratio = records/s over "
              "plain values')")
        for r in recs:
            print(f"  {_shape(r['shape']):>10} {r['kind']:>16}: {r['records_per_s']:>10,.0f} "
                  f"records/s, p50 {r['p50_ms']:.1f} ms, CPU "
                  f"{_f(r['cpu_us_per_request'], ',.0f', 6)} us/req, ratio {r['ratio']:.2f}")
    cat = [r for r in rows if r["section"] == "catchup"]
    if cat:
        print(f"\ncatch-up read of one partition from offset 1 (1 KiB records, max_bytes "
              f"{s['fetch_bytes'] // MiB} MiB per request; ratio = MiB/s over the ceiling's "
              "in the same format)")
        for r in cat:
            if r["target"] == "fill":
                print(f"  written first: {r['mib']:,.0f} MiB at {r['mib_per_s']:.1f} MiB/s "
                      "(binary produce)")
                continue
            if r["target"] == "compact":
                print(f"  then compacted: {r['mib']:,.0f} MiB in {r['passes']} passes of "
                      f"llog compact-once, {r['seconds']:.1f} s; read again:")
                continue
            print(f"  {r['target']:>9} {r['format']:>6}: {r['mib_per_s']:8.1f} MiB/s "
                  f"{r['records_per_s']:>10,.0f} records/s, p50 {r['p50_ms']:.1f} ms, p99 "
                  f"{r['p99_ms']:.1f} ms per answer, srv CPU {r['server_cpu_cores']:.2f}, "
                  f"box CPU {_f(r.get('box_cpu_cores'), '.2f', 4)}, "
                  f"ratio {_f(r.get('ratio'), '.2f', 4)}, errors {r['errors']}")
    cat4 = [r for r in rows if r["section"] == "catchup4"]
    if cat4:
        print(f"\ncatch-up as users meet it: 4 partitions written 4 x 25 x 1 KiB binary per "
              f"request, read from offset 1 by ONE client asking for all 4 in every request "
              f"(binary answers, {s['fetch_bytes'] // MiB} MiB per request); the broker "
              "restarts before each read; ratio = fresh over compacted, same reader")
        for r in cat4:
            if r["target"] == "fill":
                print(f"  written first: {r['mib']:,.0f} MiB at {r['mib_per_s']:.1f} MiB/s")
                continue
            if r["target"] == "compact":
                print(f"  then compacted: {r['mib']:,.0f} MiB in {r['passes']} passes of "
                      f"llog compact-once, {r['seconds']:.1f} s; read again:")
                continue
            reader = peer.READERS[r["reader"]]
            broker = f" ({s['baseline']})" if r.get("broker") == "base" else ""
            print(f"  {r['target']:>9} {reader:>28}{broker}: {r['mib_per_s']:8.1f} MiB/s "
                  f"{r['records_per_s']:>10,.0f} records/s, {r['requests']} requests, srv CPU "
                  f"{r['server_cpu_cores']:.2f}, box CPU {r['box_cpu_cores']:.2f}, ratio "
                  f"{_f(r.get('ratio'), '.2f', 4)}{'' if r['complete'] else ' (incomplete)'}")
    lat = [r for r in rows if r["section"] == "latency"]
    if lat:
        print("\nlatency below saturation (a quarter of the measured maximum, and any "
              "--latency-rates; produce to one broker, consume from another)")
        for r in lat:
            p, e = r["produce"], r["e2e"]
            print(f"  {r['format']:>6} {_shape(r['shape'])} at {r['rate_requests_per_s']:.0f} "
                  f"req/s (max {r['max_requests_per_s']:.0f}): produce p50 {p['p50_ms']:.1f} "
                  f"p99 {p['p99_ms']:.1f} ms (target <= {r['window_ms'] + 20}); "
                  f"produce-to-consume p50 {e['p50_ms']:.1f} p99 {e['p99_ms']:.1f} ms "
                  f"(target <= {r['window_ms'] + 30}); missing {r['missing']}, "
                  f"errors {r['errors']}")
    storage = [r for r in rows if r["section"] == "storage"]
    if storage:
        storage_ceiling.print_storage(storage)
    cost = [r for r in rows if r["section"] == "cost" and r["kind"] != "proxy"]
    if cost:
        print("\ncost (binary produce, 1 KiB records): Oxia and S3 requests per flush")
        print(f"{'kind':>10} {'parts':>5} {'brokers':>7} {'conns':>5} {'records/s':>10} "
              f"{'flush/s':>7} {'rec/flush':>9} {'parts/flush':>11} {'Oxia/flush':>10} "
              f"{'S3/flush':>8} {'Oxia/s':>7} {'PUT/s':>6}")
        for r in cost:
            print(f"{r['kind']:>10} {r['partitions']:>5} {r['brokers']:>7} "
                  f"{r['connections']:>5} {r['records_per_s']:>10,.0f} "
                  f"{_f(r.get('flushes_per_s'), '.0f', 7)} {_f(r.get('records_per_flush'))} "
                  f"{_f(r.get('partitions_per_flush'), '.1f', 11)} "
                  f"{_f(r.get('oxia_requests_per_flush'), '.1f', 10)} "
                  f"{_f(r.get('s3_requests_per_flush'), '.1f', 8)} "
                  f"{_f(r.get('oxia_requests_per_s'), '.0f', 7)} "
                  f"{_f(r.get('s3_puts_per_s'), '.0f', 6)}")
    proxy = [r for r in rows if r["section"] == "cost" and r["kind"] == "proxy"]
    if proxy:
        print(f"\ncost with and without affinity: brokers behind Caddy "
              f"(bench/scale_out.py), {scale_out.PARTITIONS} partitions, 16 connections, "
              f"{scale_out.PARTITIONS} x {scale_out.RECORDS} x {scale_out.RECORD_BYTES} B "
              f"binary per request, {s['scale_out_duration']:g} s per row after a 3 s "
              "warm-up; brokers at their shipped settings")
        scale_out.print_rows(proxy)
    print_compression([r for r in rows if r["section"] == "compression"], s)
    for r in rows:
        if r["section"] == "peer":
            peer.print_peer(r)


def print_compression(rows: list[dict[str, Any]], s: dict[str, Any]) -> None:
    if not rows:
        return
    print(f"\ncompression (bench/corpus.py records, {COMPRESSION_PARTITIONS} partitions x "
          f"about 25 KiB of records per request, binary, {s['connections']} connections; "
          "MiB are of records, uncompressed; catch-up: one Go reader, all partitions per "
          "request, fresh then compacted, broker restarted before each; ratio = record "
          "bytes over stored WAL (fresh) or chunk (compacted) bytes as listed; CPU in ms "
          "per MiB; PUT, GET, Oxia per MiB)")
    print(f"{'corpus':>7} {'codec':>7} {'broker':>6} {'prod MiB/s':>10} {'fresh':>6} "
          f"{'compact':>7} {'B/rec':>6} {'ratio':>5} {'c.ratio':>7} {'brk ms':>6} "
          f"{'MinIO ms':>8} {'rd brk ms':>9} {'PUT':>5} {'Oxia':>5} {'GET':>5}")
    for r in rows:
        head = f"{r['corpus']:>7} {r['codec']:>7} {r['broker']:>6}"
        if "error" in r:
            print(f"{head} REFUSED: {r['error']}")
            continue
        p, f, c = r["produce"], r["catchup_fresh"], r["catchup_compacted"]

        def ms(v: float | None) -> str:
            return _f(None if v is None else v * 1e3, ".0f", 0)

        print(f"{head} {r['produce_mib_per_s']:>10.1f} {f['mib_per_s']:>6.1f} "
              f"{c['mib_per_s']:>7.1f} {_f(r['stored_bytes_per_record'], ',.0f', 6)} "
              f"{_f(r['ratio_fresh'], '.2f', 5)} {_f(r['ratio_compacted'], '.2f', 7)} "
              f"{ms(p['broker_cpu_s_per_mib']):>6} {ms(p['minio_cpu_s_per_mib']):>8} "
              f"{ms(f['broker_cpu_s_per_mib']):>9} {_f(p['s3_put_per_mib'], '.2f', 5)} "
              f"{_f(p['oxia_requests_per_mib'], '.1f', 5)} "
              f"{_f(f['s3_get_per_mib'], '.2f', 5)}")


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections",
                        default="storage,produce,records,catchup,latency,cost,compression",
                        help="any of storage,produce,records,catchup,latency,cost,"
                             "compression,peer (peer: llog against Kafka, bench/peer.py; "
                             "not by default)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per row")
    parser.add_argument("--connections", type=int, default=32,
                        help="connections of the ceiling and of the other sections")
    parser.add_argument("--broker-connections", default="32,128",
                        help="connections of the produce rows of the broker (a list)")
    parser.add_argument("--window-ms", type=int, default=5, help="LLOG_BATCH_MAX_DELAY_MS")
    parser.add_argument("--catchup-mib", type=int, default=1024)
    parser.add_argument("--latency-rates", default="",
                        help="latency section: also these JSON produce rates (requests/s, "
                             "comma-separated), besides a quarter of the maximum")
    parser.add_argument("--fetch-bytes", type=int, default=8 * MiB,
                        help="max_bytes of each catch-up request")
    parser.add_argument("--peer-broker", choices=sorted(BROKER_KINDS), default="tuned",
                        help="peer section: the llog broker set against Kafka")
    parser.add_argument("--peer-connections", type=int, default=32,
                        help="peer section: connections of llog's produce")
    parser.add_argument("--peer-paced-connections", type=int, default=128,
                        help="peer section: the Go load generator's connections in the "
                             "paced rows, enough that its requests at the producers' "
                             "rates never wait for a free connection of its own (its "
                             "p99 would then measure its own queue, not the broker)")
    parser.add_argument("--record-sizes", default="100,1024,10240",
                        help="peer section: the produce rows' record sizes in bytes "
                             "(comma-separated; the paced rows take 1024 if listed)")
    parser.add_argument("--peer-compression", default="none", metavar="CODEC",
                        help="peer section: llog's topics stored with none (as Kafka's "
                             "producers send) or zstd[:LEVEL]; '' for the broker's "
                             "default (`llog dev` ships zstd:1)")
    parser.add_argument("--peer-paced-seconds", type=float, default=30.0,
                        help="peer section: seconds of each paced row, and of the Go "
                             "load generator's beside it: a p99 is decided by the few "
                             "slow flushes in its window, whose count in 10 s varies "
                             "more than the paced target's 15 ms of slack")
    parser.add_argument("--peer-pace", type=float, default=0.5,
                        help="peer section: the paced rows' rate, a fraction of each "
                             "producer's own back-to-back records/s")
    parser.add_argument("--baseline", default=None, metavar="REF",
                        help="also measure the brokers users run, and the 4-partition "
                        "catch-up, as revision REF (a commit, tag or branch) ships them, in "
                        "the same run (bench/baseline.py)")
    parser.add_argument("--scale-out-duration", type=float, default=10.0,
                        help="cost section: seconds of each brokers-behind-Caddy row, with "
                             "and without affinity (8 rows, 9 with --baseline); 0 leaves "
                             "them out")
    parser.add_argument("--codecs", default="none,zstd",
                        help="compression section: the topics' codecs, none or zstd[:LEVEL] "
                             "(comma-separated); with --baseline, none again at REF")
    parser.add_argument("--corpus-mib", type=int, default=32,
                        help="compression section: MiB of each corpus the load generator "
                             "sends in turn (bench/corpus.py)")
    parser.add_argument("--quick", action="store_true",
                        help="2 s per row, 128 MiB catch-up: a smoke run")
    args = parser.parse_args()
    args.broker_connections = [int(c) for c in str(args.broker_connections).split(",")]
    args.record_sizes = [int(n) for n in str(args.record_sizes).split(",")]
    if args.peer_paced_seconds <= 0:
        parser.error("--peer-paced-seconds must be more than 0")
    if args.quick:
        args.duration, args.catchup_mib, args.peer_paced_seconds = 2.0, 128, 2.0
        args.scale_out_duration = min(args.scale_out_duration, 2.0)
    sections = set(args.sections.split(","))
    if "peer" in sections:
        try:
            peer.check_needs()
        except hb.BenchError as exc:
            print(f"perf.py: {exc}", file=sys.stderr)
            return 2
    # A SIGTERM unwinds like Ctrl-C, so every server (Kafka included) is stopped.
    signal.signal(signal.SIGTERM, _terminate)
    hb.build_loadgen()
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="llog-perf-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        run = Run(args, stack, Path(tmp) / "logs")
        if args.baseline:
            run.baseline = baseline.checkout(args.baseline)
            args.baseline = f"{args.baseline} = {run.baseline[1]}"
        rows: list[dict[str, Any]] = []
        try:
            if "storage" in sections:
                rows += asyncio.run(storage_ceiling.measure_storage(stack, args.duration))
            if "produce" in sections:
                rows += produce_section(run)
            elif "shipped" in sections:  # only the brokers users run (part of produce)
                rows += shipped_rows(run)
            if "records" in sections:
                rows += records_section(run)
            if "catchup" in sections:
                rows += catchup_section(run)
            if "latency" in sections:
                rows += latency_section(run, [r for r in rows if r["section"] == "produce"])
            if "cost" in sections:
                rows += cost_section(run)
            if "compression" in sections:
                rows += compression_section(run)
            if "peer" in sections:
                rows.append(peer_section(run))
        finally:
            run.stop()
            stack.stop()
    results = {"settings": {k: v for k, v in vars(args).items()},
               "machine": {**hb.machine_info(), "loadavg_end": list(os.getloadavg())},
               "platform": platform.platform(), "rows": rows}
    for row in rows:
        row.pop("loads", None)
    out = hb.OUT_DIR / f"perf-{started}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print_report(results)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
