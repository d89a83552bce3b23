"""Event streams with access control on, against a real broker process: a stream is
re-checked when the auth file is reloaded and when its JWT expires, and ends with an
``error`` event saying why; what it streams counts to the principal as consume does,
and its reads are charged to the request quota; browsers open it with a stream ticket
(single-use, bound to its topic and principal, shared across brokers by a secret)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import psutil
import pytest

from tests.helpers.auth import AUDIENCE, ISSUER, Issuer, Keys, bearer, jwks
from tests.helpers.auth import write_atomically as write
from tests.helpers.bodies import produce_body
from tests.helpers.stack import Broker, BrokerFactory
from tests.test_stream import Event, events

SECRET = "s" * 40
# Long enough for the stream to open well before the JWT expires on a busy machine.
JWT_LIFETIME_S = 10
# How late a stream may end after its JWT expired: the broker wakes for the expiry, so
# only a machine too busy to run it for seconds delays the end this long.
EXPIRY_TOLERANCE_S = 10
# Fresh connections until one ticket was minted and redeemed by different workers.
MAX_TICKET_OPENS = 40


def auth_text(keys: Keys, topic: str, *, revoked: bool = False) -> str:
    """The auth file; ``revoked``: reader's key is gone and narrowed lost its consume
    right on the topic."""
    k = keys.entries
    return f"""
[principals.writer]
keys = ["{k['writer']}"]
produce = ["{topic}"]
consume = ["{topic}"]

[principals.reader]
keys = [{'' if revoked else f'"{k["reader"]}"'}]
consume = ["{topic}", "other-{topic}"]

[principals.narrowed]
keys = ["{k['narrowed']}"]
consume = ["{'other-' if revoked else ''}{topic}"]

[principals.keeper]
keys = ["{k['keeper']}"]
consume = ["{topic}"]

[principals.metered]
keys = ["{k['metered']}"]
consume = ["{topic}"]
quota = {{ requests_per_s = 0.02, burst_s = 100 }}

[principals.jwt-reader]
consume = ["{topic}"]
"""


@pytest.fixture
def keys() -> Keys:
    out = Keys()
    for name in ("writer", "reader", "narrowed", "keeper", "metered"):
        out.new(name)
    return out


@pytest.fixture
def auth_file(tmp_path: Path, keys: Keys, topic: str) -> Path:
    path = tmp_path / "auth.toml"
    write(path, auth_text(keys, topic))
    return path


def start(brokers: BrokerFactory, auth_file: Path, **settings: str) -> Broker:
    return brokers.start(workers=1, auth="on", auth_file=str(auth_file),
                         auth_reload_interval_s="0.2", **settings)


async def produce(http: httpx.AsyncClient, keys: Keys, topic: str, *values: str) -> None:
    r = await http.post("/produce", json=produce_body(topic, *values),
                        headers=bearer(keys.tokens["writer"]))
    assert r.status_code == 200, r.text


async def next_event(stream: AsyncIterator[Event]) -> Event:
    """The next event that is not a heartbeat."""
    async for event in stream:
        if event.kind != "comment":
            return event
    raise AssertionError("the stream ended")


async def ends_with(stream: AsyncIterator[Event]) -> Event:
    """The stream's last event, once the broker has closed it."""
    last = [e async for e in stream if e.kind != "comment"][-1]
    return last


async def ends_with_when(stream: AsyncIterator[Event]) -> tuple[Event, float]:
    """The stream's last event, once the broker has closed it, and the time (Unix) it
    arrived at."""
    last, at = None, 0.0
    async for event in stream:
        if event.kind != "comment":
            last, at = event, time.time()
    assert last is not None, "the stream ended without an event"
    return last, at


