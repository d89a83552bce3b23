"""One history run: a stack, brokers behind fault proxies, clients, the nemesis, the final
reads, the checker, and the files a person reads afterwards.

    .venv/bin/python bench/history.py --minutes 30 --seed 7 [--oxia-cluster]

What it starts (all real processes): Oxia (one server, or with ``oxia_cluster`` Oxia's
coordinator and three data servers with replication factor 3, each behind a
:class:`FaultProxy` its coordinator advertises) and MinIO (``app.localstack``), and two
brokers with ``LLOG_AFFINITY=forward`` (so appends are forwarded between them), each
reaching MinIO through a proxy of its own and reached by its peer through another (its
``LLOG_FORWARD_ADVERTISED_ADDRESS``). Clients: producers (JSON and binary, with and
without idempotency keys, record keys, and one through ``llog_client`` routing to the
appending broker), a poller per partition (fetches and long-polls, JSON and binary
answers), an SSE stream per partition, two consumer groups of two members (one
at-least-once, one at-most-once), all through either broker at random. Written to
``out``: ``history.jsonl`` (every operation), ``report.json`` (counts per outcome and
anomaly, the anomalies with their entries, the faults), ``report.html`` (the plot).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from app.clock import OFFSET_ENV
from app.localstack.broker import broker_process, wait_healthy
from app.localstack.oxia_cluster import OxiaClusterConfig
from app.localstack.processes import ManagedProcess, free_port
from app.localstack.stack import LocalStack, StackConfig
from tests.history import clients, plot
from tests.history.checker import Report, check
from tests.history.clients import (
    BatchingProducer,
    GroupMember,
    Poller,
    Producer,
    RoutingProducer,
    Streamer,
    fetch,
)
from tests.history.model import History, Recorder
from tests.history.nemesis import FAULTS, Nemesis, Server, Target
from tests.history.proxy import FaultProxy

TOPIC, DELETES = "history", "history-deletes"
PARTITIONS, DELETES_PARTITIONS = 4, 2
GROUPS = {"readers-alo": "at_least_once", "readers-amo": "at_most_once"}
SETTLE_S = 15.0  # after healing: forwards in doubt settle, sessions of dead members end


@dataclass
class Broker:
    name: str
    port: int
    env: dict[str, str]
    log: Path
    links: dict[str, FaultProxy]  # "store": to MinIO; "peer": into its forward listener
    code: Path | None = None  # run the broker of this checkout instead of this one's
    process: ManagedProcess | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, clock_offset_ms: int = 0) -> None:
        self.starts += 1
        env = {**self.env, OFFSET_ENV: str(clock_offset_ms)}
        if self.code is not None:
            env["PYTHONPATH"] = f"{self.code}:{self.code / 'clients' / 'python' / 'src'}"
        self.process = broker_process(self.name, self.port, env,
                                      self.log.with_name(f"{self.name}.{self.starts}.log"))
        self.process.cwd = self.code  # `python -m` puts its directory first on the path
        self.process.start()
        wait_healthy(self.process, self.url, timeout=120)

    def reclock(self, offset_ms: int) -> None:
        """Stopped, then started with its clock ``offset_ms`` off the true time."""
        if self.process is not None:
            self.process.signal(18)  # SIGCONT: a paused broker stops on SIGTERM
            self.process.stop(timeout=30)
        self.start(offset_ms)

    def signal(self, sig: int) -> None:
        if self.process is not None:
            self.process.signal(sig)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()


@dataclass
class Run:
    out: Path
    seed: int
    seconds: float
    faults: tuple[str, ...] = FAULTS
    servers: list[Server] = field(default_factory=list)
    extra_producers: int = 0  # more producers with idempotency keys (a denser window),
    # each through one broker (half through each)
    slow_s: tuple[float, float] = (0.5, 8.0)
    brokers: list[Broker] = field(default_factory=list)
    oxia_links: list[tuple[str, FaultProxy]] = field(default_factory=list)
    broker_code: Path | None = None


def run(out: Path, *, seconds: float, seed: int, faults: tuple[str, ...] = FAULTS,
        extra_producers: int = 0, slow_s: tuple[float, float] = (0.5, 8.0),
        client_timeout_s: float = 30.0, oxia_cluster: bool = False,
        broker_code: Path | None = None) -> Report:
    """A whole run into ``out``; the checker's report. ``broker_code``: a checkout (a
    worktree of an older commit) whose broker runs instead of this one's; settings it
    does not know (an advertised forward address, a clock offset) it ignores, and the
    faults on them do nothing."""
    out.mkdir(parents=True, exist_ok=True)
    clients.set_timeout(client_timeout_s)
    spec = Run(out, seed, seconds, faults, extra_producers=extra_producers, slow_s=slow_s,
               broker_code=broker_code)
    with _oxia_proxies(spec, oxia_cluster) as cluster, \
            LocalStack(StackConfig.ephemeral(out / "stack", oxia_cluster=cluster)) as stack, \
            _brokers(spec, stack):
        spec.servers = _servers(stack)
        started = time.monotonic()
        rec = Recorder(out / "history.jsonl", lambda: time.monotonic() - started)
        try:
            nemesis = anyio.run(_drive, spec, rec)
        finally:
            rec.close()
    history = History(rec.entries)
    report = check(history)
    _write(spec, history, report, nemesis)
    return report


def recheck(out: Path, *, seed: int) -> Report:
    """The checker again over the history saved in ``out`` (its report and plot written
    anew): the faults applied are read from the history's nemesis entries."""
    history = History.load(out / "history.jsonl")
    report = check(history)
    faults = [(str(op.asked.get("fault")), str(op.asked.get("target")))
              for op in history.of("nemesis")]
    seconds = max((e.time for e in history.entries), default=0.0)
    _write(Run(out, seed, seconds), history, report, faults)
    return report


