"""Affinity under faults, on broker processes behind Caddy with producers and long-poll
consumers running through it: a broker killed with -9, a broker that hangs (SIGSTOP) and
is then killed, and a broker added.

Each broker (LLOG_AFFINITY=forward) appends the partitions it prefers and forwards the
others to their preferred member. A kill leaves the survivors forwarding to a dead
member until its session expires; those forwards must fall back (nothing was written)
or, for a frame in flight, be settled by its fence (docs/protocol.md). So
the only requests that may fail are those the proxy had sent to the killed broker
itself, and what is stored is what was acknowledged, once each, at contiguous offsets
(:class:`~tests.helpers.failover.FailoverLoad` checks storage and every consumer).

"Did not go to the killed broker" through a proxy: a client cannot tell which broker
served it, but each producer has one request outstanding at a time, Caddy sends a
request to another broker when it cannot connect, and never resends one that reached
a broker. So a request sent after the kill never reaches the dead broker, and of those
sent before it only the ones in flight on it can fail: at most one per producer, each
sent before the kill and answered "maybe written" (the proxy's 502 or a cut connection).

A hung broker adds one more way to fail: a survivor's forward to it gets no answer, and
if the hung broker had taken the frame (its fence says so), the requests with a group in
it are answered CommitInDoubt (an entry with its producer's sequence is then sent again
under it: seconds later, after more appends than a partition remembers idempotency keys
of, so sequences, not keys, keep it single). A
producer may meet that more than once (its next request can go to the other survivor,
whose frames to the hung broker are still waiting), but each survivor sends the hung
broker no frame after one went unanswered: at most the lane's two frames in flight go
unanswered per survivor, and the groups queued behind them are appended by the survivor
itself.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.localstack.processes import free_port
from app.localstack.stack import LocalStack
from llog_client import AsyncLlogClient, RetryPolicy
from tests.helpers.failover import FailoverLoad, read_all
from tests.helpers.proxies import behind
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = pytest.mark.slow  # broker processes behind a proxy

PARTITIONS = 16
PRODUCERS = 8
# Entries of distinct partitions per produce request, so nearly every request a survivor
# takes has a group for the killed broker's partitions (the load has 16).
ENTRIES = 8
LANE_FRAMES_IN_FLIGHT = 2  # AffinityRouter's lane_inflight
UNKNOWN_FRAME_OUTCOMES = ("broken", "timeout", "closed")  # llog_forward_frames{outcome}
SESSION_TIMEOUT_S = 3.0
REFRESH_S = 0.5
# Preferences settle once the dead member's session expires and each survivor lists the
# members again; the slack is for a loaded machine, where a keep-alive or a listing may
# run late, and it bounds the wait: it is not what the test measures.
SETTLE_SLACK_S = 15.0
AFFINITY = {
    "affinity": "forward",
    "forward_host": "127.0.0.1",
    "oxia_session_timeout_ms": str(int(SESSION_TIMEOUT_S * 1000)),
    "membership_refresh_s": str(REFRESH_S),
    "auto_create_partitions": str(PARTITIONS),
    "batch_max_delay_ms": "5",
}


def _start(brokers: BrokerFactory, prefix: str, name: str, port: int | None = None
           ) -> Broker:
    # A key space of the test's own: no member of another test is in its views.
    settings = {**AFFINITY, "broker_id": name, "root_prefix": prefix}
    if port is None:
        return brokers.start(workers=1, log_level="warning", **settings)
    return brokers.start_on(port, workers=1, log_level="warning", **settings)


def _member(name: str) -> str:
    return f"{name}.w0"  # one worker: slot 0


async def _views(client: httpx.AsyncClient, urls: Iterable[str]) -> list[set[str]]:
    views = []
    for url in urls:
        r = await client.get(f"{url}/cluster")
        assert r.status_code == 200, r.text
        views.append({m["member_id"] for m in r.json()["members"]})
    return views


async def _until_views(urls: list[str], members: set[str], within_s: float) -> float:
    """Until every broker at ``urls`` sees exactly ``members``; seconds it took. Views
    change inside other processes, with no event to wait on: polled, and bounded."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=10) as client:
        with anyio.fail_after(within_s):
            while True:
                if all(v == members for v in await _views(client, urls)):
                    return time.monotonic() - started
                await anyio.sleep(0.1)


