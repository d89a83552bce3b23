"""A rolling restart behind a load balancer: what clients see before, during and after
(a script).

Starts its own Oxia and MinIO on free ports, then, for each proxy (Caddy, HAProxy, nginx,
with the reference configurations of deploy/proxy/; a proxy that is not installed is
skipped with a note): two brokers (``--workers 2``, ``LLOG_DRAIN_S=2``) behind the proxy,
and steady load through it: 4 producers (one ``--record-bytes`` record per request, each
with an idempotency key) and 4 long-poll consumers (one per partition, ``max_wait_ms``
5000). The load runs for a baseline window (``--seconds``), then every broker is
restarted in turn (SIGTERM: it drains, then stops; started again on its port; the next
one waits until the proxy routes produce requests to it again). nginx has no active
health check, so its restart first takes the broker out of the upstream with a reload,
as an operator's rollout would. Then a recovery window of the same length.

The reference is measured in the same run: the same load against one broker directly,
no proxy and no restart. A failed produce attempt counts as an error of its kind (HTTP
status or exception) and is sent again with the same idempotency key (at most 5
attempts): produce latency runs from a request's first attempt to its acknowledgement.
Each load starts on a fresh topic; its first 20 acknowledgements (partitions created,
connections opened) are a warm-up that no phase counts.

    .venv/bin/python bench/rolling_restart.py [--proxies caddy,haproxy,nginx]
        [--seconds 15] [--record-bytes 1024]

Prints a table and writes it as JSON to .llog/bench/rolling-restart-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast, get_args

import anyio
import httpx

from app.localstack.binaries import REPO_ROOT
from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import ManagedProcess, ProcessFailed, free_port
from app.localstack.proxy import (
    ProxyConfig,
    ProxyKind,
    find_binary,
    proxy_process,
    reload,
    wait_serving,
)
from app.localstack.stack import LocalStack, StackConfig

PARTITIONS = 4
PRODUCERS = 4
WORKERS = 2
DRAIN_S = "2"
MAX_WAIT_MS = 5000
ATTEMPTS = 5
WARMUP_ACKS = 5 * PRODUCERS
RESEND_BACKOFF_S = 0.05
MAX_REQUEST_BYTES = 16 * 1024 * 1024
OUT_DIR = REPO_ROOT / ".llog" / "bench"


# -- brokers and proxies ---------------------------------------------------------------


@dataclass
class Broker:
    name: str
    port: int
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Brokers:
    """`llog serve` processes against the bench's stack, stopped by :meth:`stop_all`."""

    def __init__(self, stack: LocalStack, data_dir: Path) -> None:
        self.stack = stack
        self.data_dir = data_dir
        self.running: list[Broker] = []
        self.starts: Counter[str] = Counter()

    def _spawn(self, name: str, port: int) -> Broker:
        self.starts[name] += 1
        env = {**self.stack.settings_env(), "LLOG_BROKER_ID": name, "LLOG_DRAIN_S": DRAIN_S,
               "LLOG_TAIL_CACHE_DIR": str(self.data_dir / "tail-cache" / name)}
        proc = broker_process(name, port, env,
                              self.data_dir / "logs" / f"{name}-{self.starts[name]}.log",
                              workers=WORKERS)
        proc.start()
        broker = Broker(name, port, proc)
        self.running.append(broker)
        wait_healthy(proc, broker.url)
        return broker

    def start(self, name: str) -> Broker:
        return self._spawn(name, free_port())

    def restart(self, broker: Broker) -> Broker:
        """SIGTERM (the broker drains, then stops), then the same broker on its port."""
        broker.process.stop(timeout=60)
        self.running.remove(broker)
        return self._spawn(broker.name, broker.port)

    def stop_all(self) -> None:
        for broker in self.running:
            broker.process.signal(signal.SIGTERM)  # all drain at once
        for broker in self.running:
            broker.process.stop(timeout=30)
        self.running.clear()


