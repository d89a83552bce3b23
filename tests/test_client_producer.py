"""The batching producer (llog_client.Producer, AsyncProducer) against real brokers on
the real stack: what it stores, where, in which order, and what it does when brokers
fail, fill up or refuse."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import signal
import threading
from collections import defaultdict
from fractions import Fraction
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from app.storage.partitioner import partition_for_key as brokers_partition
from llog_client import (
    AsyncProducer,
    BufferFull,
    LlogClient,
    PayloadTooLarge,
    Producer,
    ProducerClosed,
    ProducerSettings,
    RecordMetadata,
)
from llog_client._partitioner import partition_for_key
from tests.helpers.cut_proxy import cutting_proxy_thread
from tests.helpers.stack import Broker, BrokerFactory

# The shared test broker refuses requests over 256 KiB and 1000 records.
SMALL = {"max_request_bytes": 200_000, "batch_bytes": 50_000, "max_request_records": 1000}


def _read_all(url: str, topic: str, partitions: int) -> dict[int, list[tuple[int, bytes]]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    with LlogClient(url) as llog:
        for p in range(partitions):
            out[p] = [(r.offset, r.value) for r in llog.iter_records(
                topic, p, start="earliest", follow=False)]
    return out


def test_client_places_keys_as_the_broker_does() -> None:
    keys = [os.urandom(n) for n in range(40) for _ in range(25)] + [b"", b"customer-17"]
    for partitions in (1, 2, 3, 7, 12, 1000):
        assert [partition_for_key(k, partitions) for k in keys] == [
            brokers_partition(k, partitions) for k in keys]


def test_records_land_where_the_broker_would_put_them(broker: Broker, topic: str) -> None:
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 5)
        # The broker's own placement: an entry without a partition, by its one key.
        by_broker = {}
        for i in range(20):
            key = f"k{i}".encode()
            result = httpx.post(f"{broker.url}/produce", json={"topic_partitions": [
                {"topic": topic, "records": [{"value": "x", "key": key.decode()}]}]})
            by_broker[key] = result.json()["results"][0]["partition"]
    with Producer(broker.url, **SMALL) as producer:
        futures = {k: producer.send(topic, b"v", key=k) for k in by_broker}
        producer.flush()
    assert {k: f.result().partition for k, f in futures.items()} == by_broker


def test_round_trip_of_every_kind_of_record(broker: Broker, topic: str) -> None:
    records = [(f"value-{i}".encode() * (i % 7), None if i % 3 else f"key-{i % 5}".encode(),
                [("trace", f"t{i}".encode())] if i % 11 == 0 else None,
                1_700_000_000_000 + i if i % 4 == 0 else None) for i in range(1500)]
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 3)
    with Producer(broker.url, **SMALL) as producer:
        futures = [producer.send(topic, v, key=k, headers=h, timestamp_ms=t)
                   for v, k, h, t in records]
        producer.flush()
    placed = [f.result() for f in futures]
    assert all(isinstance(m, RecordMetadata) and m.topic == topic for m in placed)
    stored = {}
    with LlogClient(broker.url) as llog:
        for p in range(3):
            for r in llog.iter_records(topic, p, start="earliest", follow=False):
                stored[(p, r.offset)] = (r.value, r.key, list(r.headers) or None, r.timestamp_ms)
    assert len(stored) == len(records)
    for (value, key, headers, ts), meta in zip(records, placed, strict=True):
        assert stored[(meta.partition, meta.offset)] == (value, key, headers, ts)
        if key is not None:
            assert meta.partition == partition_for_key(key, 3)


class Index:
    """An integer that is not an int (numpy's integers are such)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


def test_a_send_takes_what_its_signature_promises_compiled_or_not(
        broker: Broker, topic: str) -> None:
    """The per-record modules run compiled (llog_client.compiled()), where an annotation
    is checked at each call: what the public signature takes still goes, and what the
    wire cannot carry is refused at the send, the producer going on."""
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 3)
    settings = {**SMALL, "batch_bytes": 50e3, "buffer_bytes": 64e6, "ordered": 1,
                "max_in_flight": Index(4), "linger_ms": 2}
    with Producer(broker.url, **settings) as producer:
        sent = [
            producer.send(topic, bytearray(b"v0"), key=bytearray(b"k0"), partition=Index(1)),
            producer.send(topic, memoryview(b"v1"), key=memoryview(b"k1"), partition=2,
                          headers=[["h", bytearray(b"x")], ("i", memoryview(b"y"))],
                          timestamp_ms=Index(1_700_000_000_000)),
            producer.send(topic, "v2", key="k2", partition=True, headers=[("h", "z")]),
        ]
        refused = [
            ({"partition": 1.0}, TypeError), ({"timestamp_ms": 1.7e12}, TypeError),
            ({"partition": 2 ** 31}, ValueError), ({"headers": [(b"h", b"x")]}, TypeError),
            ({"key": 17}, TypeError), ({"timestamp_ms": -1}, ValueError)]
        for given, error in refused:
            with pytest.raises(error):
                producer.send(topic, b"never", **given)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            producer.send(b"bytes-topic", b"never")  # type: ignore[arg-type]
        sent.append(producer.send(topic, b"v3", partition=1))
        producer.flush()
        assert producer.metrics()["records_failed"] == 0
    assert [(m.partition, m.offset) for m in (f.result() for f in sent)] == [
        (1, 1), (2, 1), (1, 2), (1, 3)]
    with LlogClient(broker.url) as llog:
        stored = [(r.partition, r.value, r.key, r.headers, r.timestamp_ms)
                  for p in (1, 2) for r in llog.iter_records(topic, p, start="earliest",
                                                            follow=False)]
    assert stored == [(1, b"v0", b"k0", (), None), (1, b"v2", b"k2", (("h", b"z"),), None),
                      (1, b"v3", None, (), None),
                      (2, b"v1", b"k1", (("h", b"x"), ("i", b"y")), 1_700_000_000_000)]