async def metric(http: httpx.AsyncClient, prefix: str) -> float:
    text = (await http.get("/metrics/prometheus")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


async def test_a_stream_ends_when_its_key_or_right_is_removed_or_its_jwt_expires(
        brokers: BrokerFactory, tmp_path: Path, auth_file: Path, keys: Keys,
        topic: str) -> None:
    issuer = Issuer()
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(jwks(issuer)))
    broker = start(brokers, auth_file, auth_jwks_file=str(jwks_file),
                   auth_jwt_issuer=ISSUER, auth_jwt_audience=AUDIENCE,
                   auth_jwt_leeway_s="0")
    url = f"/topics/{topic}/stream?from=earliest&heartbeat_ms=1000"
    t = keys.tokens
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        await produce(http, keys, topic, "first")
        with anyio.fail_after(60):
            async with http.stream("GET", url, headers=bearer(t["reader"])) as reader, \
                    http.stream("GET", url, headers=bearer(t["narrowed"])) as narrowed, \
                    http.stream("GET", url, headers=bearer(t["keeper"])) as keeper:
                streams = {"reader": events(reader), "narrowed": events(narrowed),
                           "keeper": events(keeper)}
                for name, stream in streams.items():
                    assert (await next_event(stream)).kind == "records", name

                write(auth_file, auth_text(keys, topic, revoked=True))
                last = await ends_with(streams["reader"])
                assert (last.kind, last.json["error_type"]) == ("error", "Unauthenticated")
                assert "revoked" in last.json["error"]
                assert last.json["retriable"] is False
                last = await ends_with(streams["narrowed"])
                assert (last.kind, last.json["error_type"]) == ("error", "Forbidden")
                # A principal the reload did not touch keeps streaming.
                await produce(http, keys, topic, "second")
                event = await next_event(streams["keeper"])
                assert [r["value"] for r in event.json["records"]] == ["second"]

            # Nor can the revoked key open a new one.
            r = await http.get(url, headers=bearer(t["reader"]))
            assert r.status_code == 401, r.text

        # A JWT that expires while its stream runs (no leeway): the stream ends then.
        expires = int(time.time()) + JWT_LIFETIME_S
        token = issuer.token("jwt-reader", exp=expires)
        ended: tuple[Event, float] | None = None
        async with http.stream("GET", url, headers=bearer(token)) as r:
            assert r.status_code == 200, (r.status_code, time.time() - expires)
            stream = events(r)
            with anyio.fail_after(30):
                assert (await next_event(stream)).kind == "records"
            # Waited for until the latest the stream may end, and no longer.
            with anyio.move_on_after(max(0.0, expires + EXPIRY_TOLERANCE_S - time.time())):
                ended = await ends_with_when(stream)
        assert ended is not None, f"still open {EXPIRY_TOLERANCE_S} s after the JWT expired"
        last, at = ended
        assert (last.kind, last.json["error_type"]) == ("error", "Unauthenticated")
        assert "expired" in last.json["error"]
        # Not before its expiry (one clock: the broker's host is this one), and not long
        # after: the guard waits for the expiry itself, not for some other recheck.
        assert expires <= at <= expires + EXPIRY_TOLERANCE_S, at - expires
        assert await metric(http, 'llog_stream_events_total{event="error"}') == 3


async def test_streamed_bytes_count_as_consumed_and_reads_pay_the_request_quota(
        brokers: BrokerFactory, auth_file: Path, keys: Keys, topic: str) -> None:
    broker = start(brokers, auth_file)
    t = keys.tokens
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        await produce(http, keys, topic, "alpha", "beta-beta", "gamma-gamma-gamma")
        with anyio.fail_after(60):
            url = f"/topics/{topic}/stream?from=earliest&heartbeat_ms=1000"
            async with http.stream("GET", url, headers=bearer(t["reader"])) as r:
                stream = events(r)
                got: list[str] = []
                while len(got) < 3:
                    got += [x["value"] for x in (await next_event(stream)).json["records"]]
            fetch = {"topic_partitions": [{"topic": topic, "partition": 0,
                                           "fetch_offset": 1}], "max_wait_ms": 0}
            r = await http.post("/consume", json=fetch, headers=bearer(t["keeper"]))
            assert len(r.json()["results"][0]["records"]) == 3, r.text
            streamed = await metric(
                http, 'llog_principal_consumed_bytes_total{principal="reader"}')
            consumed = await metric(
                http, 'llog_principal_consumed_bytes_total{principal="keeper"}')
            assert streamed == consumed > 0

            # metered may make 2 requests in 100 s: the stream's opening (which pays its
            # first read) and one more read. The third read waits for the quota, with
            # heartbeats, as a consumer answered 429 would.
            url = f"/topics/{topic}/stream?from=earliest&heartbeat_ms=1000&max_bytes=1"
            async with http.stream("GET", url, headers=bearer(t["metered"])) as r:
                stream = events(r)
                first = await next_event(stream)
                assert [x["value"] for x in first.json["records"]] == ["alpha"]
                second = await next_event(stream)
                assert [x["value"] for x in second.json["records"]] == ["beta-beta"]
                async for event in stream:
                    assert event.kind == "comment", event  # no third record
                    break
                # Held back by its quota, the stream holds none of the answer budget.
                assert await metric(http, "llog_answer_bytes_in_flight ") == 0
                r = await http.post("/consume", json=fetch, headers=bearer(t["metered"]))
                assert r.status_code == 429, r.text


async def ticket(http: httpx.AsyncClient, token: str, topic: str) -> str:
    r = await http.post(f"/topics/{topic}/stream/tickets", headers=bearer(token))
    assert r.status_code == 200, r.text
    assert r.json()["expires_in_s"] == 30
    found: str = r.json()["ticket"]
    return found