@dataclass
class Proxy:
    config: ProxyConfig
    process: ManagedProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.listen_port}"

    def set_down(self, broker: Broker | None) -> None:
        """nginx: take ``broker`` out of the upstream (None: put every broker back)."""
        down = frozenset() if broker is None else frozenset({broker.port})
        self.config = dataclasses.replace(self.config, down=down)
        reload(self.process, self.config)


@contextlib.contextmanager
def proxy_in_front(kind: ProxyKind, binary: Path, brokers: list[Broker], run_dir: Path
                   ) -> Iterator[Proxy]:
    config = ProxyConfig(kind, free_port(), [("127.0.0.1", b.port) for b in brokers],
                         MAX_REQUEST_BYTES, run_dir)
    proc = proxy_process(config, binary)
    proc.start()
    try:
        wait_serving(proc, config)
        yield Proxy(config, proc)
    finally:
        proc.stop()


# -- load ------------------------------------------------------------------------------


@dataclass
class Phase:
    """What the clients saw during one phase; a request counts in the phase in which
    it (or, for produce latency, its first attempt) started."""

    name: str
    started: float
    ended: float = 0.0
    produce_requests: int = 0
    consume_requests: int = 0
    acked_records: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class Load:
    phases: list[Phase] = field(default_factory=list)
    acked: int = 0
    progressed: anyio.Event = field(default_factory=anyio.Event)

    @property
    def phase(self) -> Phase:
        return self.phases[-1]

    def begin(self, name: str) -> None:
        now = time.monotonic()
        if self.phases and not self.phase.ended:
            self.phase.ended = now
        self.phases.append(Phase(name, now))

    def end(self) -> None:
        self.phase.ended = time.monotonic()

    def ack(self, phase: Phase, started: float) -> None:
        phase.acked_records += 1
        phase.latencies_ms.append((time.monotonic() - started) * 1000)
        self.acked += 1
        self.progressed.set()

    async def more(self, count: int) -> None:
        """Until ``count`` more produce requests were acknowledged."""
        target = self.acked + count
        while self.acked < target:
            self.progressed = anyio.Event()
            await self.progressed.wait()


async def _send(client: httpx.AsyncClient, path: str, body: dict[str, Any], phase: Phase,
                what: str) -> dict[str, Any] | None:
    """The answer's JSON, or None after counting the error by its kind."""
    try:
        r = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        phase.errors[f"{what} {type(exc).__name__}"] += 1
        return None
    if r.status_code != 200:
        phase.errors[f"{what} {r.status_code}"] += 1
        return None
    answer: dict[str, Any] = r.json()
    return answer


async def _produce(client: httpx.AsyncClient, topic: str, tag: str, record_bytes: int,
                   load: Load) -> None:
    for i in itertools.count():
        key = f"{tag}-{i}"
        body = {"topic_partitions": [{"topic": topic, "partition": i % PARTITIONS,
                                      "records": [key.ljust(record_bytes, "x")],
                                      "idempotency_key": key}]}
        phase, started = load.phase, time.monotonic()
        for attempt in range(ATTEMPTS):
            load.phase.produce_requests += 1
            if await _send(client, "/produce", body, load.phase, "produce") is not None:
                load.ack(phase, started)
                break
            if attempt + 1 < ATTEMPTS:
                await anyio.sleep(RESEND_BACKOFF_S)  # a client's back-off, not a wait
        else:
            phase.errors["produce given up"] += 1


async def _consume(client: httpx.AsyncClient, topic: str, partition: int, load: Load
                   ) -> None:
    offset = 1
    while True:
        body = {"topic_partitions": [{"topic": topic, "partition": partition,
                                      "fetch_offset": offset}], "max_wait_ms": MAX_WAIT_MS}
        load.phase.consume_requests += 1
        answer = await _send(client, "/consume", body, load.phase, "consume")
        if answer is None:
            await anyio.sleep(RESEND_BACKOFF_S)
            continue
        offset = answer["results"][0]["next_offset"]