def test_producer_settings_are_plain_numbers_and_a_plain_dataclass() -> None:
    settings = ProducerSettings(batch_bytes=50e3, linger_ms=Fraction(1, 2),  # type: ignore[arg-type]
                                ordered=0, max_in_flight=Index(3))  # type: ignore[arg-type]
    assert (settings.batch_bytes, settings.linger_ms, settings.ordered,
            settings.max_in_flight) == (50_000, 0.5, False, 3)
    assert type(settings.batch_bytes) is int and type(settings.linger_ms) is float
    assert copy.copy(settings) == pickle.loads(pickle.dumps(settings)) == settings

    @dataclasses.dataclass(frozen=True)
    class Mine(ProducerSettings):
        note: str = ""

    assert Mine(note="x").batch_bytes == ProducerSettings().batch_bytes
    for wrong in ({"batch_bytes": 1.5}, {"linger_ms": "soon"}):
        with pytest.raises(TypeError):
            ProducerSettings(**wrong)  # type: ignore[arg-type]


def test_records_of_a_partition_keep_their_order(broker: Broker, topic: str) -> None:
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 4)
    with Producer(broker.url, linger_ms=1, **SMALL) as producer:
        futures = [producer.send(topic, f"{i:06d}".encode(), key=f"k{i % 9}".encode())
                   for i in range(6000)]
        producer.flush()
        metrics = producer.metrics()
    assert metrics["records_sent"] == 6000 and metrics["records_failed"] == 0
    assert metrics["batches_sent"] < 600  # batched, not a request per record
    by_key: dict[int, list[int]] = defaultdict(list)
    for f in futures:
        m = f.result()
        by_key[m.partition].append(m.offset)
    for offsets in by_key.values():
        assert offsets == sorted(offsets)
    stored = _read_all(broker.url, topic, 4)
    for p, rows in stored.items():
        values = [int(v) for _, v in rows]
        assert values == sorted(values), f"partition {p} out of order"
    assert sum(map(len, stored.values())) == 6000


def test_retries_after_cut_answers_store_each_record_once(broker: Broker, topic: str) -> None:
    """The first answers are cut after the broker committed: the retries carry the
    batches' idempotency keys, so nothing is stored twice and order holds."""
    parts = urlsplit(broker.url)
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 2)
    with cutting_proxy_thread(parts.hostname or "", parts.port or 0, cut_first=3) as proxy, \
            Producer(proxy.url, linger_ms=2, retry_backoff_ms=10, compression="none",
                     **SMALL) as producer:
        futures = [producer.send(topic, f"{i:05d}".encode(), partition=i % 2)
                   for i in range(3000)]
        producer.flush()
        metrics = producer.metrics()
    assert proxy.cuts == 3 and metrics["retries"] >= 1
    assert any(f.result().duplicate for f in futures)
    stored = _read_all(broker.url, topic, 2)
    for p in (0, 1):
        assert [int(v) for _, v in stored[p]] == list(range(p, 3000, 2))
    assert {(f.result().partition, f.result().offset) for f in futures} == {
        (p, o) for p, rows in stored.items() for o, _ in rows}


