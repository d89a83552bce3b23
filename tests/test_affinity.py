"""Affinity on real brokers (in process, on the real stack): each partition's records are
appended by its preferred member, the others' forwarded there, so two brokers writing
the same partitions no longer collide on their control records; and a member that goes
away leaves its partitions to the others without losing an acknowledged record."""

from __future__ import annotations

import collections
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from app.broker import appends, cluster_side
from app.broker.assembly import Broker
from app.broker.cluster_side import ClusterSide
from app.factory import create_app
from app.localstack.processes import free_port
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from llog_client import AsyncLlogClient
from llog_client._config import Routing
from llog_client._routing import DIGEST_HEADER
from tests.helpers.holding_proxy import holding_proxy
from tests.helpers.stack import make_settings

PARTITIONS = 8
WAIT_S = 60


@contextlib.asynccontextmanager
async def _broker(stack: LocalStack, prefix: str, broker_id: str, **options: Any
                  ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    settings = make_settings(stack, broker_id=broker_id, root_prefix=prefix,
                             affinity="forward", auto_create_partitions=PARTITIONS,
                             drain_s=0, membership_refresh_s=0.2,
                             advertised_url=f"http://{broker_id}", **options)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield app, client


async def _sees(app: FastAPI, members: int) -> None:
    broker: Broker = app.state.broker
    assert isinstance(broker.members, ClusterSide)
    membership = broker.members.membership
    with anyio.fail_after(WAIT_S):
        while len(membership.view().members) != members:
            await membership.next_change()


def _counter(text: str, name: str, **labels: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == name
               for s in f.samples if s.name.endswith("_total")
               and all(s.labels.get(k) == v for k, v in labels.items()))


def _gauge(text: str, name: str) -> float:
    (value,) = [s.value for f in text_string_to_metric_families(text) if f.name == name
                for s in f.samples]
    return value


async def _produce(client: httpx.AsyncClient, topic: str, tag: str, *, keyed: bool = False
                   ) -> list[dict[str, Any]]:
    entries = []
    for p in range(PARTITIONS):
        entry: dict[str, Any] = {"topic": topic, "partition": p, "records": [f"{tag}-{p}"]}
        if keyed:
            entry["idempotency_key"] = f"{tag}-{p}"
        entries.append(entry)
    r = await client.post("/produce", json={"topic_partitions": entries})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


async def _read_all(client: httpx.AsyncClient, topic: str, partition: int) -> list[str]:
    r = await client.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": partition, "fetch_offset": 1}], "max_wait_ms": 0})
    (result,) = r.json()["results"]
    assert result["ok"], result
    offsets = [rec["offset"] for rec in result["records"]]
    assert offsets == list(range(1, len(offsets) + 1))  # contiguous, no gap, no repeat
    return [rec["value"] for rec in result["records"]]


async def test_two_brokers_append_each_partition_at_its_preferred_member_without_conflicts(
        stack: LocalStack) -> None:
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    async with _broker(stack, prefix, "a") as (app_a, a), _broker(stack, prefix, "b") as (
            app_b, b):
        await _sees(app_a, 2)
        await _sees(app_b, 2)
        view = app_a.state.broker.members.view()
        preferred = {p: view.preferred(TopicPartition(topic, p)) for p in range(PARTITIONS)}
        assert {m.member_id for m in preferred.values() if m} == {"a.w0", "b.w0"}
        # Both brokers write every partition, one request after the other.
        for i in range(6):
            results = await _produce(a if i % 2 else b, topic, f"r{i}")
            assert [r["start_offset"] for r in results] == [i + 1] * PARTITIONS
        for p in range(PARTITIONS):
            assert await _read_all(a, topic, p) == [f"r{i}-{p}" for i in range(6)]
        text_a = (await a.get("/metrics/prometheus")).text
        text_b = (await b.get("/metrics/prometheus")).text
        for text in (text_a, text_b):
            # Two members share the one eager flush of the default budget.
            assert _gauge(text, "llog_batcher_eager_flushes") == 0.5
            assert _counter(text, "llog_commit_cas_conflicts") == 0
            assert _counter(text, "llog_affinity_groups", route="forwarded") > 0
            assert _counter(text, "llog_affinity_groups", route="fallback") == 0


async def test_a_member_that_leaves_hands_its_partitions_to_the_others(
        stack: LocalStack) -> None:
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    async with _broker(stack, prefix, "a") as (app_a, a):
        async with _broker(stack, prefix, "b") as (app_b, _b):
            await _sees(app_a, 2)
            await _produce(a, topic, "before", keyed=True)
            await app_b.state.broker.drain()  # leaves the cluster, then stops
        await _sees(app_a, 1)
        results = await _produce(a, topic, "after", keyed=True)
        assert all(r["ok"] and r["start_offset"] == 2 for r in results)
        for p in range(PARTITIONS):
            assert await _read_all(a, topic, p) == [f"before-{p}", f"after-{p}"]
        text = (await a.get("/metrics/prometheus")).text
        assert _counter(text, "llog_affinity_groups", route="in_doubt") == 0
        assert _gauge(text, "llog_batcher_eager_flushes") == 1  # the whole budget again


class _ByHost(httpx.AsyncBaseTransport):
    """The in-process brokers as their advertised URLs (``http://{broker_id}``)."""

    def __init__(self, apps: dict[str, FastAPI]) -> None:
        self._apps = {host: httpx.ASGITransport(app=app) for host, app in apps.items()}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._apps[request.url.host].handle_async_request(request)


@pytest.mark.parametrize("route", ["preferred", "any"])
async def test_a_client_that_routes_sends_each_partition_to_its_preferred_broker(
        stack: LocalStack, route: Routing) -> None:
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    async with _broker(stack, prefix, "a") as (app_a, a), _broker(stack, prefix, "b") as (
            app_b, b):
        await _sees(app_a, 2)
        await _sees(app_b, 2)
        transport = _ByHost({"a": app_a, "b": app_b})
        async with AsyncLlogClient("http://a", route=route, transport=transport) as llog:
            for p in range(PARTITIONS):
                for i in range(3):
                    result = await llog.produce(topic, [f"{p}-{i}"], partition=p)
                    assert result.batches[0].start_offset == i + 1
        for p in range(PARTITIONS):
            assert await _read_all(a, topic, p) == [f"{p}-{i}" for i in range(3)]
        texts = [(await c.get("/metrics/prometheus")).text for c in (a, b)]
        forwarded = sum(_counter(t, "llog_affinity_groups", route="forwarded") for t in texts)
        local = [_counter(t, "llog_affinity_groups", route="local") for t in texts]
        if route == "preferred":  # every request met its partition's appender
            assert forwarded == 0 and all(n > 0 for n in local)
        else:  # all through broker a: b's partitions took the hop
            assert forwarded > 0 and local[1] == 0
        digest = app_a.state.broker.members.view().digest
        r = await a.post("/produce", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "records": ["x"]}]})
        assert r.headers[DIGEST_HEADER] == digest


