"""GET /topics/{topic}/stream: Server-Sent Events from a real broker process (httpx
streaming over HTTP): history then live records, resumption with Last-Event-ID,
heartbeats, the stream limit, a drain that ends streams, and a slow reader paced by the
socket instead of buffered."""

from __future__ import annotations

import json
import math
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from app.broker.answering import ANSWER_OVERHEAD, JSON_FACTOR
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
            # The same positions as `from` (a page's new EventSource cannot send the
            # header): each partition resumes at its own offset, none from the lowest.
            resume = f"/topics/{topic}/stream?partitions=0,1&from={last}"
            async with http.stream("GET", resume) as r:
                got, _ = await _records(events(r), 1)
                assert got == [(0, 4, "later")]
            # from=0 is the log start wherever it moved, as "earliest" is (not offset 1).
            assert (await http.delete(f"/topics/{topic}")).status_code == 200
            await _produce(broker, topic, "anew")
            async with http.stream("GET", f"/topics/{topic}/stream?partitions=0&from=0") as r:
                assert r.status_code == 200
                got, _ = await _records(events(r), 1)
                assert got == [(0, 5, "anew")]


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
                               ("partitions=0", {"Last-Event-ID": "junk"}),
                               ("partitions=0&from=1:5", {}), ("partitions=0&from=0:x", {}),
                               ("partitions=0&from=0:1,0:2", {})]:
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


async def _metric(http: httpx.AsyncClient, prefix: str) -> float:
    """The sum of the broker's Prometheus samples whose line starts with ``prefix``."""
    text = (await http.get("/metrics/prometheus")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


SENT = 'llog_stream_events_total{event="records"}'
CLOSED = 'llog_stream_connections_total{outcome="closed"}'
HELD = "llog_answer_bytes_in_flight "
RECORD_BYTES = 100_000  # one record per event: the stream's max_bytes
DUE = 240  # records, 24 MB, each its own event
# The client's receive buffer, fixed: autotuned it grows to net.ipv4.tcp_rmem's maximum
# (32 MiB on some hosts), enough to take the whole backlog without any pacing.
RCVBUF = 64 * 1024
# Events counted sent that are not yet in the kernel: the one in the asyncio transport's
# buffer (the broker waits for it to drain before the next write, not after this one),
# up to its high-water mark (64 KiB) of the one before.
SLACK_EVENTS = 2


def _connection_holds(rcvbuf: int) -> int:
    """The most bytes that one connection holds between a broker that writes and a client
    that does not read, but for the broker's own buffer: the broker's send buffer, which
    grows at most to net.ipv4.tcp_wmem's maximum (or, were it set explicitly, twice
    net.core.wmem_max); the client's receive buffer (``rcvbuf``, as the kernel reports
    it); and what the client's event loop read ahead while it waited for the headers (a
    few socket reads, each at most a receive buffer: three are counted)."""
    tcp_wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    core_wmem = int(Path("/proc/sys/net/core/wmem_max").read_text())
    return max(tcp_wmem, 2 * core_wmem) + 4 * rcvbuf


async def test_a_slow_reader_is_paced_not_buffered(brokers: BrokerFactory,
                                                  topic: str) -> None:
    """A stream whose client does not read sends what the connection's socket buffers
    hold, then waits with its next batch (one read) until the client reads; meanwhile
    the broker streams the same backlog whole to a client that reads, so it is the
    socket, not the broker, that holds the first stream back. Read, it goes on to the
    end."""
    broker = brokers.start()
    value = "v" * RECORD_BYTES
    for _ in range(DUE // 30):
        await _produce(broker, topic, *[value] * 30)
    # Raw: compressed, these repetitive events would be small enough for the socket
    # buffers to take them all.
    url = f"/topics/{topic}/stream?from=earliest&max_bytes={RECORD_BYTES}&heartbeat_ms=1000"
    raw = {"accept-encoding": "identity"}
    small = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)])
    async with httpx.AsyncClient(base_url=broker.url, timeout=60) as http, \
            httpx.AsyncClient(base_url=broker.url, timeout=60, transport=small) as slow:
        with anyio.fail_after(120):
            async with slow.stream("GET", url, headers=raw) as waiting:
                assert waiting.status_code == 200
                sock = waiting.extensions["network_stream"].get_extra_info("socket")
                rcvbuf = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                most = _connection_holds(rcvbuf) // RECORD_BYTES + SLACK_EVENTS
                assert most < DUE // 2, f"the sockets hold {most} of {DUE} events"

                # ``waiting`` is not read. Another client that reads gets the whole
                # backlog from the same broker, so a stream that did not wait for its
                # socket would by now have sent it all (or most of it) as well.
                async with http.stream("GET", url, headers=raw) as r:
                    got, _ = await _records(events(r), DUE)
                    assert len(got) == DUE
                # Once its stream is released (the broker notices the close at its next
                # heartbeat), the counters are the waiting stream's and its own. The
                # broker is another process: there is no event to wait on but the count.
                while True:
                    if await _metric(http, CLOSED) >= 1:
                        break
                    await anyio.sleep(0.1)
                sent = await _metric(http, SENT) - DUE
                assert 0 < sent <= most, f"{sent} events sent to a client reading none"
                # It waits holding one read, the batch its socket has no room for.
                one_read = math.ceil(RECORD_BYTES * JSON_FACTOR) + ANSWER_OVERHEAD
                held = await _metric(http, HELD)
                assert one_read <= held < 2 * one_read, held

                # Read now, it goes on from where it waited to the end.
                got, _ = await _records(events(waiting), DUE)
                assert [offset for _, offset, _ in got] == list(range(1, DUE + 1))