@contextlib.asynccontextmanager
async def steady_load(url: str, record_bytes: int, first_phase: str) -> AsyncIterator[Load]:
    """Producers and consumers on a fresh topic through ``url`` until the block ends;
    the first acknowledgements (the partitions are created, connections opened) are a
    warm-up, left out of every phase."""
    load = Load()
    load.begin("warm-up")
    topic = f"rr-{uuid.uuid4().hex[:10]}"
    limits = httpx.Limits(max_connections=PRODUCERS + PARTITIONS + 4)
    timeout = httpx.Timeout(30, read=MAX_WAIT_MS / 1000 + 30)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client, \
            anyio.create_task_group() as tg:
        for w in range(PRODUCERS):
            tg.start_soon(_produce, client, topic, f"p{w}", record_bytes, load)
        for p in range(PARTITIONS):
            tg.start_soon(_consume, client, topic, p, load)
        try:
            with anyio.fail_after(60):
                await load.more(WARMUP_ACKS)
            load.phases.clear()
            load.begin(first_phase)
            yield load
        finally:
            load.end()
            tg.cancel_scope.cancel()


async def _until_served(broker: Broker, load: Load) -> None:
    """Until the proxy routes produce requests to ``broker`` again. Only the worker that
    answers a scrape counts in it: each scrape is a new connection (which either worker
    may accept), after more acknowledgements."""
    async with httpx.AsyncClient(base_url=broker.url, timeout=5,
                                 headers={"Connection": "close"}) as client:
        while True:
            text = (await client.get("/metrics/prometheus")).text
            if 'llog_produce_requests_total{status="200"}' in text:
                return
            await load.more(10)


# -- the measurements -----------------------------------------------------------------


async def measure_direct(broker: Broker, seconds: float, record_bytes: int) -> list[Phase]:
    async with steady_load(broker.url, record_bytes, "steady") as load:
        await anyio.sleep(seconds)
    return load.phases


async def measure_restart(proxy: Proxy, brokers: Brokers, seconds: float,
                          record_bytes: int) -> list[Phase]:
    nginx = proxy.config.kind == "nginx"
    async with steady_load(proxy.url, record_bytes, "before") as load:
        await anyio.sleep(seconds)
        load.begin("restart")
        with anyio.fail_after(180):
            for broker in list(brokers.running):
                if nginx:
                    proxy.set_down(broker)
                    await load.more(50)  # the new nginx workers serve, without it
                again = await anyio.to_thread.run_sync(brokers.restart, broker)
                if nginx:
                    proxy.set_down(None)
                await _until_served(again, load)
        load.begin("after")
        await anyio.sleep(seconds)
    return load.phases


def run_proxy(kind: ProxyKind, binary: Path, stack: LocalStack, tmp: Path, seconds: float,
              record_bytes: int) -> list[Phase]:
    brokers = Brokers(stack, tmp / kind)
    try:
        started = [brokers.start(f"{kind}-b{i}") for i in (1, 2)]
        with proxy_in_front(kind, binary, started, tmp / kind / "proxy") as proxy:
            return anyio.run(measure_restart, proxy, brokers, seconds, record_bytes)
    finally:
        brokers.stop_all()


def run_direct(stack: LocalStack, tmp: Path, seconds: float, record_bytes: int
               ) -> list[Phase]:
    brokers = Brokers(stack, tmp / "direct")
    try:
        broker = brokers.start("direct-b1")
        return anyio.run(measure_direct, broker, seconds, record_bytes)
    finally:
        brokers.stop_all()


