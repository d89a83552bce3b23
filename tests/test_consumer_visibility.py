"""Consumers never miss committed records: a remote commit landing while a read is in
flight, the last record before an idle period, several brokers with compaction running.
Waits are bounded well below ``max_wait_ms``, so a missed wake-up fails the test."""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry

from app.broker.consume import ConsumeService, Fetch
from app.broker.metrics import ConsumeMetrics
from app.broker.watch import PartitionWatch
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup
from app.storage.keys import TopicPartition
from app.storage.reader import ReadOutcome, ReadRequest, ReadResult
from app.tailcache import MemoryTailCache
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.compaction import compaction_settings
from tests.helpers.stack import BrokerFactory, open_engine

pytestmark = pytest.mark.stack


async def test_a_remote_commit_during_a_read_is_never_lost(stack: LocalStack,
                                                           tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        await a.writer.append_shared([AppendGroup(tp, [b"1"])])
        watch = PartitionWatch()
        cache = MemoryTailCache(1 << 20, store_id="test")
        cache.note_high_watermark(tp, 1)
        watch.notify_remote(tp)  # B heard of a change: its cache is not to be trusted
        real = b.reader.read_many
        raced = anyio.Event()

        async def read_many(requests: Sequence[ReadRequest], **kw: object
                            ) -> list[ReadOutcome]:
            results = await real(requests, **kw)  # type: ignore[arg-type]
            if not raced.is_set():  # A commits, and its notification arrives, meanwhile
                await a.writer.append_shared([AppendGroup(tp, [b"2"])])
                watch.notify_remote(tp)
                raced.set()
            return results

        b.reader.read_many = read_many  # type: ignore[method-assign]
        service = ConsumeService(b.reader, cache, watch, ConsumeMetrics(CollectorRegistry()),
                                 max_long_polls=4)
        with anyio.fail_after(5):  # max_wait is 20 s: only a wake-up answers in time
            (outcome,) = await service.consume([Fetch(tp, 2)], max_wait_s=20, min_bytes=1,
                                               max_bytes=1 << 20)
        assert raced.is_set()
        assert isinstance(outcome, ReadResult) and outcome.records == [(2, b"2")]


class _Log:
    """Acknowledged records per partition, and what the consumer has seen."""

    def __init__(self, partitions: int) -> None:
        self.acked: dict[int, dict[int, str]] = {p: {} for p in range(partitions)}
        self.seen: dict[int, dict[int, str]] = {p: {} for p in range(partitions)}
        self.changed = anyio.Event()

    def saw(self, partition: int, records: list[dict[str, object]]) -> None:
        for rec in records:
            offset, value = rec["offset"], rec["value"]
            assert isinstance(offset, int) and isinstance(value, str)
            assert offset not in self.seen[partition], "a record delivered twice"
            self.seen[partition][offset] = value
        self.changed.set()
        self.changed = anyio.Event()

    def caught_up(self, partition: int, offset: int) -> bool:
        return offset in self.seen[partition]


async def _consume_forever(client: httpx.AsyncClient, topic: str, partition: int,
                           log: _Log) -> None:
    offset = 1
    while True:
        r = await client.post("/consume", json=consume_body(
            topic, offset, partition, max_wait_ms=20000))
        res = r.json()["results"][0]
        assert res["ok"], res
        log.saw(partition, res["records"])
        offset = res["next_offset"]


async def test_consumers_on_another_broker_see_every_record_through_idle_gaps(
        brokers: BrokerFactory, topic: str) -> None:
    """Two brokers produce in bursts with idle gaps between them while a third serves
    long-polls and all three compact: every acknowledged record reaches the consumer,
    in order and once, each within a bound far below the long-poll wait."""
    compacting = {"compaction_min_entry_age_ms": "300", "compaction_interval_s": "0.3",
                  "compaction_discovery_interval_s": "1"}
    producers = [brokers.start(**compacting), brokers.start(**compacting)]
    consumer = brokers.start(**compacting)
    partitions, log = 2, _Log(2)
    limits = httpx.Limits(max_connections=8)
    async with (httpx.AsyncClient(base_url=consumer.url, timeout=30, limits=limits) as c,
                anyio.create_task_group() as tg):
        for p in range(partitions):
            tg.start_soon(_consume_forever, c, topic, p, log)
        for burst in range(6):
            via = producers[burst % 2]
            async with httpx.AsyncClient(base_url=via.url, timeout=30) as client:
                for i in range(5):
                    p = random.randrange(partitions)
                    value = f"b{burst}-{i}"
                    r = await client.post("/produce", json=produce_body(topic, value,
                                                                        partition=p))
                    assert r.status_code == 200, r.text
                    offset = r.json()["results"][0]["start_offset"]
                    log.acked[p][offset] = value
                    with anyio.fail_after(3):  # the long-poll waits 20 s
                        while not log.caught_up(p, offset):
                            await log.changed.wait()
            await anyio.sleep(1.5)  # an idle gap: the tail goes quiet, compaction runs
        tg.cancel_scope.cancel()
    assert log.seen == log.acked
    for p in range(partitions):
        assert sorted(log.seen[p]) == list(range(1, len(log.seen[p]) + 1))
    # A new consumer reads everything back from the start, through compacted data.
    async with httpx.AsyncClient(base_url=producers[0].url, timeout=30) as client:
        for p in range(partitions):
            offset, replay = 1, {}
            while offset <= len(log.acked[p]):
                r = await client.post("/consume", json=consume_body(topic, offset, p,
                                                                    max_wait_ms=0))
                res = r.json()["results"][0]
                replay.update({rec["offset"]: rec["value"] for rec in res["records"]})
                offset = res["next_offset"]
            assert replay == log.acked[p]
