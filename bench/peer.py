"""llog against Kafka on the same machine, one after the other, same record shape:
``bench/perf.py --sections peer``.

Kafka 4.3.1 (KRaft, broker and controller in one JVM, 1 GiB heap, as
../shared/peers/kafka/kafka.sh starts it) runs from the jars Maven fetches
(bench/kafka-peer.pom.xml) into ``$KAFKA_PEER_JARS`` (default ~/.cache/llog-kafka-peer),
on free ports, in a directory of the run. It is a managed child (it dies with this
process, even a killed one) and is stopped before llog starts, on every exit path.

Both sides: 1 KiB records over 4 partitions.

- produce, Kafka: confluent-kafka, acks=all, linger 5 ms (bench/peer_clients.py).
  llog: the Go load generator, 4 partitions x 25 records x 1 KiB per request, 32
  connections (``--peer-connections``), JSON and binary; and the project's Python client
  (llog_client), as many produce calls in flight, 100 x 1 KiB to one partition each.
- catch-up of the same amount (``--catchup-mib``), Kafka: the confluent consumer from
  offset 0, 4 MiB fetches. llog: one client reading all 4 partitions from offset 1 in
  every request, binary answers, 4 MiB per request: the Python client
  (httpx and the project's decoder) and the Go load generator (the transport's figure);
  fresh, then after ``llog compact-once`` of every partition. The broker restarts before
  each read, so none starts with the objects another read cached.

Kafka writes to the page cache without fsync (its default); an llog acknowledgement is
in the object store and Oxia. The machine's load (load average, and the CPU every
process used over a second before each side and during each row) is in the report.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import http_bench as hb

from app.localstack.processes import ManagedProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "bench" / "kafka-peer.pom.xml"
CLIENTS = ROOT / "bench" / "peer_clients.py"
MiB = 1024 * 1024
SHAPE = (4, 25, 1024)
FETCH_BYTES = 4 * MiB


def jars_dir() -> Path:
    return Path(os.environ.get("KAFKA_PEER_JARS",
                               Path.home() / ".cache" / "llog-kafka-peer"))


def ensure_jars() -> Path:
    """Kafka's jars, fetched by Maven the first time (a few minutes, once)."""
    jars = jars_dir()
    if jars.is_dir() and any(jars.glob("kafka_2.13-*.jar")):
        return jars
    jars.mkdir(parents=True, exist_ok=True)
    print(f"peer: fetching Kafka's jars with Maven into {jars}", flush=True)
    subprocess.run(["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                    f"-DoutputDirectory={jars}"], check=True, timeout=1800)
    return jars


class Kafka:
    """One KRaft node (broker and controller) in ``root``, on free ports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port, self.controller_port = free_port(), free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        jars = ensure_jars()
        classpath = f"{jars}/*"
        self.root.mkdir(parents=True, exist_ok=True)
        props = self.root / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://{self.bootstrap},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://{self.bootstrap}",
            "controller.listener.names=CONTROLLER", "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.root / 'data'}", "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0", ""]))
        cluster = subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool",
                                  "random-uuid"], check=True, capture_output=True,
                                 text=True, timeout=120).stdout.strip()
        subprocess.run(["java", "-cp", classpath, "kafka.tools.StorageTool", "format",
                        "-t", cluster, "-c", str(props)], check=True, capture_output=True,
                       timeout=120)
        self.proc = ManagedProcess(
            "kafka", ["java", "-Xms1g", "-Xmx1g", "-cp", classpath, "kafka.Kafka",
                      str(props)], self.root / "kafka.log")
        self.proc.start()

        def listening() -> bool:
            import socket

            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True

        wait_until("kafka", listening, timeout=120, process=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(timeout=30)
            self.proc = None


def client(*args: str, timeout: float) -> dict[str, Any]:
    """One run of bench/peer_clients.py in its own process; its JSON line."""
    done = subprocess.run([sys.executable, str(CLIENTS), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        raise hb.BenchError(f"peer client {args[0]} failed: {done.stderr.strip()[-800:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def idle_load(seconds: float = 1.0) -> dict[str, Any]:
    """The machine before a side starts: load average and the CPU every process used."""
    box0 = hb.box_busy_seconds()
    time.sleep(seconds)  # a measurement window, not a wait for an event
    return {"loadavg": list(os.getloadavg()),
            "box_cpu_cores": (hb.box_busy_seconds() - box0) / seconds}


def timed(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn``'s figures with the machine's CPU (every process) while it ran."""
    box0 = hb.box_busy_seconds()
    t0 = time.monotonic()
    out = fn()
    wall = time.monotonic() - t0
    return {**out, "box_cpu_cores": (hb.box_busy_seconds() - box0) / wall,
            "loadavg_after": list(os.getloadavg())}


def check_needs() -> None:
    """Fail before anything starts when the peer cannot run here, saying what is missing."""
    import importlib.util

    missing = [what for what, ok in (
        ("java (17+) on PATH", shutil.which("java") is not None),
        ("mvn on PATH (the first run fetches Kafka's jars)",
         shutil.which("mvn") is not None or any(jars_dir().glob("kafka_2.13-*.jar"))),
        ("confluent-kafka (.venv/bin/pip install -e '.[bench]')",
         importlib.util.find_spec("confluent_kafka") is not None)) if not ok]
    if missing:
        raise hb.BenchError("the peer section needs " + "; ".join(missing))


def kafka_side(run_dir: Path, seconds: float, catchup_mib: int) -> dict[str, Any]:
    rows: dict[str, Any] = {"load_before": idle_load()}
    kafka = Kafka(run_dir / "kafka")
    try:
        kafka.start()
        topic = f"perf-{uuid.uuid4().hex[:8]}"
        client("kafka-topic", kafka.bootstrap, topic, timeout=120)
        # Unmeasured, as llog's warm-up write: the JVM compiles its hot paths first.
        client("kafka-produce", kafka.bootstrap, topic, "1", timeout=180)
        rows["produce"] = timed(functools.partial(
            client, "kafka-produce", kafka.bootstrap, topic, str(seconds),
            timeout=seconds + 180))
        short = catchup_mib - rows["produce"]["records"] * 1024 / MiB
        if short > 0:  # the catch-up reads as much as llog's does
            rows["fill"] = client("kafka-produce", kafka.bootstrap, topic, "0", "--mib",
                                  f"{short + 1:.0f}", timeout=1800)
        rows["catchup"] = timed(functools.partial(
            client, "kafka-consume", kafka.bootstrap, topic, str(catchup_mib), timeout=1800))
    finally:
        kafka.stop()
        shutil.rmtree(run_dir / "kafka", ignore_errors=True)
    return rows


# Readers: the Python client and the Go load generator, the partitions sharing each
# request's budget in request order; and the load generator with an equal share each
# (``partition_max_bytes``), as Kafka's consumers fetch (max.partition.fetch.bytes).
READERS = {"go": "Go load generator", "go-shared": "Go, a quarter per partition",
           "python": "one Python client"}


def read(url: str, topic: str, reader: str, mib: int, fetch_bytes: int = FETCH_BYTES
         ) -> dict[str, Any]:
    """One client reads the 4 partitions of ``topic`` from offset 1, all of them in every
    request, binary answers: ``python`` (bench/peer_clients.py), ``go`` (the load
    generator's catch-up mode) or ``go-shared`` (the same, each partition with a
    ``partition_max_bytes`` of a quarter of the request's)."""
    if reader == "python":
        return client("llog-consume", url, topic, str(mib), str(fetch_bytes), timeout=3600)
    share = fetch_bytes // SHAPE[0] if reader == "go-shared" else 0
    out = hb.run_loadgen(["-mode", "catchup", "-url", url, "-topic", topic,
                          "-format", "binary", "-max-bytes", str(fetch_bytes),
                          "-partition-max-bytes", str(share),
                          "-catchup-partitions", str(SHAPE[0]), "-catchup-mib", str(mib),
                          "-timeout", "60s"], timeout=3600)
    return {"records": out["records"], "mib": out["record_bytes"] / MiB,
            "seconds": out["elapsed_s"], "requests": out["requests"],
            "records_per_s": out["records_per_s"], "mib_per_s": out["mib_per_s"],
            "complete": out["caught_up"] or out["record_bytes"] >= mib * MiB,
            "errors": out["errors"]}


# -- the table -------------------------------------------------------------------------

FIGURES = [
    # figure, llog row, Kafka row
    ("produce, JSON (Go load generator) vs confluent-kafka", "produce_json", "produce"),
    ("produce, binary (Go load generator) vs confluent-kafka", "produce_binary", "produce"),
    ("produce, Python client (llog_client) vs confluent-kafka", "produce_python", "produce"),
    ("catch-up fresh, one Python client", "catchup_fresh_python", "catchup"),
    ("catch-up fresh, Go load generator", "catchup_fresh_go", "catchup"),
    ("catch-up compacted, one Python client", "catchup_compacted_python", "catchup"),
    ("catch-up compacted, Go load generator", "catchup_compacted_go", "catchup"),
]


def table(llog: dict[str, Any], kafka: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for figure, mine, theirs in FIGURES:
        a, b = llog.get(mine), kafka.get(theirs)
        if a is None or b is None:
            continue
        out.append({"figure": figure, "llog_mib_per_s": a["mib_per_s"],
                    "kafka_mib_per_s": b["mib_per_s"],
                    "ratio": a["mib_per_s"] / b["mib_per_s"] if b["mib_per_s"] else None,
                    "llog_box_cpu": a["box_cpu_cores"], "kafka_box_cpu": b["box_cpu_cores"]})
    return out


def print_peer(result: dict[str, Any]) -> None:
    llog, kafka, s = result["llog"], result["kafka"], result["settings"]
    print(f"\nllog vs Kafka 4.3.1 (one node, KRaft) on the same machine, one after the other: "
          f"1 KiB records, 4 partitions; llog broker: {s['broker']}; produce {s['seconds']} s "
          f"per row, llog at {s['connections']} connections x (4 x 25 x 1 KiB) per request; "
          f"catch-up {s['catchup_mib']} MiB, 4 MiB per fetch, binary answers")
    widths = (56, 10, 11, 10, 12, 13)
    print(f"| {'figure':<56} | {'llog MiB/s':>10} | {'Kafka MiB/s':>11} | {'llog/Kafka':>10} "
          f"| {'box CPU llog':>12} | {'box CPU Kafka':>13} |")
    print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":"
                         for i, w in enumerate(widths)) + "|")
    for r in result["table"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        print(f"| {r['figure']:<56} | {r['llog_mib_per_s']:>10.1f} | "
              f"{r['kafka_mib_per_s']:>11.1f} | {ratio:>10} | {r['llog_box_cpu']:>12.2f} | "
              f"{r['kafka_box_cpu']:>13.2f} |")
    for name, side in (("Kafka", kafka), ("llog", llog)):
        load = side["load_before"]
        print(f"  {name}: before it started, load average "
              f"{' '.join(f'{x:.2f}' for x in load['loadavg'])}, box CPU "
              f"{load['box_cpu_cores']:.2f} cores (every process, over 1 s)")
    if "compact" in llog:
        c = llog["compact"]
        print(f"  llog compacted {c['mib']:,.0f} MiB in {c['passes']} passes of llog "
              f"compact-once, {c['seconds']:.1f} s, between the fresh and compacted reads")
    incomplete = [k for side in (llog, kafka) for k, v in side.items()
                  if isinstance(v, dict) and v.get("complete") is False]
    if incomplete:
        print(f"  read less than asked (timed out or ran dry): {', '.join(incomplete)}")