async def test_a_forward_a_slow_store_left_unanswered_is_written_once_past_the_key_window(
        stack: LocalStack) -> None:
    """Broker b's object store is held (a proxy in front of MinIO holds its writes) when
    broker a forwards it ten keyed records: b's flush takes the frame and waits on its
    PUT, and a's wait for an answer runs out. a answers them in doubt, and the client
    sends them again under their keys at once (b, which left a frame unanswered, is
    passed over: they are appended by a); then seventy more keyed records of the
    partition go in (more than the 64 keys a partition remembers), and only then is b's
    store let go. Before the frames' fences, a appended the ten itself and b's flush
    committed them a second time; with fences alone, the client's resend was the first
    copy and b's late flush the second. Now a answers in doubt only once b can no longer
    commit the frame (docs/protocol.md, Forward fences): b's flush, past the frame's
    commit window, commits none of it, and every key is stored at exactly one offset."""
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    host, port = httpx.URL(stack.s3_endpoint).host, httpx.URL(stack.s3_endpoint).port
    assert port is not None
    with anyio.fail_after(120):
        # a passes b over (a peer that left a frame unanswered) for its session timeout
        # plus a membership refresh: long enough for the resend and the seventy.
        async with holding_proxy(host, port) as proxy, \
                _broker(stack, prefix, "a", forward_deadline_ms=2_000,
                        forward_answer_timeout_ms=300, oxia_request_timeout_s=2,
                        oxia_session_timeout_ms=20_000) as (app_a, a), \
                _broker(stack, prefix, "b", s3_endpoint=proxy.url,
                        oxia_request_timeout_s=2) as (app_b, b):
            await _sees(app_a, 2)
            view = app_a.state.broker.members.view()
            p = next(p for p in range(PARTITIONS)
                     if view.preferred(TopicPartition(topic, p)).member_id == "b.w0")
            await _produce_keyed(a, topic, p, ["warm-up"])  # the topic exists
            received = await _received(b)
            proxy.hold()
            first = [f"first-{i}" for i in range(10)]
            answered = await _produce_keyed(a, topic, p, first)
            in_doubt = [v for v, r in zip(first, answered, strict=True) if not r["ok"]]
            assert all(r["error_type"] == "CommitInDoubt" for r in answered if not r["ok"])
            again = await _produce_keyed(a, topic, p, in_doubt)  # the client's resend
            assert all(r["ok"] for r in again), again
            second = [f"second-{i}" for i in range(70)]
            assert all(r["ok"] for r in await _produce_keyed(a, topic, p, second))
            proxy.release()
            await _until_received(b, received + len(first))  # b's held flush is over
            values = await _read_all(a, topic, p)
            text_a = (await a.get("/metrics/prometheus")).text
            text_b = (await b.get("/metrics/prometheus")).text
    stored = collections.Counter(values)
    assert {v: n for v, n in stored.items() if n != 1} == {}
    assert set(stored) == {"warm-up", *first, *second}
    # The path the story is about: b took the frame, a's claim on it lost, a appended
    # none of it itself, and b's late flush committed none of it.
    assert _counter(text_b, "llog_forward_fences", side="receiver", outcome="taken") >= 1
    assert _counter(text_a, "llog_forward_fences", side="forwarder", outcome="taken") == 1
    assert in_doubt == first
    assert _counter(text_b, "llog_forward_received_groups", outcome="expired") >= len(first)


