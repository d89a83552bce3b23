"""Brokers on a replicated Oxia cluster (coordinator, three data servers, replication
factor 3, four shards) while a data server is killed and started again."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from app.compaction.claims import Claims
from app.errors import StorageUnavailable
from app.localstack.oxia_cluster import OxiaClusterConfig
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import CompactorClaim
from app.stores.oxia import notifications as oxia_notifications
from app.stores.oxia import patches as oxia_patches
from tests.helpers.failover import FailoverLoad, late_from, outage_problems
from tests.helpers.selection import starts_servers
from tests.helpers.stack import (
    BrokerFactory,
    Engine,
    broker_factory,
    make_settings,
    open_engine,
    own_stack,
)

pytestmark = pytest.mark.cluster

PARTITIONS = 8
# Compaction runs all the time, so compactors hold ephemeral claims when a server dies.
BROKER = {"compaction_min_entry_age_ms": "500", "compaction_interval_s": "0.3",
          "compaction_discovery_interval_s": "1", "oxia_request_timeout_s": "5"}
# The brokers' Oxia session timeout (BrokerFactory sets it).
SESSION_S = 3.0
# Entries of the lost server's partitions acknowledged in the late part of its outage
# before it comes back (a few seconds' worth on a loaded machine), and the bound on
# each part: generous, so only brokers that stopped acknowledging meet it.
LATE_ACKS = 20
OUTAGE_STEP_S = 60.0
# The bound on each broker's first acknowledgement once the server is back: several
# Oxia call deadlines (5 s) and retry pauses, so only a broker that stopped serving meets it.
SERVED_AGAIN_S = 60.0
# The bound on a notification's arrival: a hang bound on a loaded machine (a stream that
# never resumed never delivers), not a latency claim.
NOTIFIED_S = 60.0


@pytest.fixture
@starts_servers(slow=True)
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # A cluster per test: each one kills, stalls or restarts servers, and the next must
    # not start from a cluster still electing leaders, expiring sessions or bringing a
    # restarted server up to date (with one cluster for the module, a later test's
    # stalled leader once went unreplaced past the test's three-minute bound).
    with own_stack(tmp_path_factory.mktemp("oxia-cluster"),
                   oxia_cluster=OxiaClusterConfig.on_free_ports(3)) as running:
        yield running


@pytest.fixture
def cluster_brokers(cluster: LocalStack, tmp_path: Path) -> Iterator[BrokerFactory]:
    with broker_factory(cluster, tmp_path / "logs") as factory:
        yield factory


def partition_leaders(stack: LocalStack, topic: str, partitions: int) -> dict[int, int]:
    """The data server (node index) leading each of the topic's partitions."""
    assert stack.oxia_cluster is not None
    nodes = [n.public for n in stack.oxia_cluster.nodes]
    client = oxia_patches.connect(stack.oxia_address, request_timeout_s=5)
    try:
        discovery = client._service_discovery
        return {p: nodes.index(discovery._assignments[
            discovery.get_shard(f"{topic}:{p}").shard].leader) for p in range(partitions)}
    finally:
        client.close()


async def keep_down(load: FailoverLoad, lost: set[int], failed_at: float) -> None:
    """Until the lost server's partitions were acknowledged ``LATE_ACKS`` times after
    :func:`late_from`, each step within its own bound: brokers that stop acknowledging
    end the outage at a deadline, and :func:`outage_problems` says what was missing."""
    def start() -> float | None:
        return late_from(load.acked_times(lost, failed_at), failed_at, SESSION_S)

    with anyio.move_on_after(OUTAGE_STEP_S):
        await load.wait_for(lambda: start() is not None)
    late = start()
    if late is None:
        return
    with anyio.move_on_after(late - time.monotonic() + OUTAGE_STEP_S):
        await load.wait_for(lambda: sum(
            1 for t in load.acked_times(lost, failed_at) if t >= late) >= LATE_ACKS)


