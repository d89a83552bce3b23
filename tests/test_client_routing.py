"""The client's ``route="preferred"``: a produce request for one partition goes straight to
the broker that appends it, by the brokers' own ranking; everything else, and a request
whose broker does not answer, goes to the brokers given. Brokers here are httpx mock
transports, one per host; tests/test_affinity.py runs it against real brokers."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from app.cluster.rendezvous import owner_set
from llog_client import AsyncLlogClient, LlogClient, Record
from llog_client import _routing as routing
from llog_client._retry import NO_RETRIES, RetryPolicy

MEMBERS = {"b1.w0": "http://b1", "b2.w0": "http://b2", "b3.w0": "http://b3"}
TOPIC = "orders"


def _cluster(digest: str = "d1", members: dict[str, str] = MEMBERS) -> dict[str, object]:
    return {"digest": digest, "algorithm": routing.ALGORITHM, "members": [
        {"member_id": m, "broker_id": m.split(".")[0], "url": u, "roles": ["read", "write"]}
        for m, u in members.items()]}


class Brokers:
    """Mock brokers by host: who got which produce request, and how often the map was
    asked for. ``down`` hosts refuse connections; ``digest`` goes in produce answers."""

    def __init__(self, cluster: Callable[[], httpx.Response] | None = None) -> None:
        self.produced: list[tuple[str, int | None]] = []
        self.maps = 0
        self.down: set[str] = set()
        self.digest = "d1"
        self.cluster = cluster or (lambda: httpx.Response(200, json=_cluster(self.digest)))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        if host in self.down:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/cluster":
            self.maps += 1
            return self.cluster()
        body = json.loads(request.content)
        entries = body["topic_partitions"]
        self.produced.append((host, entries[0].get("partition")))
        return httpx.Response(200, headers={routing.DIGEST_HEADER: self.digest}, json={
            "results": [{"ok": True, "topic": e["topic"], "partition": e.get("partition", 0),
                         "start_offset": 1, "end_offset": len(e["records"]),
                         "count": len(e["records"])} for e in entries]})


def _client(brokers: Brokers, route: str = "preferred") -> LlogClient:
    return LlogClient("http://proxy", route=route,  # type: ignore[arg-type]
                      transport=httpx.MockTransport(brokers), compression="none",
                      retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0))


def _preferred_host(partition: int) -> str:
    (member,) = owner_set(0, TOPIC, partition, list(MEMBERS), 1)
    return MEMBERS[member].removeprefix("http://")


def test_the_client_ranks_members_as_the_brokers_do() -> None:
    ids = [f"b{i}.w{w}" for i in range(1, 6) for w in range(2)]
    for topic in ("orders", "a.b-c_d"):
        for partition in range(64):
            assert routing.preferred(topic, partition, ids) == owner_set(
                0, topic, partition, ids, 1)[0]
    assert routing.score(0, "orders", 0, "b1.w0") == 0xB106C1AF8AD72BFD  # docs/protocol.md
    assert routing.preferred("orders", 0, []) is None


def test_each_partition_goes_to_its_preferred_broker_and_the_map_is_fetched_once() -> None:
    brokers = Brokers()
    with _client(brokers) as llog:
        for p in range(12):
            llog.produce(TOPIC, [f"v{p}"], partition=p)
    assert brokers.produced == [(_preferred_host(p), p) for p in range(12)]
    assert len({host for host, _ in brokers.produced}) == 3
    assert brokers.maps == 1


def test_requests_that_name_no_single_partition_go_to_the_brokers_given() -> None:
    brokers = Brokers()
    with _client(brokers) as llog:
        llog.produce(TOPIC, [Record("x", key="k")])  # the broker picks the partition
        llog.produce(TOPIC, ["y"], partition=3)
    assert brokers.produced == [("proxy", None), (_preferred_host(3), 3)]


def test_route_any_never_asks_for_the_map() -> None:
    brokers = Brokers()
    with _client(brokers, route="any") as llog:
        llog.produce(TOPIC, ["x"], partition=5)
    assert brokers.produced == [("proxy", 5)] and brokers.maps == 0


@pytest.mark.parametrize("answer", [
    lambda: httpx.Response(404, json={"detail": "Not Found"}),  # a broker without /cluster
    lambda: httpx.Response(200, json={"digest": "x", "algorithm": "other", "members": []}),
    lambda: httpx.Response(200, json=_cluster(members={})),  # affinity off: no members
    lambda: httpx.Response(200, content=b"not json"),
], ids=["404", "other-algorithm", "no-members", "not-json"])
def test_without_a_usable_map_requests_go_to_the_brokers_given(
        answer: Callable[[], httpx.Response]) -> None:
    brokers = Brokers(cluster=answer)
    with _client(brokers) as llog:
        llog.produce(TOPIC, ["x"], partition=1)
        llog.produce(TOPIC, ["y"], partition=2)
    assert brokers.produced == [("proxy", 1), ("proxy", 2)]
    assert brokers.maps == 1  # and not again before the map's age is up


def test_a_preferred_broker_that_does_not_answer_is_passed_over_and_the_map_asked_again(
        ) -> None:
    brokers = Brokers()
    partition = 0
    host = _preferred_host(partition)
    brokers.down.add(host)
    with _client(brokers) as llog:
        result = llog.produce(TOPIC, ["x"], partition=partition)
        assert result.batches[0].partition == partition
        llog.produce(TOPIC, ["y"], partition=partition)
    # The refused connection sent nothing; the retry and the next request go to the list.
    assert brokers.produced == [("proxy", partition), ("proxy", partition)]
    assert brokers.maps == 2


def test_a_refused_connection_goes_to_the_brokers_given_at_once_even_without_retries(
        ) -> None:
    brokers = Brokers()
    brokers.down.add(_preferred_host(0))
    with LlogClient("http://proxy", route="preferred", transport=httpx.MockTransport(brokers),
                    compression="none", retry=NO_RETRIES) as llog:
        assert llog.produce(TOPIC, ["x"], partition=0).batches[0].partition == 0
    assert brokers.produced == [("proxy", 0)]


def test_a_map_fetch_without_an_answer_keeps_the_map_and_asks_again_soon() -> None:
    now = [0.0]
    routes = routing.Routes(clock=lambda: now[0])
    routes.update(_cluster())
    url = routes.url_for(TOPIC, 0)
    now[0] = routing.MAX_AGE_S
    assert routes.stale()
    routes.unreached()  # no answer, or a 5xx: the map stays
    assert not routes.stale() and routes.url_for(TOPIC, 0) == url
    now[0] += routing.DOWN_S
    assert routes.stale()


@pytest.mark.parametrize("status", [503, None], ids=["503", "no-answer"])
def test_a_failed_map_fetch_is_tried_again_after_a_pause_not_after_the_maps_age(
        status: int | None) -> None:
    answers = [httpx.Response(200, json=_cluster())]
    brokers = Brokers(cluster=lambda: answers[-1])
    with _client(brokers) as llog:
        llog.produce(TOPIC, ["x"], partition=1)
        assert brokers.produced[-1] == (_preferred_host(1), 1)
        brokers.digest = "d2"  # the members changed; the next fetch fails
        llog.produce(TOPIC, ["x"], partition=1)
        if status is None:
            brokers.down.add("proxy")
        else:
            answers.append(httpx.Response(status, json={"error_type": "Unavailable"}))
        llog.produce(TOPIC, ["x"], partition=1)  # fetch fails: the old map still routes
        assert brokers.produced[-1] == (_preferred_host(1), 1)
    assert brokers.maps == 2 - (status is None)  # a refused fetch never reached a broker


def test_members_not_of_the_contracts_shape_are_left_out() -> None:
    body = _cluster()
    members = body["members"]
    assert isinstance(members, list)
    members += [{"url": "http://x", "roles": ["write"]},  # no id
                {"member_id": "s.w0", "url": "http://s", "roles": "write"},  # not a list
                {"member_id": "n.w0", "url": None, "roles": ["write"]},
                {"member_id": "r.w0", "url": "http://r", "roles": ["read"]}, "b4.w0"]
    parsed = routing.ClusterMap.parse(body)
    assert parsed.ids == tuple(sorted(MEMBERS)) and parsed.digest == "d1"
    assert routing.ClusterMap.parse({**body, "digest": 7}).digest is None
    assert routing.ClusterMap.parse({**body, "members": "b1.w0"}).ids == ()


def test_another_digest_in_an_answer_makes_the_client_fetch_the_map_again() -> None:
    brokers = Brokers()
    with _client(brokers) as llog:
        llog.produce(TOPIC, ["x"], partition=1)
        llog.produce(TOPIC, ["x"], partition=1)
        assert brokers.maps == 1
        brokers.digest = "d2"  # members changed: the next answer says so
        llog.produce(TOPIC, ["x"], partition=1)
        llog.produce(TOPIC, ["x"], partition=1)
    assert brokers.maps == 2


def test_the_map_is_fetched_again_when_it_is_old() -> None:
    now = [0.0]
    routes = routing.Routes(clock=lambda: now[0])
    assert routes.stale()
    routes.update(_cluster())
    assert not routes.stale() and routes.url_for(TOPIC, 0) is not None
    now[0] = routing.MAX_AGE_S
    assert routes.stale()
    url = routes.url_for(TOPIC, 0)
    assert url is not None
    routes.failed(url)
    assert routes.url_for(TOPIC, 0) is None
    now[0] += routing.DOWN_S
    assert routes.url_for(TOPIC, 0) == url


def test_an_unknown_route_is_refused() -> None:
    with pytest.raises(ValueError, match="route must be one of"):
        LlogClient("http://proxy", route="nearest")  # type: ignore[arg-type]


async def test_the_async_client_routes_too() -> None:
    brokers = Brokers()
    async with AsyncLlogClient(
            "http://proxy", route="preferred", transport=httpx.MockTransport(brokers),
            compression="none") as llog:
        for p in range(6):
            await llog.produce(TOPIC, [f"v{p}"], partition=p)
    assert brokers.produced == [(_preferred_host(p), p) for p in range(6)]
    assert brokers.maps == 1
