"""Membership inside brokers on the real stack: GET /cluster lists the members, a broker
drains out of the cluster, and each worker of `llog serve --workers 2` is a member whose
replacement takes its id back."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import anyio
import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.broker.assembly import Broker
from app.broker.cluster_side import ClusterSide, Solo
from app.broker.loop_watchdog import STALLED_EXIT
from app.cluster.members import BrokerMember
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage.keys import MEMBERS_PARTITION_KEY, KeyLayout
from tests.helpers.stack import BrokerFactory, make_settings, open_engine

WAIT_S = 60


def _members_gauge(text: str) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text)
            if f.name == "llog_membership_members" for s in f.samples]


async def test_a_member_announces_its_advertised_forward_address(stack: LocalStack) -> None:
    """LLOG_FORWARD_ADVERTISED_ADDRESS: the others reach the listener there (a proxy, a
    Service), so the membership record names it instead of where the listener binds."""
    settings = make_settings(stack, broker_id=f"c{uuid.uuid4().hex[:8]}", affinity="forward",
                             forward_advertised_address="forwards.example:9300", drain_s=0)
    app = create_app(settings)
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with open_engine(settings) as operator, app.router.lifespan_context(app):
        cluster = _cluster(app.state.broker)
        found = await operator.oxia.get(layout.member(f"{settings.broker_id}.w0"),
                                        MEMBERS_PARTITION_KEY)
        assert found is not None
        assert BrokerMember.from_record(found.value).forward == "forwards.example:9300"
        assert cluster.address == "forwards.example:9300"


def test_an_advertised_forward_address_is_a_host_and_port(stack: LocalStack) -> None:
    for bad in ("forwards.example", "http://forwards.example:9300", "a b:1", "b:99999",
                "a..b:9300", "b:0"):
        with pytest.raises(ValueError, match="forward_advertised_address"):
            make_settings(stack, forward_advertised_address=bad)


async def test_a_broker_with_affinity_lists_itself_and_leaves_when_it_drains(
        stack: LocalStack) -> None:
    broker_id = f"c{uuid.uuid4().hex[:8]}"
    settings = make_settings(stack, broker_id=broker_id, affinity="forward",
                             advertised_url="http://b.example:8080/", drain_s=0)
    app = create_app(settings)
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    me = f"{broker_id}.w0"
    async with open_engine(settings) as operator, app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                              base_url="http://broker") as client:
        broker: Broker = app.state.broker
        cluster = _cluster(broker)
        body = (await client.get("/cluster")).json()
        assert body["algorithm"] == "rendezvous-sha256" and len(body["digest"]) == 12
        mine = [m for m in body["members"] if m["member_id"] == me]
        assert mine == [{"member_id": me, "broker_id": broker_id,
                         "url": "http://b.example:8080", "roles": list(settings.roles)}]
        assert _members_gauge((await client.get("/metrics/prometheus")).text) == [
            len(body["members"])]
        found = await operator.oxia.get(layout.member(me), MEMBERS_PARTITION_KEY)
        # The forward listener listens before the member registers: the record names it.
        assert cluster.address.startswith("127.0.0.1:")
        assert found is not None
        assert BrokerMember.from_record(found.value).forward == cluster.address
        # A new address is announced in the record.
        cluster.membership.update_me("127.0.0.1:4711")
        with anyio.fail_after(WAIT_S):
            while cluster.membership.registrations < 2:
                await cluster.membership.next_change()
        found = await operator.oxia.get(layout.member(me), MEMBERS_PARTITION_KEY)
        assert found is not None
        assert BrokerMember.from_record(found.value).forward == "127.0.0.1:4711"
        await broker.drain()
        assert await operator.oxia.get(layout.member(me), MEMBERS_PARTITION_KEY) is None
        assert me not in [m["member_id"] for m in (await client.get("/cluster")).json()[
            "members"]]


async def test_a_broker_without_affinity_has_no_members(stack: LocalStack) -> None:
    app = create_app(make_settings(stack))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        r = await client.get("/cluster")
        assert r.status_code == 200 and r.json()["members"] == []
        assert isinstance(app.state.broker.members, Solo)
        assert _members_gauge((await client.get("/metrics/prometheus")).text) == []


def _cluster(broker: Broker) -> ClusterSide:
    """The broker as a cluster member (LLOG_AFFINITY on)."""
    assert isinstance(broker.members, ClusterSide)
    return broker.members


async def _members(url: str, prefix: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        body = (await client.get("/cluster")).json()
    return {m["member_id"]: m for m in body["members"] if m["member_id"].startswith(prefix)}


@pytest.mark.slow
async def test_each_worker_is_a_member_and_a_replacement_takes_its_slot(
        stack: LocalStack, brokers: BrokerFactory) -> None:
    broker_id = f"w{uuid.uuid4().hex[:8]}"
    broker = brokers.start(workers=2, broker_id=broker_id, affinity="forward",
                           membership_refresh_s="0.2")
    ids = {f"{broker_id}.w0", f"{broker_id}.w1"}
    settings = make_settings(stack)
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)

    async def records() -> dict[str, BrokerMember]:
        found = await operator.oxia.range_scan(layout.members_prefix(),
                                               layout.members_prefix() + "~",
                                               MEMBERS_PARTITION_KEY)
        out = {}
        for r in found:
            member_id = layout.parse_member_key(r.key)
            if member_id in ids:
                out[member_id] = r
        return {k: BrokerMember.from_record(v.value) for k, v in out.items()}

    async with open_engine(settings) as operator:
        # Another process's state is polled: there is no event to wait on across processes.
        with anyio.fail_after(WAIT_S):
            while True:
                if set(await _members(broker.url, broker_id)) == ids:
                    break
                await anyio.sleep(0.2)
        before = await records()
        assert set(before) == ids
        workers = psutil.Process(broker.process.pid).children()
        victim = next(p for p in workers if "spawn_main" in " ".join(p.cmdline()))
        os.kill(victim.pid, signal.SIGKILL)
        # Its replacement takes the freed slot: the same id, a new incarnation.
        with anyio.fail_after(WAIT_S):
            while True:
                now = await records()
                changed = {k for k in ids if k in now and now[k].incarnation
                           != before[k].incarnation}
                if set(now) == ids and changed:
                    break
                await anyio.sleep(0.2)
        assert len(changed) == 1


async def test_a_worker_whose_loop_hangs_leaves_the_view_and_exits(
        brokers: BrokerFactory) -> None:
    """The Oxia client keeps a session alive from threads of its own, so a worker whose
    event loop hangs would stay a member (peers forwarding to it) for as long as the
    hang. Its watchdog ends the session and the process once the loop has not run for
    LLOG_LOOP_STALL_S: the peer's view drops it long before the hang (60 s) would end,
    and far sooner than never."""
    prefix = f"h{uuid.uuid4().hex[:8]}"
    common = {"affinity": "forward", "membership_refresh_s": "0.2"}
    hung = brokers.start(broker_id=f"{prefix}-hung", loop_stall_s="2",
                         test_loop_blocker="1", test_loop_block_s="60", **common)
    peer = brokers.start(broker_id=f"{prefix}-peer", **common)
    with anyio.fail_after(WAIT_S):  # another process's view: polled, no event to wait on
        while True:
            if len(await _members(peer.url, prefix)) == 2:
                break
            await anyio.sleep(0.2)
    os.kill(hung.process.pid, signal.SIGUSR2)  # its loop blocks for 60 s from now
    with anyio.fail_after(30):  # a bound far below the hang, which only catches "never"
        while True:
            if not await _members(peer.url, f"{prefix}-hung"):
                break
            await anyio.sleep(0.2)
    # Ended by its watchdog (status 70), not by the hang's end nor by the test.
    assert await anyio.to_thread.run_sync(hung.process.wait, 30) == STALLED_EXIT