@contextlib.contextmanager
def _oxia_proxies(spec: Run, cluster: bool) -> Iterator[OxiaClusterConfig | None]:
    """With ``cluster``: three data servers (replication factor 3), each behind a proxy
    that the coordinator advertises as the server's public address, so every client's
    calls to that server go through it."""
    if not cluster:
        yield None
        return
    config = OxiaClusterConfig.on_free_ports(servers=3, replication=3, shards=4)
    proxies = [FaultProxy("127.0.0.1", config.ports[2 * i]).start() for i in range(3)]
    try:
        spec.oxia_links = [(f"oxia-{i}", p) for i, p in enumerate(proxies)]
        yield dataclasses.replace(config, advertised=tuple(p.address for p in proxies))
    finally:
        for proxy in proxies:
            proxy.stop()


def _servers(stack: LocalStack) -> list[Server]:
    assert stack.minio is not None
    servers = [Server("minio", stack.minio, stack._minio_live)]
    if stack.oxia_cluster is not None:
        cluster = stack.oxia_cluster
        servers += [Server(n.name, n.process, cluster.answers) for n in cluster.nodes]
    else:
        assert stack.oxia is not None
        servers.append(Server("oxia", stack.oxia, stack._oxia_answers))
    return servers


@contextlib.contextmanager
def _brokers(spec: Run, stack: LocalStack) -> Iterator[None]:
    s3_port = int(stack.s3_endpoint.rsplit(":", 1)[1])
    try:
        for i in range(2):
            forward_port = free_port()
            links = {"store": FaultProxy("127.0.0.1", s3_port).start(),
                     "peer": FaultProxy("127.0.0.1", forward_port).start()}
            port = free_port()
            env = {**stack.settings_env(), "LLOG_BROKER_ID": f"b{i + 1}",
                   "LLOG_S3_ENDPOINT": f"http://{links['store'].address}",
                   "LLOG_AFFINITY": "forward", "LLOG_FORWARD_PORT": str(forward_port),
                   "LLOG_FORWARD_ADVERTISED_ADDRESS": links["peer"].address,
                   "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000", "LLOG_DRAIN_S": "0",
                   "LLOG_LOOP_STALL_S": "0"}
            broker = Broker(f"b{i + 1}", port, env, spec.out / "logs" / f"b{i + 1}.log", links,
                            code=spec.broker_code)
            broker.log.parent.mkdir(parents=True, exist_ok=True)
            spec.brokers.append(broker)
            broker.start()
        yield
    finally:
        for broker in spec.brokers:
            broker.signal(18)  # SIGCONT: a paused broker stops on SIGTERM
            if broker.process is not None:
                broker.process.stop()
            for proxy in broker.links.values():
                proxy.stop()


