"""A tail cache never serves a record below a log start its process has read, and its
answers say that log start: the window between another broker moving the log start
(retention, a truncation, a delete) and this broker's next look at the cache, driven
directly on the real Oxia and MinIO."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.broker.answer_budget import AnswerBudget
from app.broker.consume import ConsumeService, Fetch
from app.broker.consume_call import ConsumeCall, Consuming
from app.broker.metrics import ConsumeMetrics
from app.broker.watch import PartitionWatch
from app.errors import OffsetOutOfRange
from app.localstack.stack import LocalStack
from app.routes.models import ConsumeRequest
from app.settings_groups import LimitSettings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_positions import PartitionOffsets
from app.storage.reader import ReadOutcome, ReadRequest, ReadResult
from app.storage.retention import move_log_start
from app.tailcache import CacheHit, SharedTailCache, TailCache, open_tail_cache
from tests.helpers.compaction import compaction_settings
from tests.helpers.stack import open_engine

VALUES = [b"r1", b"r2", b"r3", b"r4", b"r5"]


@pytest.fixture(params=["memory", "shared-directory"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TailCache]:
    made = open_tail_cache(None if request.param == "memory" else tmp_path / "tail",
                           1 << 20, store_id="test")
    yield made
    made.close()


async def _read(service: ConsumeService, tp: TopicPartition, offset: int,
                log_start: int | None = None) -> ReadOutcome:
    (outcome,) = await service.consume([Fetch(tp, offset, log_start=log_start)],
                                       max_wait_s=0, min_bytes=1, max_bytes=1 << 20)
    return outcome


async def test_no_record_below_a_log_start_another_broker_moved_is_served_again(
        stack: LocalStack, tp: TopicPartition, cache: TailCache) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as other, open_engine(settings) as this:
        (done,) = await this.writer.append_shared([AppendGroup(tp, VALUES)])
        assert isinstance(done, AppendResult) and done.start_offset == 1
        cache.put(tp, 1, VALUES)  # this broker's own appends, cached as it acknowledged
        if hasattr(cache, "flush"):
            cache.flush()
        watch = PartitionWatch()
        service = ConsumeService(this.reader, cache, watch,
                                 ConsumeMetrics(CollectorRegistry()),
                                 answers=AnswerBudget(1 << 30, max_wait_s=1),
                                 max_long_polls=4)
        first = await _read(service, tp, 1)  # from the log: the partition is fresh now
        assert isinstance(first, ReadResult) and [o for o, _ in first.records] == [1, 2, 3,
                                                                                 4, 5]
        # Another broker's retention moves the log start to 4. Before its notification
        # arrives, a consumer asks for "earliest": the lookup reads 4 from the log, and
        # the cache, which knew only 1, answers from there, saying so.
        await move_log_start(other.oxia, other.layout, tp, 4, None)
        hits = cache.statistics().hits
        earliest = await _read(service, tp, 4, log_start=4)
        assert cache.statistics().hits == hits + 1
        assert isinstance(earliest, ReadResult) and earliest.log_start == 4, earliest
        assert [o for o, _ in earliest.records] == [4, 5]
        watch.notify_remote(tp)
        tail = await _read(service, tp, 6)  # read at the tail: fresh again
        assert isinstance(tail, ReadResult) and tail.records == [] and tail.log_start == 4
        # Below the new start the cache answers nothing: the log says it is gone.
        below = await _read(service, tp, 2)
        assert isinstance(below, OffsetOutOfRange) and below.log_start == 4, below
        hits = cache.statistics().hits
        kept = await _read(service, tp, 4)
        assert isinstance(kept, ReadResult) and [o for o, _ in kept.records] == [4, 5]
        # Answered by the cache, with the log start it knows (not the first offset).
        assert cache.statistics().hits == hits + 1 and kept.log_start == 4, kept
        # The partition's records dropped (a topic forgotten), then a late put of its
        # old records (an acknowledgement's callback, a worker's write behind): what
        # the cache learned of the log outlives its records.
        cache.drop(tp)
        cache.put(tp, 1, VALUES)
        if hasattr(cache, "flush"):
            cache.flush()
        again = await _read(service, tp, 2)
        assert isinstance(again, OffsetOutOfRange) and again.log_start == 4, again


class _AheadReader:
    """A log reader whose read was planned from a control record looked up a moment
    before the caller's own lookup of the log start (app/storage/plan_ahead.py)."""

    async def read_many(self, requests: list[ReadRequest], max_bytes: int,
                        oversized_first: bool) -> list[ReadOutcome]:
        (r,) = requests
        return [ReadResult(r.tp, [(r.offset, b"x")], 600, r.offset + 1, [0], log_start=1,
                           looked_up_ahead=True)]