@pytest.mark.parametrize("failure", ["kill", "pause"])
async def test_a_data_server_lost_and_back_under_load_loses_nothing(
        cluster: LocalStack, cluster_brokers: BrokerFactory, topic: str, failure: str) -> None:
    """``kill``: SIGKILL, then started again on its data. ``pause``: SIGSTOP, then
    SIGCONT: its connections stay open and silent, so calls end at their deadline and the
    coordinator notices only by its health checks. It stays down past the brokers'
    session timeout, and its partitions are acknowledged all through: early (another
    leader took its shards) and late (after any session with it expired)."""
    oxia = cluster.oxia_cluster
    assert oxia is not None
    b1, b2 = cluster_brokers.start(**BROKER), cluster_brokers.start(**BROKER)
    led = partition_leaders(cluster, topic, PARTITIONS)
    victim, _ = Counter(led.values()).most_common(1)[0]
    lost = {p for p, node in led.items() if node == victim}
    load = FailoverLoad([b1.url, b2.url], topic, PARTITIONS)
    with anyio.fail_after(300):
        with anyio.CancelScope() as run:
            async with load.running(cluster):
                await load.wait_acked(150)
                failed_at = time.monotonic()
                (oxia.kill if failure == "kill" else oxia.pause)(victim)
                try:
                    await keep_down(load, lost, failed_at)
                finally:
                    restored_at = time.monotonic()
                    (oxia.restart if failure == "kill" else oxia.resume)(victim)
                # Only entries sent after the failure count: one the lost server had
                # written already, answered just after it failed, shows no takeover.
                problems = outage_problems(load.acked_times(lost, failed_at),
                                           failed_at=failed_at, restored_at=restored_at,
                                           session_s=SESSION_S, late_least=LATE_ACKS)
                if problems:  # more acknowledgements would never come: stop the load
                    run.cancel()
                    await anyio.lowlevel.checkpoint()
                await anyio.to_thread.run_sync(oxia.wait_ready)
                back_at = time.monotonic()
                await load.wait_acked(load.acknowledged + 150)
                await load.wait_all_served_since(back_at, within_s=SERVED_AGAIN_S)
        assert not problems, "\n".join(problems)
        marks = await load.verify(cluster)
    figures = load.figures(failed_at, window_s=5.0).summary()
    back = load.figures(back_at, window_s=5.0).summary()
    lost_late = late_from(load.acked_times(lost, failed_at), failed_at, SESSION_S)
    print(json.dumps({f"oxia_server_{failure}": figures,
                      "down_s": round(restored_at - failed_at, 1),
                      "late_from_s": round((lost_late or failed_at) - failed_at, 1),
                      "back": back, "served_again_s": load.first_acked_since(back_at),
                      "records": sum(marks.values()),
                      "consume_errors": load.consume_errors}))
    # Both brokers, never restarted, kept serving through the failure and after it.
    await load.assert_all_served_since(back_at)
    assert b1.process.alive() and b2.process.alive()


def _leader_index(stack: LocalStack, client: Any, partition_key: str) -> int | None:
    """The data server leading the key's shard, as the client last heard; None while the
    shard has no leader (its assignment names none during an election)."""
    assert stack.oxia_cluster is not None
    discovery = client._service_discovery
    leader = discovery.leaders()[discovery.get_shard(partition_key).shard]
    publics = [n.public for n in stack.oxia_cluster.nodes]
    return publics.index(leader) if leader in publics else None


async def _seconds_until(probe: Any) -> float:
    """Poll ``probe()`` (a coroutine function) until true; the seconds it took. What it
    waits for happens inside the Oxia servers, which report it to no one: callers bound
    it with ``anyio.fail_after``."""
    started = time.monotonic()
    while True:
        if await probe():
            return time.monotonic() - started
        await anyio.sleep(0.1)


@dataclass
class Compactors:
    """Two compactors' claims on one partition, the first holding it at ``version``;
    ``victim`` is the data server leading the partition's shard."""

    engine: Engine
    mine: Claims
    theirs: Claims
    version: int
    victim: int
    # The first compactor's engine: its Oxia client learns of elections on its own.
    mine_engine: Engine

    async def holder(self, tp: TopicPartition) -> CompactorClaim | None:
        found = await self.engine.oxia.get(self.engine.layout.compactor_claim(tp),
                                           tp.partition_key)
        return CompactorClaim.from_json(found.value) if found is not None else None


@contextlib.asynccontextmanager
async def compactors(stack: LocalStack, tp: TopicPartition,
                     session_ms: int = 3000) -> AsyncIterator[Compactors]:
    settings = make_settings(stack, oxia_request_timeout_s=2, oxia_session_timeout_ms=session_ms)
    async with open_engine(settings) as a, open_engine(settings) as b:
        mine, theirs = Claims(a.oxia, a.layout, "a"), Claims(b.oxia, b.layout, "b")
        version = await mine.acquire(tp)
        assert version is not None
        victim = _leader_index(stack, b.oxia.client, tp.partition_key)
        assert victim is not None
        yield Compactors(b, mine, theirs, version, victim, a)