async def _drive(spec: Run, rec: Recorder) -> list[tuple[str, str]]:
    rng = random.Random(spec.seed)
    urls = [b.url for b in spec.brokers]

    def brokers() -> list[str]:
        return urls

    async with httpx.AsyncClient(timeout=clients.TIMEOUT_S) as http:
        for topic, n in ((TOPIC, PARTITIONS), (DELETES, DELETES_PARTITIONS)):
            r = await http.post(f"{urls[0]}/topics", json={"topic": topic, "partitions": n})
            assert r.status_code == 201, r.text
    workers: list[Any] = []
    for i, (idem, binary, keyed) in enumerate([(True, False, False), (False, False, True),
                                               (True, True, False), (False, True, False)]):
        workers.append(Producer(f"p{i}", rec, brokers, TOPIC, PARTITIONS,
                                random.Random(rng.random()), idem=idem, binary=binary,
                                keyed=keyed))
    workers += [Producer(f"px{i}", rec, _through(urls[i % len(urls)]), TOPIC, PARTITIONS,
                         random.Random(rng.random()), idem=True, binary=False, keyed=False)
                for i in range(spec.extra_producers)]
    workers.append(Producer("pd", rec, brokers, DELETES, DELETES_PARTITIONS,
                            random.Random(rng.random()), idem=True, binary=False, keyed=False))
    workers.append(RoutingProducer("pr", rec, urls, TOPIC, PARTITIONS,
                                   random.Random(rng.random())))
    workers.append(BatchingProducer("pb", rec, urls, TOPIC, PARTITIONS,
                                    random.Random(rng.random())))
    for topic, n in ((TOPIC, PARTITIONS), (DELETES, DELETES_PARTITIONS)):
        workers += [Poller(f"r-{topic}-{p}", rec, brokers, topic, p,
                           random.Random(rng.random()), binary=p % 2 == 1) for p in range(n)]
    workers += [Streamer(f"s-{TOPIC}-{p}", rec, brokers, TOPIC, p, random.Random(rng.random()))
                for p in range(PARTITIONS)]
    for group, mode in GROUPS.items():
        workers += [GroupMember(f"{group}-m{j}", rec, brokers, group, TOPIC,
                                random.Random(rng.random()), mode=mode) for j in range(2)]
    targets = [Target(b.name, b.kill, b.signal, _restarter(b), _reclocker(b), b.links)
               for b in spec.brokers]
    nemesis = Nemesis(rec, random.Random(rng.random()), targets,
                      lambda: _delete_topic(rec, urls[0]), faults=spec.faults,
                      servers=spec.servers, oxia_links=spec.oxia_links,
                      slow_s=spec.slow_s, lasting_s=(1.0, max(8.0, spec.slow_s[1])))
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        for worker in workers:
            tg.start_soon(worker.run, stop)
        tg.start_soon(nemesis.run, stop)
        await anyio.sleep(spec.seconds)
        stop.set()
    await nemesis.heal_all()
    await _repair(spec)
    await anyio.sleep(SETTLE_S)
    await _final_reads(rec, urls[0])
    return nemesis.applied


async def _repair(spec: Run) -> None:
    """A broker that reports itself failed or does not answer (its store went away
    under it) is started again before the final reads: a failed broker is replaced, as
    an orchestrator would."""
    async with httpx.AsyncClient(timeout=5) as http:
        for broker in spec.brokers:
            try:
                live = (await http.get(f"{broker.url}/health/live")).status_code == 200
            except httpx.HTTPError:
                live = False
            if not live:
                broker.kill()
                await anyio.to_thread.run_sync(broker.start)


