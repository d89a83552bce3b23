"""Consumers never miss committed records: a remote commit landing while a read is in
flight, the last record before an idle period, several brokers with compaction running.

A long-poll answers with nothing only once its ``max_wait_ms`` is over, and nothing here
waits that long for a write: an answer without records is a missed wake-up, so that is
what fails the tests (outer timeouts are generous, never a bound on latency)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.broker.answer_budget import AnswerBudget
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

pytestmark = pytest.mark.slow  # chaos: 200 bursts from two brokers


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
                                 answers=AnswerBudget(1 << 30, max_wait_s=1),
                                 max_long_polls=4)
        with anyio.fail_after(60):  # a hang; a missed wake-up answers empty after 20 s
            (outcome,) = await service.consume([Fetch(tp, 2)], max_wait_s=20, min_bytes=1,
                                               max_bytes=1 << 20)
        assert raced.is_set()
        assert isinstance(outcome, ReadResult) and outcome.records == [(2, b"2")]


MAX_WAIT_MS = 20_000  # far longer than any gap: an empty answer is a missed wake-up


class _Log:
    """Acknowledged records per partition, and what each consumer has seen of it."""

    def __init__(self, partitions: int, consumers: int) -> None:
        self.acked: dict[int, dict[int, str]] = {p: {} for p in range(partitions)}
        self.seen: dict[tuple[int, int], dict[int, str]] = {
            (c, p): {} for c in range(consumers) for p in range(partitions)}
        self.changed = anyio.Event()

    def saw(self, consumer: int, partition: int, records: list[dict[str, object]]) -> None:
        seen = self.seen[consumer, partition]
        for rec in records:
            offset, value = rec["offset"], rec["value"]
            assert isinstance(offset, int) and isinstance(value, str)
            assert offset not in seen, "a record delivered twice"
            seen[offset] = value
        self.changed.set()
        self.changed = anyio.Event()

    def caught_up(self) -> bool:
        return all(set(self.acked[p]) <= set(seen) for (_, p), seen in self.seen.items())


async def _consume_forever(client: httpx.AsyncClient, topic: str, consumer: int,
                           partition: int, log: _Log) -> None:
    """Long-polls one record at a time (each answer stops below the high watermark
    while records wait, so the broker looks up the next read ahead)."""
    offset = 1
    while True:
        r = await client.post("/consume", json=consume_body(
            topic, offset, partition, max_wait_ms=MAX_WAIT_MS, max_bytes=1))
        res = r.json()["results"][0]
        assert res["ok"], res
        waiting = sorted(o for o in log.acked[partition] if o >= offset)
        assert res["records"], (
            f"partition {partition}: a long-poll at offset {offset} waited its whole "
            f"{MAX_WAIT_MS} ms, though offsets {waiting} were acknowledged and nothing "
            "else was written meanwhile (a missed wake-up)")
        log.saw(consumer, partition, res["records"])
        offset = res["next_offset"]


# The suite's short, seeded form, and the long form on demand (``-m long``): the same
# bursts and gaps, the long form over hundreds more.
@pytest.mark.parametrize("gaps", [60, pytest.param(400, marks=pytest.mark.long)])
async def test_consumers_on_another_broker_see_every_record_through_idle_gaps(
        brokers: BrokerFactory, topic: str, gaps: int) -> None:
    """Two brokers produce in short bursts (both at once, racing for the partition)
    with an idle gap after each, ``gaps`` times, while a third serves the long-polls
    of two consumers of each partition, all three compact, and the consumers' broker
    reads and looks up ahead: every acknowledged record reaches every consumer in order
    and once, and the last one of each burst is answered by the long-poll waiting for
    it, with nothing written after it until the consumers have it."""
    compacting = {"compaction_min_entry_age_ms": "300", "compaction_interval_s": "0.3",
                  "compaction_discovery_interval_s": "1", "read_ahead_max_inflight": "8"}
    producers = [brokers.start(**compacting), brokers.start(**compacting)]
    consumer = brokers.start(**compacting)
    partitions, consumers = 2, 2
    log = _Log(partitions, consumers)
    rng = random.Random(25)
    limits = httpx.Limits(max_connections=8)
    async with (httpx.AsyncClient(base_url=consumer.url, timeout=60, limits=limits) as c,
                httpx.AsyncClient(base_url=producers[0].url, timeout=30) as p0,
                httpx.AsyncClient(base_url=producers[1].url, timeout=30) as p1,
                anyio.create_task_group() as tg):
        for who in range(consumers):
            for p in range(partitions):
                tg.start_soon(_consume_forever, c, topic, who, p, log)

        async def produce(via: httpx.AsyncClient, p: int, values: list[str]) -> None:
            for value in values:
                r = await via.post("/produce", json=produce_body(topic, value, partition=p))
                assert r.status_code == 200, r.text
                log.acked[p][r.json()["results"][0]["start_offset"]] = value

        for gap in range(gaps):
            p = rng.randrange(partitions)
            async with anyio.create_task_group() as burst:
                for n, via in enumerate((p0, p1)):
                    burst.start_soon(produce, via, p, [
                        f"g{gap}-{n}-{i}" for i in range(rng.randint(1 - n, 2))])
            # A missed wake-up fails in the consumer after MAX_WAIT_MS; this bound only
            # catches a hang.
            with anyio.fail_after(MAX_WAIT_MS / 1000 * 3):
                while not log.caught_up():
                    await log.changed.wait()
            # The idle gap: the tail goes quiet (now and then long enough for the
            # compactors to rewrite it).
            await anyio.sleep(1.0 if gap % 20 == 19 else rng.uniform(0.02, 0.15))
        tg.cancel_scope.cancel()
    for (_, p), seen in log.seen.items():
        assert seen == log.acked[p]
        assert sorted(seen) == list(range(1, len(seen) + 1))
    # The consumers' broker took reads planned ahead, and heard of the others' commits.
    async with httpx.AsyncClient(base_url=consumer.url, timeout=30) as client:
        text = (await client.get("/metrics/prometheus")).text
    figures = {s.name: s.value for f in text_string_to_metric_families(text)
               for s in f.samples}
    print(f"{gaps} idle gaps; reads planned ahead on the consumers' broker: "
          f"{figures['llog_plan_ahead_taken_total']:.0f}")
    assert figures["llog_plan_ahead_taken_total"] > 0, figures
    assert figures["llog_watch_remote_changes_total"] > 0, figures
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