async def test_a_forward_answered_after_its_timeout_is_settled_by_that_answer(
        stack: LocalStack) -> None:
    """Broker b commits ten keyed records a forwarded, but its answer is held on the
    way back (a proxy in front of b's forward listener), so a's wait runs out and a
    finds b took the frame. Before, a answered them in doubt once the frame's window was
    over, whatever b said meanwhile, and the client sent them again: a second copy once
    more keyed appends than the partition remembers had come in between (the history
    checker found it so, with Oxia paused under b's commit). Now the frame keeps its
    place on the connection until then: b's answer, released after a's timeout, settles
    the records as written, at b's offsets, and nothing is left for a client to resend."""
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    forward_port = free_port()
    with anyio.fail_after(120):
        async with holding_proxy("127.0.0.1", forward_port, answers=True) as proxy, \
                _broker(stack, prefix, "a", forward_deadline_ms=2_000,
                        forward_answer_timeout_ms=300) as (app_a, a), \
                _broker(stack, prefix, "b", forward_port=forward_port,
                        forward_advertised_address=f"127.0.0.1:{proxy.port}"
                        ) as (app_b, b):
            await _sees(app_a, 2)
            view = app_a.state.broker.members.view()
            p = next(p for p in range(PARTITIONS)
                     if view.preferred(TopicPartition(topic, p)).member_id == "b.w0")
            await _produce_keyed(a, topic, p, ["warm-up"])  # connected, the topic exists
            received = await _received(b)
            proxy.hold()
            first = [f"first-{i}" for i in range(10)]
            async with anyio.create_task_group() as tg:
                answered: list[dict[str, Any]] = []

                async def produce() -> None:
                    answered.extend(await _produce_keyed(a, topic, p, first))

                tg.start_soon(produce)
                await _until_received(b, received + len(first))  # b committed them
                await _until_counted(a, "llog_forward_frames", outcome="timeout")
                proxy.release()
            values = await _read_all(a, topic, p)
            text_a = (await a.get("/metrics/prometheus")).text
    assert all(r["ok"] for r in answered), answered
    assert [r["start_offset"] for r in answered] == list(range(2, 12))
    assert values == ["warm-up", *first]
    assert _counter(text_a, "llog_forward_fences", side="forwarder", outcome="taken") == 1
    assert _counter(text_a, "llog_forward_frames", outcome="late") == 1
    assert _counter(text_a, "llog_affinity_groups", route="fallback") == 0


async def _until_counted(client: httpx.AsyncClient, name: str, **labels: str) -> None:
    """Until the broker's counter ``name`` (with ``labels``) is above 0: polled, bounded."""
    with anyio.fail_after(WAIT_S):
        while True:
            if _counter((await client.get("/metrics/prometheus")).text, name, **labels):
                return
            await anyio.sleep(0.05)