async def _counter(brokers: Iterable[Broker], name: str, **labels: str) -> float:
    """The sum of counter ``name`` (samples matching ``labels``) over ``brokers``."""
    total = 0.0
    async with httpx.AsyncClient(timeout=10) as client:
        for broker in brokers:
            text = (await client.get(f"{broker.url}/metrics/prometheus")).text
            total += sum(s.value for f in text_string_to_metric_families(text)
                         if f.name == name for s in f.samples if s.name.endswith("_total")
                         and all(s.labels.get(k) == v for k, v in labels.items()))
    return total


async def test_a_broker_killed_under_load_fails_only_what_was_in_flight_on_it(
        brokers: BrokerFactory, stack: LocalStack, tmp_path: Path) -> None:
    """kill -9 at a moment of the load's choosing: whatever it was doing."""
    await _kill_under_load(brokers, stack, tmp_path, keyed=True, hang_first=False)


@pytest.mark.parametrize("keyed", [True, False], ids=["sequenced", "keyless"])
async def test_a_hung_broker_killed_under_load_leaves_forwards_in_doubt_and_resolved(
        keyed: bool, brokers: BrokerFactory, stack: LocalStack, tmp_path: Path) -> None:
    """The broker hangs (SIGSTOP) before its kill -9: the survivors' forwards to it get
    no answer, so their outcome is unknown, surely. Each frame's fence settles it: what
    the hung broker had not taken is appended by the survivor, what it had taken is
    answered CommitInDoubt (entries with their producer's sequence are then sent again
    under it by the producers, keyless ones given up); either way once each in the log."""
    await _kill_under_load(brokers, stack, tmp_path, keyed=keyed, hang_first=True)