async def test_a_stream_ticket_opens_one_stream_of_its_topic_as_its_principal(
        brokers: BrokerFactory, auth_file: Path, keys: Keys, topic: str) -> None:
    # Two brokers with one secret, as behind a load balancer.
    a = start(brokers, auth_file, stream_ticket_secret=SECRET)
    b = start(brokers, auth_file, stream_ticket_secret=SECRET)
    t = keys.tokens
    url = f"/topics/{topic}/stream?from=earliest&heartbeat_ms=1000"
    async with httpx.AsyncClient(base_url=a.url, timeout=30) as http, \
            httpx.AsyncClient(base_url=b.url, timeout=30) as other:
        await produce(http, keys, topic, "first")
        # Only a caller with the consume right gets one; none without a token.
        r = await http.post(f"/topics/other-{topic}/stream/tickets",
                            headers=bearer(t["keeper"]))
        assert r.status_code == 403, r.text
        assert (await http.post(f"/topics/{topic}/stream/tickets")).status_code == 401

        issued = await ticket(http, t["reader"], topic)
        spare = await ticket(http, t["reader"], topic)
        with anyio.fail_after(60):
            # Minted on a, opened on b: no header, as an EventSource sends it.
            async with other.stream("GET", f"{url}&ticket={issued}") as r:
                assert r.status_code == 200
                stream = events(r)
                assert (await next_event(stream)).kind == "records"
                # Used once: a second use is refused, on this broker.
                again = await other.get(f"{url}&ticket={issued}")
                assert again.status_code == 401, again.text
                assert "used already" in again.json()["error"]
                # The stream is the reader's: removing reader's key ends it.
                write(auth_file, auth_text(keys, topic, revoked=True))
                last = await ends_with(stream)
                assert (last.kind, last.json["error_type"]) == ("error", "Unauthenticated")

        # Bound to its topic, even for a principal that may read the other one.
        r = await http.get(f"/topics/other-{topic}/stream?ticket={spare}")
        assert r.status_code == 401 and "another topic" in r.json()["error"], r.text
        # ... and to the stream: it is no token for any other request.
        r = await http.get(f"/topics/{topic}?ticket={spare}")
        assert r.status_code == 401, r.text
        # Forged: a payload changed, or made up with another secret.
        payload, mac = spare.removeprefix("llogt_").split(".")
        forged = f"llogt_{payload[:-2]}{'AA' if payload[-2:] != 'AA' else 'BB'}.{mac}"
        for bad in (forged, spare[:-3], "llogt_e30.AAAA", "junk"):
            r = await http.get(f"{url}&ticket={bad}")
            assert r.status_code == 401, (bad, r.text)
            assert r.json()["error_type"] == "Unauthenticated"


def serving_worker(broker: Broker, response: httpx.Response) -> int:
    """The process id of the worker of ``broker`` that holds the server side of the
    connection ``response`` came on (the client keeps it open until the client closes):
    one of the server's children, or the server itself when it runs a single worker."""
    client = tuple(response.extensions["network_stream"].get_extra_info("client_addr"))
    server = psutil.Process(broker.process.pid)
    for worker in [server, *server.children(recursive=True)]:
        if any(tuple(c.raddr) == client for c in worker.net_connections("tcp") if c.raddr):
            return worker.pid
    raise AssertionError(f"no worker of {broker.url} holds the connection from {client}")


async def test_the_workers_of_one_server_share_the_ticket_secret(
        brokers: BrokerFactory, auth_file: Path, keys: Keys, topic: str) -> None:
    """`llog serve --workers 2` with no LLOG_STREAM_TICKET_SECRET: a ticket minted by
    one worker opens a stream on the other (each drew its own secret, so about one open
    in two was a 401). The kernel gives each new connection to either worker, often the
    same one several times running, so tickets are minted and redeemed on fresh
    connections until one was redeemed by the worker that did not mint it; every open
    on the way must succeed too."""
    broker = brokers.start(workers=2, auth="on", auth_file=str(auth_file))
    url = f"/topics/{topic}/stream?from=earliest&heartbeat_ms=1000"
    opened: list[tuple[int, int, int]] = []  # (minted by, redeemed by, status)
    with anyio.fail_after(120):
        while not any(minted != redeemed for minted, redeemed, _ in opened):
            assert len(opened) < MAX_TICKET_OPENS, \
                f"every ticket was redeemed by the worker that minted it: {opened}"
            async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
                r = await http.post(f"/topics/{topic}/stream/tickets",
                                    headers=bearer(keys.tokens["reader"]))
                assert r.status_code == 200, r.text
                minter = serving_worker(broker, r)
            async with httpx.AsyncClient(base_url=broker.url, timeout=30) as other, \
                    other.stream("GET", f"{url}&ticket={r.json()['ticket']}") as s:
                opened.append((minter, serving_worker(broker, s), s.status_code))
    assert [status for _, _, status in opened] == [200] * len(opened), opened