async def test_a_claim_outlives_its_leaders_death(cluster: LocalStack,
                                                 tp: TopicPartition) -> None:
    """Sessions are replicated with the shard: a new leader keeps them, so a compactor's
    claim stays its own while another server takes over."""
    assert cluster.oxia_cluster is not None
    # A session long enough for an election on a loaded machine to end inside it (with the
    # brokers' 3 s one, a slow election expired it: what the next test is about).
    session_s = 15
    async with compactors(cluster, tp, session_ms=session_s * 1000) as c:
        cluster.oxia_cluster.kill(c.victim)
        try:
            async def moved() -> bool:
                leader = _leader_index(cluster, c.engine.oxia.client, tp.partition_key)
                return leader is not None and leader != c.victim
            with anyio.fail_after(120):  # an election on a loaded machine: a hang bound
                await _seconds_until(moved)
            # Past a whole session timeout after the move: only keep-alives that reached
            # the new leader keep the claim.
            await anyio.sleep(session_s + 1)
            found = await c.engine.oxia.get(c.engine.layout.compactor_claim(tp),
                                            tp.partition_key)
            assert found is not None and found.version_id == c.version
            assert await c.theirs.acquire(tp) is None  # still busy
            await c.mine.release(tp, c.version)
            assert await c.holder(tp) is None
        finally:
            cluster.oxia_cluster.restart(c.victim)
            await anyio.to_thread.run_sync(cluster.oxia_cluster.wait_ready)


async def test_a_claim_lost_with_its_session_goes_to_the_next_compactor(
        cluster: LocalStack, tp: TopicPartition) -> None:
    """A leader that stalls longer than the session timeout takes the compactor's
    session with it (its keep-alives go unanswered until the client gives the session
    up, and the new leader expires it): the claim is gone, another compactor takes it,
    and the first one's release leaves the new claim alone; the first compactor claims
    again later under a new session."""
    assert cluster.oxia_cluster is not None
    async with compactors(cluster, tp) as c:
        cluster.oxia_cluster.pause(c.victim)
        try:
            async def taken_over() -> bool:
                try:
                    return await c.theirs.acquire(tp) is not None
                except StorageUnavailable:
                    return False
            # The session expires after its timeout (3 s), once a new leader is elected:
            # seconds when the machine is idle, much longer on a loaded one.
            with anyio.fail_after(180):
                lost_after = await _seconds_until(taken_over)
        finally:
            cluster.oxia_cluster.resume(c.victim)
        # The resumed server may take part in an election: wait until the cluster and the
        # client both know a leader for the partition's shard again.
        await anyio.to_thread.run_sync(cluster.oxia_cluster.wait_ready)

        # Each compactor's client hears of the new assignment on its own stream.
        async def led() -> bool:
            return all(_leader_index(cluster, e.oxia.client, tp.partition_key) is not None
                       for e in (c.engine, c.mine_engine))
        with anyio.fail_after(120):
            await _seconds_until(led)
        await c.mine.release(tp, c.version)  # conditional on our version: theirs survives
        taken = await c.holder(tp)
        assert taken is not None and taken.compactor_id == "b"
        found = await c.engine.oxia.get(c.engine.layout.compactor_claim(tp), tp.partition_key)
        assert found is not None
        await c.theirs.release(tp, found.version_id)

        # A new session for the first compactor. Another election may still follow the
        # resumed server's return; a compactor meeting one tries again on its next round.
        async def claimed_again() -> bool:
            try:
                version = await c.mine.acquire(tp)
            except StorageUnavailable:
                return False
            if version is None:  # their release met the election: it is let go again
                await c.theirs.release(tp, found.version_id)
                return False
            await c.mine.release(tp, version)
            return True
        with anyio.fail_after(120):
            await _seconds_until(claimed_again)
    await anyio.to_thread.run_sync(cluster.oxia_cluster.wait_ready)
    print(json.dumps({"claim_taken_over_after_s": round(lost_after, 1)}))


def test_notification_streams_resume_while_shards_are_idle(cluster: LocalStack) -> None:
    """Streams reopened from their offsets send nothing until their shard changes: the
    reopened streams deliver at once, though every other shard stays idle (waiting for a
    first message from each would hold the active shard's stream back for good)."""
    client = oxia_patches.connect(cluster.oxia_address, request_timeout_s=5)
    resumed = threading.Event()
    notes = oxia_notifications.notifications(client, on_resumed=resumed.set)
    seen: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [seen.put(n.key()) for n in notes], daemon=True).start()
    key = f"notes/{uuid.uuid4().hex}"
    try:
        client.put(key, b"0")
        assert seen.get(timeout=NOTIFIED_S) == key
        notes._teardown_workers()  # as a failed stream does: the streams are reopened
        assert resumed.wait(NOTIFIED_S)
        for i in range(1, 4):
            client.put(key, str(i).encode())
        assert [seen.get(timeout=NOTIFIED_S) for _ in range(3)] == [key] * 3
    finally:
        notes.close()
        client.close()