def test_a_broker_killed_mid_flight_duplicates_nothing(brokers: BrokerFactory,
                                                       topic: str) -> None:
    first, second = brokers.start(), brokers.start()
    with LlogClient(first.url) as llog:
        llog.create_topic(topic, 3)
    acked = threading.Event()

    def on_delivery(meta: RecordMetadata | None, error: Exception | None) -> None:
        if meta is not None:
            acked.set()

    with Producer([first.url, second.url], linger_ms=2, retry_backoff_ms=20,
                  request_timeout_s=10, on_delivery=on_delivery, **SMALL) as producer:
        futures = [producer.send(topic, f"{i:06d}".encode(), key=f"{i % 13}".encode())
                   for i in range(2000)]
        assert acked.wait(30)
        first.process.signal(signal.SIGKILL)
        futures += [producer.send(topic, f"{i:06d}".encode(), key=f"{i % 13}".encode())
                    for i in range(2000, 6000)]
        producer.flush(timeout=120)
    placed = [f.result() for f in futures]
    stored = _read_all(second.url, topic, 3)
    values = [v for rows in stored.values() for _, v in rows]
    assert sorted(values) == [f"{i:06d}".encode() for i in range(6000)]  # once each
    lookup = {(p, o): v for p, rows in stored.items() for o, v in rows}
    assert [lookup[(m.partition, m.offset)] for m in placed] == [
        f"{i:06d}".encode() for i in range(6000)]


def test_a_full_buffer_blocks_then_raises(brokers: BrokerFactory, topic: str) -> None:
    """Nobody answers (the broker is stopped): sends fill the buffer, block, and raise
    BufferFull after max_block_ms; the bytes held never pass buffer_bytes."""
    paused = brokers.start()
    with LlogClient(paused.url) as llog:
        llog.create_topic(topic, 1)
    try:
        with Producer(paused.url, buffer_bytes=64_000, max_block_ms=300, linger_ms=1,
                      request_timeout_s=2, delivery_timeout_ms=4000, **SMALL) as producer:
            producer.send(topic, b"known", partition=0).result(10)  # the topic is looked up
            paused.process.signal(signal.SIGSTOP)
            sent = 0
            with pytest.raises(BufferFull):
                for _ in range(1000):
                    producer.send(topic, b"x" * 1000)
                    sent += 1
                    assert producer.metrics()["buffered_bytes"] <= 64_000
            assert 40 <= sent <= 64
    finally:
        paused.process.signal(signal.SIGCONT)


def test_close_delivers_what_was_queued_and_refuses_more(broker: Broker, topic: str) -> None:
    producer = Producer(broker.url, linger_ms=10_000, **SMALL)  # nothing leaves by linger
    futures = [producer.send(topic, f"r{i}".encode(), partition=0) for i in range(100)]
    assert not any(f.done() for f in futures)
    producer.close()
    assert [f.result(0).offset for f in futures] == list(range(1, 101))
    with pytest.raises(ProducerClosed):
        producer.send(topic, b"late", partition=0)


def test_flush_raises_a_failure_nobody_saw(broker: Broker, topic: str) -> None:
    """One record over the broker's max_record_bytes (64 KiB) fails its batch alone: the
    request it shared is sent again batch by batch, and flush reports the failure."""
    with LlogClient(broker.url) as llog:
        llog.create_topic(topic, 2)
    with Producer(broker.url, linger_ms=50, **SMALL) as producer:
        good = [producer.send(topic, b"fine", partition=0) for _ in range(10)]
        bad = producer.send(topic, b"x" * 70_000, partition=1)
        with pytest.raises(PayloadTooLarge):
            producer.flush()
        producer.flush()  # reported once
    assert [f.result().offset for f in good] == list(range(1, 11))
    assert isinstance(bad.exception(), PayloadTooLarge)


def test_async_producer_round_trip(broker: Broker, topic: str) -> None:
    async def main() -> list[RecordMetadata]:
        async with AsyncProducer(broker.url, **SMALL) as producer:
            first = await producer.send_and_wait(topic, b"first", partition=0)
            futures = [await producer.send(topic, f"r{i}".encode(), partition=0)
                       for i in range(500)]
            await producer.flush()
            assert "llog_producer_records_sent_total 501" in producer.prometheus()
            return [first, *[await f for f in futures]]

    placed = anyio.run(main)
    assert [m.offset for m in placed] == list(range(1, 502))
    stored = _read_all(broker.url, topic, 1)[0]
    assert [v for _, v in stored] == [b"first", *[f"r{i}".encode() for i in range(500)]]


