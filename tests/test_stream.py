"""GET /topics/{topic}/stream: Server-Sent Events from a real broker process (httpx
streaming over HTTP): history then live records, resumption with Last-Event-ID,
heartbeats, the stream limit, a drain that ends streams, and a slow reader paced by the
socket instead of buffered."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from tests.helpers.bodies import produce_body
from tests.helpers.stack import Broker, BrokerFactory


@dataclass
class Event:
    kind: str = "message"
    data: str = ""
    id: str | None = None
    comments: list[str] = field(default_factory=list)

    @property
    def json(self) -> Any:
        return json.loads(self.data)


async def events(response: httpx.Response) -> AsyncIterator[Event]:
    """The events of a text/event-stream answer (comments arrive as their own events)."""
    event = Event()
    async for line in response.aiter_lines():
        if line == "":
            if event.data or event.comments or event.kind != "message":
                yield event
            event = Event()
        elif line.startswith(":"):
            yield Event(kind="comment", comments=[line[1:].strip()])
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event.kind = value
            elif name == "data":
                event.data += value
            elif name == "id":
                event.id = value


async def _produce(broker: Broker, topic: str, *values: str, partition: int = 0) -> None:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        r = await http.post("/produce", json=produce_body(topic, *values, partition=partition))
        assert r.status_code == 200, r.text


async def _records(stream: AsyncIterator[Event], count: int) -> tuple[list[Any], str | None]:
    """Until ``count`` records arrived: their (partition, offset, value), and the last id."""
    got: list[Any] = []
    last = None
    async for event in stream:
        if event.kind == "records":
            got += [(event.json["partition"], r["offset"], r["value"])
                    for r in event.json["records"]]
            last = event.id
            if len(got) >= count:
                return got, last
    raise AssertionError(f"the stream ended after {got}")


async def test_history_then_live_records_and_resumption(brokers: BrokerFactory,
                                                        topic: str) -> None:
    broker = brokers.start()
    await _produce(broker, topic, "a", "b")
    await _produce(broker, topic, "x", partition=1)
    url = f"/topics/{topic}/stream?partitions=0,1&from=earliest"
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        with anyio.fail_after(30):
            async with http.stream("GET", url) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                stream = events(r)
                got, _ = await _records(stream, 3)
                assert sorted(got) == [(0, 1, "a"), (0, 2, "b"), (1, 1, "x")]
                await _produce(broker, topic, "live")  # arrives while we listen
                got, last = await _records(stream, 1)
                assert got == [(0, 3, "live")]
                assert last == "0:4,1:2"
            await _produce(broker, topic, "later")
            async with http.stream("GET", url, headers={"Last-Event-ID": last}) as r:
                got, _ = await _records(events(r), 1)
                assert got == [(0, 4, "later")]  # nothing before the id is sent again


async def test_heartbeats_while_idle_and_bad_parameters(brokers: BrokerFactory,
                                                        topic: str) -> None:
    broker = brokers.start()
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        with anyio.fail_after(20):
            async with http.stream("GET", f"/topics/{topic}/stream?heartbeat_ms=1000") as r:
                async for event in events(r):
                    if event.kind == "comment" and event.comments == ["heartbeat"]:
                        break
        for query, headers in [("partitions=0,x", {}), ("partitions=1,1", {}),
                               ("from=soon", {}), ("heartbeat_ms=10", {}),
                               ("partitions=0", {"Last-Event-ID": "1:5"}),
                               ("partitions=0", {"Last-Event-ID": "junk"})]:
            r = await http.get(f"/topics/{topic}/stream?{query}", headers=headers)
            assert r.status_code == 400, (query, r.text)
        r = await http.get("/topics/b@d/stream")
        assert r.status_code == 400


async def test_streams_are_limited_and_end_when_the_broker_drains(brokers: BrokerFactory,
                                                                  topic: str) -> None:
    broker = brokers.start(max_concurrent_streams="1", drain_s="3")
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as http:
        with anyio.fail_after(30):
            async with http.stream("GET", f"/topics/{topic}/stream") as r:
                stream = events(r)
                refused = await http.get(f"/topics/{topic}/stream")
                assert refused.status_code == 503
                assert refused.json()["error_type"] == "Unavailable"
                broker.process.signal(signal.SIGTERM)
                kinds = [e.kind async for e in stream if e.kind != "comment"]
                assert kinds[-1] == "end"


async def _stream_events_sent(http: httpx.AsyncClient) -> float:
    text = (await http.get("/metrics/prometheus")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith('llog_stream_events_total{event="records"}'))


async def test_a_slow_reader_is_paced_not_buffered(brokers: BrokerFactory,
                                                  topic: str) -> None:
    broker = brokers.start()
    value = "v" * 100_000
    for _ in range(8):  # 24 MB in all
        await _produce(broker, topic, *[value] * 30)
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http:
        with anyio.fail_after(60):
            # Raw: compressed, these repetitive events would be small enough for the
            # socket buffers to take them all.
            async with http.stream(
                    "GET", f"/topics/{topic}/stream?from=earliest&max_bytes=100000",
                    headers={"accept-encoding": "identity"}) as r:
                assert r.status_code == 200
                # Not reading: the broker sends until the socket buffers are full.
                previous = -1.0
                for _ in range(100):
                    sent = await _stream_events_sent(http)
                    if sent == previous and sent > 0:
                        break  # nothing more went out while we did not read
                    previous = sent
                    await anyio.sleep(0.2)
                assert 0 < previous < 120, previous  # 240 one-record events were due
                got, _ = await _records(events(r), 240)
                assert len(got) == 240