def _through(url: str) -> Any:
    def brokers() -> list[str]:
        return [url]
    return brokers


def _restarter(broker: Broker) -> Any:
    async def restart() -> None:
        await anyio.to_thread.run_sync(broker.start)
    return restart


def _reclocker(broker: Broker) -> Any:
    async def reclock(offset_ms: int) -> None:
        await anyio.to_thread.run_sync(broker.reclock, offset_ms)
    return reclock


async def _delete_topic(rec: Recorder, url: str) -> None:
    """Delete the deletes topic, create it again, and record where its log starts
    moved (``truncate``: records below are gone on purpose)."""
    for p in range(DELETES_PARTITIONS):
        rec.add(f"admin/{p}", "invoke", "truncate", {"topic": DELETES, "partition": p})
    starts: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=clients.TIMEOUT_S) as http:
        with contextlib.suppress(httpx.HTTPError), anyio.move_on_after(90):
            await http.delete(f"{url}/topics/{DELETES}")
            while await _deleting(http, url):  # noqa: ASYNC110 (the API is polled)
                await anyio.sleep(0.2)
            await http.post(f"{url}/topics", json={"topic": DELETES,
                                                   "partitions": DELETES_PARTITIONS})
            described = (await http.get(f"{url}/topics/{DELETES}")).json()
            starts = {s["partition"]: s["log_start_offset"]
                      for s in described.get("partition_states", ())}
    for p in range(DELETES_PARTITIONS):
        if p in starts:
            rec.add(f"admin/{p}", "ok", "truncate", {"topic": DELETES, "partition": p,
                                                     "log_start": starts[p]})
        else:
            rec.add(f"admin/{p}", "info", "truncate", {})


async def _deleting(http: httpx.AsyncClient, url: str) -> bool:
    r = await http.get(f"{url}/topics/{DELETES}")
    return r.status_code == 200 and r.json().get("status") == "deleting"


async def _final_reads(rec: Recorder, url: str) -> None:
    async with httpx.AsyncClient(timeout=60) as http:
        for topic, n in ((TOPIC, PARTITIONS), (DELETES, DELETES_PARTITIONS)):
            for p in range(n):
                await _final_read(rec, http, url, topic, p)
        for group in GROUPS:
            r = await http.get(f"{url}/groups/{group}")
            for part in r.json().get("partitions", ()) if r.status_code == 200 else ():
                rec.add("final", "invoke", "final_group", {"group": group})
                rec.add("final", "ok", "final_group", {
                    "group": group, "topic": part["topic"], "partition": part["partition"],
                    "committed": part.get("committed_offset")})


async def _final_read(rec: Recorder, http: httpx.AsyncClient, url: str, topic: str,
                      p: int) -> None:
    rec.add("final", "invoke", "final_read", {"topic": topic, "partition": p})
    records: list[list[Any]] = []
    offset: int | str = "earliest"
    log_start: int | None = None
    while True:
        result = await fetch(http, url, topic, p, offset, 0)
        if not result.get("ok"):
            raise RuntimeError(f"the final read of {topic}/{p} failed: {result}")
        log_start = result.get("log_start_offset") if log_start is None else log_start
        records += result["records"]
        if not result["records"] or int(result["next_offset"]) > int(result["high_watermark"]):
            break
        offset = int(result["next_offset"])
    start = int(log_start if log_start is not None else records[0][0] if records else 1)
    rec.add("final", "ok", "final_read", {"topic": topic, "partition": p,
                                          "log_start": start, "records": records})


def _write(spec: Run, history: History, report: Report, faults: list[tuple[str, str]]
           ) -> None:
    summary = {**report.summary(), "seed": spec.seed, "seconds": spec.seconds,
               "faults": [{"fault": f, "target": t} for f, t in faults],
               "anomaly_details": {k: [{"what": a.what, "entries": list(a.entries)}
                                       for a in v[:50]]
                                   for k, v in report.anomalies.items() if v}}
    (spec.out / "report.json").write_text(json.dumps(summary, indent=1))
    (spec.out / "report.html").write_text(plot.html(history, report, spec.seed))