@pytest.mark.parametrize("held_s", [0.0, 1.0], ids=["released", "held-past-the-bound"])
async def test_a_broker_that_stops_answers_the_frames_it_took_before_it_goes(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch, held_s: float) -> None:
    """Broker a forwards ten keyed records to b, whose object store is held, and b is
    stopped while its flush of them waits on the PUT: b reads no new frames, its last
    flushes commit what it took, and it answers those frames before its listener goes,
    so a answers the records written, at b's offsets; also when the store is held for
    longer than b gives its answers to go out (shortened here to 0.2 s), which counts
    from the end of its last flush. Before, b's shutdown cut the frame's connection as
    its flush committed the records: a answered them in doubt, and a client's resend
    could be a second copy (the history checker found one, a broker restarted under a
    forward)."""
    monkeypatch.setattr(appends, "FORWARD_DRAIN_S", 0.2)
    monkeypatch.setattr(cluster_side, "FORWARD_DRAIN_S", 0.2)
    prefix, topic = f"aff-{uuid.uuid4().hex[:8]}", "orders"
    host, port = httpx.URL(stack.s3_endpoint).host, httpx.URL(stack.s3_endpoint).port
    assert port is not None
    stop_b = anyio.Event()

    async def run_b(proxy_url: str, *, task_status: anyio.abc.TaskStatus[FastAPI]) -> None:
        async with _broker(stack, prefix, "b", s3_endpoint=proxy_url) as (app_b, _):
            task_status.started(app_b)
            await stop_b.wait()  # then b stops, in the task that started it

    with anyio.fail_after(120):
        async with holding_proxy(host, port) as proxy, \
                _broker(stack, prefix, "a", forward_answer_timeout_ms=60_000) as (app_a, a), \
                anyio.create_task_group() as tg:
            app_b = await tg.start(run_b, proxy.url)
            await _sees(app_a, 2)
            view = app_a.state.broker.members.view()
            p = next(p for p in range(PARTITIONS)
                     if view.preferred(TopicPartition(topic, p)).member_id == "b.w0")
            await _produce_keyed(a, topic, p, ["warm-up"])  # connected, the topic exists
            proxy.hold()
            first = [f"first-{i}" for i in range(10)]
            answered: list[dict[str, Any]] = []
            async with anyio.create_task_group() as requests:
                async def produce() -> None:
                    answered.extend(await _produce_keyed(a, topic, p, first))

                requests.start_soon(produce)
                await anyio.to_thread.run_sync(proxy.holding.wait, 60)  # b's flush waits
                stop_b.set()  # b stops with the frame in its flush
                await _until_stopping(app_b)
                await anyio.sleep(held_s)  # the store stays slow past the bound
                proxy.release()
            values = await _read_all(a, topic, p)
            text_a = (await a.get("/metrics/prometheus")).text
    assert all(r["ok"] for r in answered), answered
    assert values == ["warm-up", *first]
    assert _counter(text_a, "llog_affinity_groups", route="forwarded") >= len(first)
    assert _counter(text_a, "llog_affinity_groups", route="in_doubt") == 0


async def _until_stopping(app: FastAPI) -> None:
    """Until the broker's shutdown has begun (its state says so: polled, bounded)."""
    with anyio.fail_after(WAIT_S):
        while True:
            if app.state.broker.health.status == "stopping":
                return
            await anyio.sleep(0.01)


async def _produce_keyed(client: httpx.AsyncClient, topic: str, partition: int,
                         values: list[str]) -> list[dict[str, Any]]:
    """One request, an entry per value keyed by the value itself."""
    r = await client.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": partition, "records": [v], "idempotency_key": v}
        for v in values]})
    assert r.status_code in (200, 207, 409), r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


async def _received(client: httpx.AsyncClient) -> float:
    """Forwarded groups the broker has answered, with its log's outcome or as expired
    (a flush that took them and then did not commit them)."""
    text = (await client.get("/metrics/prometheus")).text
    return sum(_counter(text, "llog_forward_received_groups", outcome=outcome)
               for outcome in ("appended", "expired"))


async def _until_received(client: httpx.AsyncClient, groups: float) -> None:
    """Until the broker has answered ``groups`` forwarded groups (its flush of them is
    over). Its metrics are the only outside view of that: polled,
    bounded."""
    with anyio.fail_after(WAIT_S):
        while True:
            if await _received(client) >= groups:
                return
            await anyio.sleep(0.05)