def test_an_async_send_loop_lets_the_producers_task_run(broker: Broker, topic: str) -> None:
    """The producer's task shares the program's loop: a loop of sends that awaits
    nothing else still lets it run (to send batches and read answers) while it goes,
    not only once the buffer is full. A send cancelled where it lets the loop run has
    queued nothing."""
    from llog_client import _aio_producer

    async def main() -> tuple[int, bool]:
        async with AsyncProducer(broker.url, **SMALL) as producer:
            await producer.send_and_wait(topic, b"first", partition=0)
            ran = anyio.Event()

            async def mark() -> None:  # runs at the loop's next turn, whenever that is
                ran.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(mark)
                sent = 0
                # 100,000 one-byte records stay far below the buffer (no wait for space),
                # and take far longer than YIELD_EVERY_S to send.
                while not ran.is_set() and sent < 100_000:
                    await producer.send(topic, b"x", partition=0)
                    sent += 1
            # The next send lets the loop run: cancelled there, it queues nothing.
            producer._sends = _aio_producer.YIELD_CHECK_SENDS - 1
            producer._yield_at = 0.0
            with anyio.CancelScope() as scope:
                scope.cancel()
                await producer.send(topic, b"never", partition=0)
            await producer.flush()
            return sent, scope.cancelled_caught

    sent, cancelled = anyio.run(main)
    assert sent < 100_000
    assert cancelled
    stored = [v for _, v in _read_all(broker.url, topic, 1)[0]]
    assert stored == [b"first", *[b"x"] * sent]


class MockBrokers:
    """Brokers as an httpx mock transport: each produce body is read by the broker's own
    parser (app/wire/produce.py) and appended to an in-memory log; ``GET /topics/{t}``
    answers ``partitions`` and ``compression``; ``GET /cluster`` the members."""

    def __init__(self, partitions: int = 4, compression: str = "none") -> None:
        self.partitions, self.compression = partitions, compression
        self.logs: dict[int, list[bytes]] = defaultdict(list)
        self.requests: list[tuple[str, str | None, list[int]]] = []  # host, encoding, parts

    def __call__(self, request: httpx.Request) -> httpx.Response:
        from app.wire import produce as llp1

        path = request.url.path
        if path.startswith("/topics/"):
            return httpx.Response(200, json={"topic": path[8:], "partitions": self.partitions,
                                             "compression": self.compression})
        if path == "/cluster":
            return httpx.Response(200, json={"digest": "d", "algorithm": "rendezvous-sha256",
                                             "members": [{"member_id": m, "url": f"http://{m}",
                                                          "roles": ["write"]}
                                                         for m in ("b1", "b2", "b3")]})
        body = request.content
        encoding = request.headers.get("content-encoding")
        if encoding == "zstd":
            import zstandard
            body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
        entries = llp1.parse(body, 1000)
        results = []
        for e in entries:
            assert e.partition is not None
            log = self.logs[e.partition]
            start = len(log) + 1
            log.extend(v if isinstance(v, bytes) else v.value for v in e.records)
            results.append({"ok": True, "topic": e.topic, "partition": e.partition,
                            "start_offset": start, "end_offset": len(log),
                            "count": len(log) - start + 1})
        self.requests.append((request.url.host, encoding, [e.partition for e in entries]))
        return httpx.Response(200, json={"results": results})


def test_requests_to_compressed_topics_are_compressed() -> None:
    for stored, expected in (("zstd", "zstd"), ("none", None)):
        mock = MockBrokers(compression=stored)
        with Producer("http://b", transport=httpx.MockTransport(mock)) as producer:
            for i in range(2000):
                producer.send("t", b"compressible text %d " % i * 20)
            producer.flush()
        assert {encoding for _, encoding, _ in mock.requests} == {expected}
        assert sum(map(len, mock.logs.values())) == 2000


def test_preferred_routing_sends_each_partition_to_its_broker() -> None:
    from llog_client import _routing as routing

    mock = MockBrokers(partitions=6)
    with Producer("http://lb", route="preferred", transport=httpx.MockTransport(mock),
                  linger_ms=1) as producer:
        for i in range(3000):
            producer.send("t", b"v", partition=i % 6)
        producer.flush()
    for host, _, partitions in mock.requests:
        assert {routing.preferred("t", p, ["b1", "b2", "b3"]) for p in partitions} == {host}
    assert [len(mock.logs[p]) for p in range(6)] == [500] * 6
