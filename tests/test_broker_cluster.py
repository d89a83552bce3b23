"""Several brokers and workers on one stack; back-pressure; graceful shutdown."""

from __future__ import annotations

import random
import signal
from typing import Any

import anyio
import httpx

from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from tests.helpers.bodies import consume_body, produce_body, without_times
from tests.helpers.long_polls import NEVER_MS, until_parked, woken_by_a_write
from tests.helpers.stack import BrokerFactory, make_settings, open_engine

Acked = dict[tuple[int, int], str]  # (partition, offset) -> value


class Progress:
    """Set once ``target`` produce requests have been acknowledged."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.reached = anyio.Event()

    def ack(self) -> None:
        self.count += 1
        if self.count >= self.target:
            self.reached.set()


async def _produce_loop(client: httpx.AsyncClient, topic: str, partitions: int, tag: str,
                        n: int, acked: Acked, statuses: list[int] | None = None,
                        progress: Progress | None = None) -> None:
    for i in range(n):
        p = random.randrange(partitions)
        values = [f"{tag}-{i}-{j}" for j in range(random.randint(1, 4))]
        try:
            r = await client.post("/produce", json=produce_body(topic, *values, partition=p))
        except httpx.TransportError:
            if statuses is not None:
                statuses.append(-1)
            return  # the broker went away (shutdown test)
        if statuses is not None:
            statuses.append(r.status_code)
        if r.status_code == 200:
            res = r.json()["results"][0]
            for offset, value in zip(range(res["start_offset"], res["end_offset"] + 1), values,
                                     strict=True):
                assert (p, offset) not in acked, "two acks for one offset"
                acked[(p, offset)] = value
            if progress is not None:
                progress.ack()


async def _read_all(client: httpx.AsyncClient, topic: str, partition: int) -> dict[int, str]:
    out: dict[int, str] = {}
    offset = 1
    while True:
        r = await client.post("/consume", json=consume_body(topic, offset, partition))
        res = r.json()["results"][0]
        assert res["ok"], res
        for rec in res["records"]:
            out[rec["offset"]] = rec["value"]
        if res["next_offset"] > res["high_watermark"]:
            return out
        offset = res["next_offset"]


async def _assert_durable(stack: LocalStack, topic: str, partitions: int, acked: Acked) -> None:
    """Straight from storage: contiguous offsets from 1, every acknowledged record there."""
    async with open_engine(make_settings(stack)) as e:
        for p in range(partitions):
            result = await e.reader.read(TopicPartition(topic, p), 1)
            offsets = [o for o, _ in result.records]
            assert offsets == list(range(1, result.high_watermark + 1))
            stored = dict(result.records)
            for (ap, offset), value in acked.items():
                if ap == p:
                    assert stored[offset] == value.encode(), (p, offset)


async def test_two_brokers_append_to_the_same_partitions(
    brokers: BrokerFactory, stack: LocalStack, topic: str
) -> None:
    b1, b2 = brokers.start(), brokers.start()
    acked: Acked = {}
    async with httpx.AsyncClient(base_url=b1.url, timeout=30) as c1, \
            httpx.AsyncClient(base_url=b2.url, timeout=30) as c2:
        async with anyio.create_task_group() as tg:
            for w in range(3):
                tg.start_soon(_produce_loop, c1, topic, 3, f"one{w}", 15, acked)
                tg.start_soon(_produce_loop, c2, topic, 3, f"two{w}", 15, acked)
        for p in range(3):
            via1, via2 = await _read_all(c1, topic, p), await _read_all(c2, topic, p)
            assert via1 == via2
            assert sorted(via1) == list(range(1, len(via1) + 1))
            for (ap, offset), value in acked.items():
                if ap == p:
                    assert via1[offset] == value
    assert sum(1 for _ in acked) > 0
    await _assert_durable(stack, topic, 3, acked)


async def test_long_poll_wakes_on_a_write_through_another_broker(
    brokers: BrokerFactory, topic: str
) -> None:
    b1, b2 = brokers.start(max_wait_ms_ceiling=str(NEVER_MS)), brokers.start()
    async with httpx.AsyncClient(base_url=b1.url, timeout=60) as c1, \
            httpx.AsyncClient(base_url=b2.url, timeout=30) as c2:
        # Prime broker 1's tail cache: it knows the partition is empty at offset 1.
        r = await c1.post("/consume", json=consume_body(topic, 1))
        assert r.json()["results"][0]["records"] == []

        # The poll parks on broker 1, then broker 2 writes, then the poll answers.
        got = await woken_by_a_write(c1, c2, topic, "from-b2")
    assert without_times(got["records"]) == [{"offset": 1, "value": "from-b2"}]


async def test_workers_share_a_port_and_wake_each_other(
    brokers: BrokerFactory, topic: str
) -> None:
    b = brokers.start(workers=2, tail_cache_dir=str(brokers.tmp / "tail-cache"),
                      max_wait_ms_ceiling=str(NEVER_MS))
    results: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=b.url, timeout=60, limits=limits) as client:

        async def poll() -> None:
            r = await client.post("/consume", json=consume_body(topic, 1,
                                                                max_wait_ms=NEVER_MS))
            results.append(r.json()["results"][0])

        # All eight park, then the write lands in one worker, then every poll answers
        # with it. Their own deadline is far beyond this bound, which only catches a
        # poll that was never woken.
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for _ in range(8):  # spread over both workers by the kernel
                    tg.start_soon(poll)
                await until_parked(client, 8)
                r = await client.post("/produce", json=produce_body(topic, "hello"))
                assert r.status_code == 200
    assert len(results) == 8
    assert all(without_times(res["records"]) == [{"offset": 1, "value": "hello"}]
               for res in results)


async def test_a_restarted_worker_trusts_no_cache_file_until_the_log_confirms_it(
    brokers: BrokerFactory, stack: LocalStack, topic: str
) -> None:
    """A shared cache directory outlives the worker that filled it, and its hw file can
    lag the log: here, commits made while no worker used the directory. A worker started
    on it must read the log before answering "nothing yet", not park on the file's word."""
    cache_dir = str(brokers.tmp / "stale-tail-cache")
    first = brokers.start(tail_cache_dir=cache_dir)
    async with httpx.AsyncClient(base_url=first.url, timeout=30) as client:
        r = await client.post("/produce", json=produce_body(topic, "a", "b", "c"))
        assert r.status_code == 200, r.text
        r = await client.post("/consume", json=consume_body(topic, 4))  # hw file: 3
        assert r.json()["results"][0]["records"] == []
    first.process.stop()
    tp = TopicPartition(topic, 0)
    async with open_engine(make_settings(stack)) as e:  # commits the file never heard of
        (done,) = await e.writer.append_shared([AppendGroup(tp, [b"d", b"e"])])
        assert isinstance(done, AppendResult) and done.start_offset == 4
    again = brokers.start(tail_cache_dir=cache_dir)
    async with httpx.AsyncClient(base_url=again.url, timeout=60) as client:
        r = await client.post("/consume", json=consume_body(topic, 4, max_wait_ms=10_000))
    got = r.json()["results"][0]
    assert [x["offset"] for x in got["records"]] == [4, 5], got


