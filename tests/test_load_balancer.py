"""Brokers behind a real load balancer (Caddy, HAProxy, nginx with the reference
configurations of deploy/proxy/): a rolling restart under steady load fails nothing,
and a broker killed with -9 fails only what was in flight on it, whose keyed retries
leave no duplicate."""

from __future__ import annotations

import contextlib
import itertools
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from app.errors import StorageUnavailable
from app.localstack.proxy import ProxyKind
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.reader import ReadResult
from tests.helpers.bodies import consume_body
from tests.helpers.proxies import behind
from tests.helpers.stack import Broker, BrokerFactory, Engine, make_settings, open_engine

pytestmark = pytest.mark.slow  # proxies and rolling restarts

PARTITIONS = 4
DRAIN = {"drain_s": "2", "batch_max_delay_ms": "5"}
# Steady, not flooding: each producer waits this long after an answer before its next
# request. A restart lasts seconds, so hundreds of requests still cross it, and the
# machine is left to the brokers and the proxy (a flood only slowed the restarts down).
PACE_S = 0.02


@dataclass
class Proxied:
    url: str
    brokers: list[Broker]
    factory: BrokerFactory


@dataclass
class Load:
    """What steady producers and a consumer saw through the proxy."""

    acked: dict[tuple[int, int], str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    produced: int = 0
    consumed: dict[int, int] = field(default_factory=dict)
    stop: anyio.Event = field(default_factory=anyio.Event)
    progressed: anyio.Event = field(default_factory=anyio.Event)
    # nginx reloads close idle client connections: a request sent on one at that moment
    # fails before any answer; the client resends it with the same key (never twice).
    resend_closed: bool = False
    resent: int = 0

    def ack(self) -> None:
        self.produced += 1
        self.progressed.set()

    async def more(self, count: int) -> None:
        """Until ``count`` more produce requests were acknowledged."""
        target = self.produced + count
        while self.produced < target:
            self.progressed = anyio.Event()
            await self.progressed.wait()


async def _post(client: httpx.AsyncClient, path: str, body: dict[str, Any], load: Load,
                what: str) -> dict[str, Any] | None:
    """The answer's JSON, or None after recording why there is none."""
    try:
        try:
            r = await client.post(path, json=body)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            if not load.resend_closed:
                raise
            load.resent += 1
            r = await client.post(path, json=body)
    except httpx.HTTPError as exc:
        load.failures.append(f"{what}: {type(exc).__name__}: {exc}")
        return None
    if r.status_code != 200:
        load.failures.append(f"{what}: {r.status_code} {r.text[:200]}")
        return None
    answer: dict[str, Any] = r.json()
    return answer


async def _produce(client: httpx.AsyncClient, topic: str, tag: str, load: Load) -> None:
    for i in itertools.count():
        if load.stop.is_set():
            return
        p = i % PARTITIONS
        value = f"{tag}-{i}"
        body = {"topic_partitions": [{"topic": topic, "partition": p, "records": [value],
                                      "idempotency_key": value}]}
        answer = await _post(client, "/produce", body, load, f"produce {value}")
        if answer is not None:
            load.acked[(p, answer["results"][0]["start_offset"])] = value
            load.ack()
        await anyio.sleep(PACE_S)


async def _consume(client: httpx.AsyncClient, topic: str, partition: int, load: Load) -> None:
    offset = 1
    while not load.stop.is_set():
        body = consume_body(topic, offset, partition, max_wait_ms=5000)
        answer = await _post(client, "/consume", body, load, f"consume {partition}")
        if answer is not None:
            offset = answer["results"][0]["next_offset"]
            load.consumed[partition] = offset - 1


async def _until_served(broker: Broker, load: Load) -> None:
    """Until the proxy routes produce requests to ``broker`` again (it counts them)."""
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        for _ in range(300):
            text = (await client.get("/metrics/prometheus")).text
            if 'llog_produce_requests_total{status="200"}' in text:
                return
            await load.more(5)  # the proxy's health check runs every 500 ms
    raise AssertionError(f"the proxy never routed to {broker.url} again")


@contextlib.asynccontextmanager
async def steady_load(url: str, topic: str, *, resend_closed: bool = False
                      ) -> AsyncIterator[Load]:
    load = Load(resend_closed=resend_closed)
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client, \
            anyio.create_task_group() as tg, anyio.create_task_group() as consumers:
        for w in range(4):
            tg.start_soon(_produce, client, topic, f"w{w}", load)
        for p in range(PARTITIONS):
            consumers.start_soon(_consume, client, topic, p, load)
        try:
            yield load
        finally:
            load.stop.set()
            # A consumer's long-poll would run to its end: what it read is checked
            # already, and producers finish the request they have in flight.
            consumers.cancel_scope.cancel()


async def _read(e: Engine, tp: TopicPartition, offset: int) -> ReadResult:
    """A read of the check, tried again while Oxia is unavailable (within a bound), as
    any client of a 503 would: on a loaded machine the check's first connection to Oxia
    may time out, and that says nothing about what the brokers stored."""
    with anyio.fail_after(60):
        while True:
            try:
                return await e.reader.read(tp, offset)
            except StorageUnavailable:
                await anyio.sleep(0.5)


async def _stored(stack: LocalStack, topic: str) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    async with open_engine(make_settings(stack)) as e:
        for p in range(PARTITIONS):
            offset = 1
            while True:
                result = await _read(e, TopicPartition(topic, p), offset)
                out.update({(p, o): bytes(v).decode() for o, v in result.records
                            if isinstance(v, bytes)})
                if result.next_offset > result.high_watermark:
                    break
                offset = result.next_offset
    return out


@pytest.mark.parametrize("kind", ["caddy", "haproxy", "nginx"])
async def test_a_rolling_restart_behind_a_proxy_fails_nothing(
        kind: ProxyKind, brokers: BrokerFactory, stack: LocalStack, tmp_path: Path,
        topic: str) -> None:
    """Caddy and HAProxy route on readiness, so a drained broker has left the pool before
    it stops; open-source nginx cannot see readiness, so the restart takes the broker out
    of its upstream first (a reload), as an operator's rollout would. Behind Caddy (what
    ``llog dev --brokers N`` runs) each broker has two workers, which drain together; the
    other proxies' mechanics are the same with one."""
    workers = 2 if kind == "caddy" else 1
    started = [brokers.start(workers=workers, **DRAIN) for _ in range(2)]
    with behind(kind, started, tmp_path / kind) as proxy:
        url = proxy.url
        async with httpx.AsyncClient(base_url=url, timeout=60) as parked_client:
            parked: dict[str, Any] = {}

            async def park() -> None:  # a long-poll on an idle partition, across it all
                r = await parked_client.post("/consume", json=consume_body(
                    topic + "-idle", 1, max_wait_ms=20_000))
                parked.update(status=r.status_code, body=r.json())

            async with anyio.create_task_group() as tg:
                tg.start_soon(park)
                async with steady_load(url, topic, resend_closed=kind == "nginx") as load:
                    with anyio.fail_after(300):  # generous: a loaded machine restarts slowly
                        for broker in list(started):
                            await load.more(50)
                            if kind == "nginx":
                                proxy.set_down(broker)
                                await load.more(50)  # served by the others since
                            again = await anyio.to_thread.run_sync(brokers.restart, broker)
                            if kind == "nginx":
                                proxy.set_down(None)
                            await _until_served(again, load)
    assert load.failures == [], load.failures[:5]
    assert parked["status"] == 200 and parked["body"]["results"][0]["ok"]
    stored = await _stored(stack, topic)
    assert all(stored.get(k) == v for k, v in load.acked.items())  # nothing lost or moved
    assert len(set(stored.values())) == len(stored)  # nothing twice


async def test_a_killed_broker_fails_only_its_requests_and_keyed_retries_store_once(
        brokers: BrokerFactory, stack: LocalStack, tmp_path: Path, topic: str) -> None:
    started = [brokers.start(workers=1, **DRAIN) for _ in range(2)]
    with behind("caddy", started, tmp_path / "caddy") as proxy:
        url = proxy.url
        acked: dict[str, tuple[int, int]] = {}
        failed_attempts = 0
        hundred = anyio.Event()

        async def produce(client: httpx.AsyncClient, tag: str, n: int) -> None:
            nonlocal failed_attempts
            for i in range(n):
                value = f"{tag}-{i}"
                for _ in range(20):  # retry with the same key until acknowledged
                    try:
                        r = await client.post("/produce", json={"topic_partitions": [{
                            "topic": topic, "partition": i % PARTITIONS,
                            "records": [value], "idempotency_key": value}]})
                    except httpx.HTTPError:
                        failed_attempts += 1
                        continue
                    if r.status_code == 200:
                        res = r.json()["results"][0]
                        acked[value] = (res["partition"], res["start_offset"])
                        if len(acked) >= 100:
                            hundred.set()
                        break
                    failed_attempts += 1
                    await anyio.sleep(0.1)

        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for w in range(4):
                        tg.start_soon(produce, client, f"k{w}", 150)
                    await hundred.wait()
                    started[0].process.signal(signal.SIGKILL)
    assert len(acked) == 600
    assert failed_attempts <= 4  # only what was in flight on the killed broker
    stored = await _stored(stack, topic)
    assert sorted(stored.values()) == sorted(acked)  # every record, each exactly once
    assert all(stored[offset] == value for value, offset in acked.items())


@pytest.mark.parametrize("kind", ["caddy", "haproxy", "nginx"])
async def test_the_broker_sees_the_client_address_through_the_proxy(
        kind: ProxyKind, brokers: BrokerFactory, tmp_path: Path) -> None:
    """The client connects from 127.0.0.5 and the proxy from 127.0.0.1, which the broker
    trusts (LLOG_FORWARDED_ALLOW_IPS): its access log names the client, not the proxy."""
    broker = brokers.start(log_level="info")
    with behind(kind, [broker], tmp_path / kind) as proxy:
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.5")
        async with httpx.AsyncClient(base_url=proxy.url, transport=transport,
                                     timeout=10) as client:
            # A proxy that checks its brokers every 500 ms and takes one out after one
            # slow answer (the reference HAProxy) may hold none for a moment on a loaded
            # machine: its 503 never reaches the broker, so ask again until one does.
            with anyio.fail_after(60):
                while True:
                    r = await client.get("/health/live", params={"probe": kind})
                    if r.status_code != 503:
                        break
                    await anyio.sleep(0.2)
            assert r.status_code == 200
    log_lines = broker.process.log_path.read_text().splitlines()
    seen = [line for line in log_lines if f"probe={kind}" in line]
    assert seen and all("127.0.0.5:" in line for line in seen), seen