async def test_a_read_from_the_log_says_no_older_start_than_its_caller_read() -> None:
    tp = TopicPartition("t", 0)
    service = ConsumeService(_AheadReader(), open_tail_cache(None, 1 << 20, store_id="t"),
                             PartitionWatch(), ConsumeMetrics(CollectorRegistry()),
                             answers=AnswerBudget(1 << 30, max_wait_s=1), max_long_polls=1)
    earliest = await _read(service, tp, 500, log_start=500)
    assert isinstance(earliest, ReadResult) and earliest.log_start == 500, earliest
    assert [o for o, _ in earliest.records] == [500]


def test_a_shared_cache_answers_the_start_it_checked(tmp_path: Path) -> None:
    """A start noted (on the event loop) while a worker thread reads the directory is
    not said of records read below it."""
    tp = TopicPartition("t", 0)
    cache = open_tail_cache(tmp_path / "tail", 1 << 20, store_id="t")
    assert isinstance(cache, SharedTailCache)
    try:
        cache._files.put(tp, 78, [b"v%d" % o for o in range(78, 149)])  # another worker's
        looked = cache._lookup

        def noted_meanwhile(*args: Any) -> CacheHit | None:
            hit = looked(*args)
            cache.note_log_start(tp, 149)
            return hit

        cache._lookup = noted_meanwhile  # type: ignore[method-assign]
        hit = cache.get(tp, 100, None, None)
        assert hit is not None and hit.records[0][0] == 100 and hit.log_start <= 100, hit
    finally:
        cache.close()


class _StalePositions:
    """Offset lookups answered from before another broker moved the log start."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp

    async def lookup_all(self, queries: Any) -> list[PartitionOffsets]:
        return [PartitionOffsets(self.tp, 1, len(VALUES)) for _ in queries]


class _Topics:
    async def check_readable(self, tp: TopicPartition) -> None:
        return None


async def test_earliest_reads_the_start_with_the_records(
        stack: LocalStack, tp: TopicPartition, cache: TailCache) -> None:
    """"earliest" is the start the read itself finds: a move of it landing between a
    lookup and the read (here, a lookup from before it) is never refused as out of
    range (the history checker's log_start_refused) nor answered with the old start."""
    settings = compaction_settings(stack)
    async with open_engine(settings) as other, open_engine(settings) as this:
        await this.writer.append_shared([AppendGroup(tp, VALUES)])
        await move_log_start(other.oxia, other.layout, tp, 4, None)
        service = ConsumeService(this.reader, cache, PartitionWatch(),
                                 ConsumeMetrics(CollectorRegistry()),
                                 answers=AnswerBudget(1 << 30, max_wait_s=1),
                                 max_long_polls=4)
        consuming = Consuming(LimitSettings(), (), service,
                              _StalePositions(tp),  # type: ignore[arg-type]
                              None,  # type: ignore[arg-type]  # no group is read
                              _Topics(),  # type: ignore[arg-type]
                              ConsumeMetrics(CollectorRegistry()))
        ask = ConsumeRequest.model_validate({"topic_partitions": [
            {"topic": tp.topic, "partition": tp.partition, "fetch_offset": "earliest"}],
            "max_wait_ms": 0})

        async def once(read: Any) -> tuple[Any]:
            return (await read(),)

        answer = await ConsumeCall(consuming, ask, binary=False, accept_encoding=None,
                                   until=once).answer()
        assert answer is not None
        (result,) = json.loads(b"".join(answer.parts))["results"]
        assert result["ok"] and result["log_start_offset"] == 4, result
        assert [r["offset"] for r in result["records"]] == [4, 5]