async def _kill_under_load(brokers: BrokerFactory, stack: LocalStack, tmp_path: Path, *,
                           keyed: bool, hang_first: bool) -> None:
    prefix, topic = f"aff-kill-{uuid.uuid4().hex[:8]}", "orders"
    names = ["k1", "k2", "k3"]
    started = [_start(brokers, prefix, name) for name in names]
    killed, survivors = started[0], started[1:]
    members = {_member(n) for n in names}
    unknown_before = 0.0
    with behind("caddy", started, tmp_path / "caddy") as proxy:
        load = FailoverLoad([proxy.url], topic, PARTITIONS, producers_per_broker=PRODUCERS,
                            entries_per_request=ENTRIES, keyed=keyed, sequenced=keyed,
                            root_prefix=prefix)
        await _until_views([b.url for b in started], members, 30)
        async with load.running(stack):
            with anyio.fail_after(180):  # generous: a loaded machine runs slowly
                await load.wait_acked(50)
                if hang_first:
                    killed.process.signal(signal.SIGSTOP)
                    # Until a survivor's forward to it went unanswered.
                    unknown_before = await _until_unknown(survivors)
                killed_at = time.monotonic()
                killed.process.signal(signal.SIGKILL)
                settled_s = await _until_views(
                    [b.url for b in survivors], members - {_member(names[0])},
                    SESSION_TIMEOUT_S + REFRESH_S + SETTLE_SLACK_S)
                # Forwards sent before the survivors' views changed are answered by now.
                await load.wait_acked(load.acknowledged + 50)
                fallbacks = await _counter(survivors, "llog_affinity_fallbacks")
                forwarded = await _counter(survivors, "llog_affinity_groups",
                                           route="forwarded")
                await load.wait_acked(load.acknowledged + 60)
                fallbacks_later = await _counter(survivors, "llog_affinity_fallbacks")
                forwarded_later = await _counter(survivors, "llog_affinity_groups",
                                                 route="forwarded")
    await load.verify(stack)  # every acknowledged record stored once, offsets contiguous

    # Only requests in flight on the killed broker failed: each sent before the kill and
    # "maybe written"; those the proxy answered for it (its 502, a cut connection), one
    # at most per producer; and the survivors' CommitInDoubt for frames it had taken.
    failures = load.failures
    assert all(f.sent < killed_at and f.maybe_written for f in failures), failures
    requests = {(f.producer, f.sent) for f in failures}
    proxied = {(f.producer, f.sent) for f in failures if f.error != "CommitInDoubt"}
    assert len({producer for producer, _ in proxied}) == len(proxied), failures
    # A survivor's frame to the hung broker that went unanswered is answered in doubt if
    # the hung broker had taken it (keyed or not), and appended by the survivor if not.
    allowed = {"http:502", "transport:RemoteProtocolError", "transport:ReadError",
               "CommitInDoubt"}
    assert {f.error for f in failures} <= allowed, failures
    # After a frame to the hung broker went unanswered, a survivor sent it no other: the
    # ones already in flight were all that could be left in doubt.
    unanswered = [sum([await _counter([b], "llog_forward_frames", outcome=o)
                       for o in UNKNOWN_FRAME_OUTCOMES]) for b in survivors]
    assert all(n <= LANE_FRAMES_IN_FLIGHT for n in unanswered), unanswered
    # Each unanswered frame was settled by its fence, and Oxia always said who held it.
    fenced = await _counter(survivors, "llog_forward_fences", side="forwarder")
    unsettled = await _counter(survivors, "llog_forward_fences", side="forwarder",
                               outcome="error")
    assert (fenced, unsettled) == (sum(unanswered), 0), (fenced, unsettled, unanswered)
    # The survivors forwarded to the dead member until they suspected it or its session
    # expired, and fell back (or answered the frames the hung broker took in doubt).
    abandoned = await _counter(survivors, "llog_affinity_fallbacks", reason="abandoned")
    in_doubt = await _counter(survivors, "llog_affinity_groups", route="in_doubt")
    assert fallbacks + in_doubt > 0
    if hang_first:  # forwards left without an answer, each settled by its fence
        assert unknown_before > 0
        assert abandoned + in_doubt > 0, (abandoned, in_doubt)
    # Once their views dropped it, nothing falls back any more, and the survivors still
    # forward each other's partitions.
    assert fallbacks_later == fallbacks
    assert forwarded_later > forwarded
    print(f"views settled {settled_s:.1f} s after the kill; {len(requests)} failed "
          f"requests {sorted({f.error for f in failures})}; {len(load.in_doubt)} records "
          f"in doubt; fallbacks {fallbacks:.0f}, of which abandoned {abandoned:.0f}"
          f"; groups in doubt {in_doubt:.0f}; unanswered frames {unanswered}")


async def _until_unknown(survivors: list[Broker]) -> float:
    """Until the survivors have forwards whose outcome was unknown (appended here once
    their fence was won, or answered in doubt); their number. Polled, bounded: a forward waits
    LLOG_FORWARD_DEADLINE_MS + LLOG_FORWARD_ANSWER_TIMEOUT_MS (3 s) for its answer."""
    with anyio.fail_after(60):
        while True:
            unknown = (await _counter(survivors, "llog_affinity_fallbacks",
                                      reason="abandoned")
                       + await _counter(survivors, "llog_affinity_groups", route="in_doubt"))
            if unknown > 0:
                return unknown
            await anyio.sleep(0.1)


async def test_a_broker_added_under_load_takes_its_partitions_and_fails_nothing(
        brokers: BrokerFactory, stack: LocalStack, tmp_path: Path) -> None:
    prefix, topic = f"aff-join-{uuid.uuid4().hex[:8]}", "orders"
    names = ["j1", "j2", "j3"]
    started = [_start(brokers, prefix, name) for name in names]
    spare = free_port()  # in the proxy's pool already, as an operator's next broker
    with behind("caddy", started, tmp_path / "caddy", spare_ports=[spare]) as proxy:
        load = FailoverLoad([proxy.url], topic, PARTITIONS, producers_per_broker=PRODUCERS,
                            entries_per_request=ENTRIES, root_prefix=prefix)
        await _until_views([b.url for b in started], {_member(n) for n in names}, 30)
        async with load.running(stack):
            with anyio.fail_after(180):
                await load.wait_acked(50)
                fourth = await anyio.to_thread.run_sync(
                    lambda: _start(brokers, prefix, "j4", spare))
                everyone = [*started, fourth]
                await _until_views([b.url for b in everyone],
                                   {_member(n) for n in [*names, "j4"]}, 30)
                # Its partitions move to it: the others forward them there.
                while await _counter([fourth], "llog_forward_received_groups",
                                     outcome="appended") == 0:
                    await load.wait_acked(load.acknowledged + 5)
                await load.wait_acked(load.acknowledged + 60)
    await load.verify(stack)
    assert load.failures == []
    assert await _counter([fourth], "llog_affinity_groups", route="local") > 0
    assert await _counter(everyone, "llog_affinity_groups", route="in_doubt") == 0