async def test_backpressure_refuses_with_503_and_every_200_is_durable(
    brokers: BrokerFactory, stack: LocalStack, topic: str
) -> None:
    b = brokers.start(batch_buffer_max_bytes="64", batch_max_bytes="64",
                      batch_max_delay_ms="200")
    acked: Acked = {}
    statuses: list[int] = []
    async with httpx.AsyncClient(base_url=b.url, timeout=30) as client:
        async with anyio.create_task_group() as tg:
            for w in range(12):
                tg.start_soon(_produce_loop, client, topic, 2, f"bp{w}", 4, acked, statuses)
        r = await client.post("/produce", json=produce_body(topic, "x" * 40, "y" * 40))
        assert r.status_code in (200, 503)
    assert 503 in statuses and 200 in statuses
    assert set(statuses) <= {200, 503}
    await _assert_durable(stack, topic, 2, acked)


async def test_graceful_shutdown_under_load_loses_no_acknowledged_record(
    brokers: BrokerFactory, stack: LocalStack, topic: str
) -> None:
    b = brokers.start(batch_max_delay_ms="20")
    acked: Acked = {}
    statuses: list[int] = []
    progress = Progress(30)
    async with (
        httpx.AsyncClient(base_url=b.url, timeout=30) as client,
        anyio.create_task_group() as tg,
    ):
        for w in range(6):
            tg.start_soon(_produce_loop, client, topic, 2, f"gs{w}", 400, acked, statuses,
                          progress)
        await progress.reached.wait()  # under real load now
        b.process.signal(signal.SIGTERM)
    b.process.stop()
    assert progress.count >= 30
    assert set(statuses) <= {200, 503, -1}
    await _assert_durable(stack, topic, 2, acked)