# -- report ----------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..1)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def figures(target: str, phase: Phase, record_bytes: int) -> dict[str, Any]:
    secs = phase.ended - phase.started
    rate = phase.acked_records / secs if secs > 0 else 0.0
    lat = phase.latencies_ms
    return {
        "target": target, "phase": phase.name, "seconds": round(secs, 2),
        "produce_requests": phase.produce_requests,
        "consume_requests": phase.consume_requests,
        "acked_records": phase.acked_records,
        "records_per_s": round(rate, 1),
        "mib_per_s": round(rate * record_bytes / 2**20, 3),
        "p50_ms": _percentile(lat, 0.50), "p99_ms": _percentile(lat, 0.99),
        "max_ms": max(lat) if lat else None,
        "errors": dict(phase.errors),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'target':<8} {'phase':<8} {'s':>6} {'produce':>8} {'consume':>8} "
          f"{'rec/s':>8} {'MiB/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}  errors")
    for r in rows:
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "0"
        print(f"{r['target']:<8} {r['phase']:<8} {r['seconds']:>6.1f} "
              f"{r['produce_requests']:>8} {r['consume_requests']:>8} "
              f"{r['records_per_s']:>8.1f} {r['mib_per_s']:>7.3f} {_ms(r['p50_ms']):>8} "
              f"{_ms(r['p99_ms']):>8} {_ms(r['max_ms']):>8}  {errors}")


def print_settings(args: argparse.Namespace) -> None:
    print(f"rolling restart benchmark on {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.2f}")
    print(f"  load: {PRODUCERS} producers (1 record of {args.record_bytes} B per request, "
          f"idempotency key, failed attempts resent up to {ATTEMPTS} times) and "
          f"{PARTITIONS} long-poll consumers (max_wait_ms {MAX_WAIT_MS}), "
          f"{PARTITIONS} partitions; the first {WARMUP_ACKS} acknowledgements are a "
          "warm-up, not counted")
    print(f"  brokers: 2 x --workers {WORKERS}, LLOG_DRAIN_S={DRAIN_S}; windows before "
          f"and after the restart: {args.seconds:g} s; reference: 1 broker, no proxy, "
          f"{args.seconds:g} s")
    print("  columns: s = phase length (seconds); produce, consume = HTTP requests sent "
          "(attempts); rec/s, MiB/s = acknowledged records (and record bytes) per second; "
          "p50/p99/max = produce latency in ms, first attempt to acknowledgement; errors = "
          "failed attempts by kind (HTTP status or exception)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proxies", default="caddy,haproxy,nginx",
                        help="comma-separated: caddy, haproxy, nginx")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="baseline and recovery windows, and the reference (s)")
    parser.add_argument("--record-bytes", type=int, default=1024)
    args = parser.parse_args()
    kinds = [k.strip() for k in args.proxies.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in get_args(ProxyKind)]
    if unknown:
        parser.error(f"unknown proxies {unknown}: choose among {get_args(ProxyKind)}")
    print_settings(args)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp_dir, LocalStack(StackConfig.ephemeral(
            Path(tmp_dir), root_prefix=f"bench-{uuid.uuid4().hex[:8]}")) as stack:
        tmp = Path(tmp_dir)
        for phase in run_direct(stack, tmp, args.seconds, args.record_bytes):
            rows.append(figures("direct", phase, args.record_bytes))
        for kind in cast(list[ProxyKind], kinds):
            binary = find_binary(kind)
            if binary is None:
                skipped.append(kind)
                print(f"{kind}: not installed here, skipped (scripts/bootstrap.sh installs "
                      "it as root with apt-get)", flush=True)
                continue
            print(f"{kind}: running", flush=True)
            try:
                phases = run_proxy(kind, binary, stack, tmp, args.seconds, args.record_bytes)
            except (TimeoutError, ProcessFailed) as exc:  # the others still run
                failed[kind] = f"{type(exc).__name__}: {exc}"
                print(f"{kind}: FAILED: {failed[kind]}", flush=True)
                continue
            rows.extend(figures(kind, phase, args.record_bytes) for phase in phases)
    print_table(rows)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"rolling-restart-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    settings = {**vars(args), "producers": PRODUCERS, "partitions": PARTITIONS,
                "workers": WORKERS, "drain_s": float(DRAIN_S), "max_wait_ms": MAX_WAIT_MS,
                "attempts": ATTEMPTS}
    path.write_text(json.dumps({"settings": settings, "skipped": skipped, "failed": failed,
                                "rows": rows,
                                "cpus": os.cpu_count()}, indent=2) + "\n")
    print(f"\nresults: {path.relative_to(REPO_ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