async def test_a_routing_client_rides_out_a_broker_killed_under_load(
        brokers: BrokerFactory, stack: LocalStack, tmp_path: Path) -> None:
    """Producers with ``route="preferred"`` send each partition straight to its preferred
    broker, the proxy their fallback. One broker is killed with -9 while they run: the
    requests in flight on it are retried (each entry carries its idempotency key), a
    connection it refuses sends the request through the proxy, and the client asks for
    the members again. No produce call fails, and storage holds each acknowledged record
    once, at contiguous offsets and at the offset acknowledged."""
    prefix, topic = f"aff-route-{uuid.uuid4().hex[:8]}", "orders"
    names = ["r1", "r2", "r3"]
    started = [_start(brokers, prefix, name) for name in names]
    killed = started[0]
    acked: dict[tuple[int, int], str] = {}
    stop = anyio.Event()

    async def produce(llog: AsyncLlogClient, p: int) -> None:
        i = 0
        while not stop.is_set():
            values = [f"{p}-{i}-{j}" for j in range(4)]
            result = await llog.produce(topic, values, partition=p)
            for batch in result.batches:
                for offset, value in zip(batch.offsets, values[batch.first_index:],
                                         strict=False):
                    acked[(p, offset)] = value
            for count, reached in waiting:
                if len(acked) >= count:
                    reached.set()
            i += 1

    waiting: list[tuple[int, anyio.Event]] = []

    async def acked_at_least(count: int) -> None:
        reached = anyio.Event()
        waiting.append((count, reached))
        if len(acked) >= count:
            reached.set()
        await reached.wait()

    with behind("caddy", started, tmp_path / "caddy") as proxy:
        await _until_views([b.url for b in started], {_member(n) for n in names}, 30)
        retry = RetryPolicy(max_attempts=20, max_backoff_s=1.0)
        async with AsyncLlogClient(proxy.url, route="preferred", retry=retry,
                                   timeout_s=30) as llog:
            with anyio.fail_after(180):  # generous: a loaded machine runs slowly
                async with anyio.create_task_group() as tg:
                    for p in range(PARTITIONS):
                        tg.start_soon(produce, llog, p)
                    await acked_at_least(400)
                    direct = await _counter([killed], "llog_affinity_groups", route="local")
                    hops = await _counter(started, "llog_affinity_groups", route="forwarded")
                    killed.process.signal(signal.SIGKILL)
                    count = len(acked)
                    await acked_at_least(count + 400)
                    stop.set()
    survivors = started[1:]
    # Before the kill every request met its partition's appender: nothing was forwarded,
    # and the killed broker had taken its own partitions' records straight from the client.
    assert hops == 0 and direct > 0, (hops, direct)
    stored = await read_all(stack, topic, PARTITIONS, root_prefix=prefix)
    problems = [f"partition {p} offset {o}: acknowledged {v!r}, stored "
                f"{stored[p].get(o)!r}" for (p, o), v in acked.items()
                if stored[p].get(o) != v]
    values = Counter(v for records in stored.values() for v in records.values())
    problems += [f"{v!r} stored {n} times" for v, n in values.items() if n > 1]
    assert not problems, "\n".join(problems[:20])
    forwarded = await _counter(survivors, "llog_affinity_groups", route="forwarded")
    local = await _counter(survivors, "llog_affinity_groups", route="local")
    print(f"{len(acked)} records acknowledged; survivors appended {local:.0f} groups sent "
          f"to them and forwarded {forwarded:.0f}")
