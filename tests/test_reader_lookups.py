"""What a catch-up read asks Oxia for (app/storage/reader.py): a consumer reading one
compacted blob over many answers takes its index entry from the reader, and a partition
an answer had no room for keeps its lookup for the next read. The real Oxia and MinIO.

A lookup's age is read on the reader's clock: each test gives it one that moves only when
the test moves it, so the windows (half a second, a second) fall where the test puts
them, however long the reads themselves take."""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio

from app.storage.blob_lookups import CONTROL_REUSE_S
from app.storage.keys import TopicPartition
from app.storage.plan_ahead import MAX_AGE_S
from app.storage.reader import LogReader, ReadRequest, ReadResult
from tests.helpers.compaction import append_batches, make_compactor
from tests.helpers.stack import Engine


def _count_calls(engine: Engine, asked: Counter[str]) -> None:
    real_scan, real_get = engine.oxia.range_scan, engine.oxia.get

    async def scan(lo: str, hi: str, partition_key: str, **kw: Any) -> Any:
        asked["scan " + partition_key] += 1
        return await real_scan(lo, hi, partition_key, **kw)

    async def get(key: str, partition_key: str, **kw: Any) -> Any:
        asked[("control " if key.endswith("control") else "get ") + partition_key] += 1
        return await real_get(key, partition_key, **kw)

    engine.oxia.range_scan = scan  # type: ignore[method-assign]
    engine.oxia.get = get  # type: ignore[method-assign]


async def test_a_catch_up_through_a_compacted_blob_scans_its_index_once(
        engine: Engine, topic: str) -> None:
    tp = TopicPartition(topic, 0)
    acked = await append_batches(engine.writer, tp, 20, 10)
    compactor = make_compactor(engine, min_entry_age_ms=0, chunk_bytes=4096)
    assert (await compactor.compact_once(tp)).did_work

    # The consumer reads again every eighth of a second (by the reader's clock): a
    # control record serves the read that read it and the next four, at most half a
    # second (CONTROL_REUSE_S) later.
    now, step = [1000.0], CONTROL_REUSE_S / 4
    reader = LogReader(engine.oxia, engine.s3, engine.layout, clock=lambda: now[0])
    asked: Counter[str] = Counter()
    _count_calls(engine, asked)
    got: dict[int, bytes] = {}
    offset, reads = 1, 0
    while offset <= max(acked):
        result = await reader.read(tp, offset, max_records=10)
        got.update((o, bytes(v.value if hasattr(v, "value") else v))
                   for o, v in result.records)
        offset, reads = result.next_offset, reads + 1
        now[0] += step
    assert got == acked
    assert reads == 20
    # One walk found the compacted entry; every later read took it from the reader, and
    # the control record with it while that was at most half a second old: reads 1, 6,
    # 11 and 16 read it.
    assert asked["scan " + tp.partition_key] == 1, asked
    assert asked["control " + tp.partition_key] == 4, asked


async def test_a_read_inside_a_blob_takes_a_control_record_at_most_half_a_second_old(
        engine: Engine, topic: str) -> None:
    tp = TopicPartition(topic, 0)
    await append_batches(engine.writer, tp, 10, 10)
    compactor = make_compactor(engine, min_entry_age_ms=0, chunk_bytes=4096)
    assert (await compactor.compact_once(tp)).did_work
    now = [1000.0]
    reader = LogReader(engine.oxia, engine.s3, engine.layout, clock=lambda: now[0])
    asked: Counter[str] = Counter()
    _count_calls(engine, asked)
    first = await reader.read(tp, 1, max_records=10)
    assert not first.looked_up_ahead and asked["control " + tp.partition_key] == 1
    now[0] += CONTROL_REUSE_S - 0.01
    second = await reader.read(tp, first.next_offset, max_records=10)
    assert second.looked_up_ahead  # the consumer is told its high watermark may be old
    assert asked["control " + tp.partition_key] == 1
    now[0] += 0.02  # older than that: read again
    third = await reader.read(tp, second.next_offset, max_records=10)
    assert asked["control " + tp.partition_key] == 2 and not third.looked_up_ahead
    # At the tail, always read afresh: a long-poll must see new commits.
    await append_batches(engine.writer, tp, 1, 10)
    tail = await reader.read(tp, 101, max_records=10)
    assert [o for o, _ in tail.records] == list(range(101, 111))


async def test_a_partition_an_answer_has_no_room_for_keeps_its_lookup(
        engine: Engine, topic: str) -> None:
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await append_batches(engine.writer, first, 10, 10)
    await append_batches(engine.writer, second, 2, 10)
    now = [1000.0]
    reader = LogReader(engine.oxia, engine.s3, engine.layout, read_ahead=8,
                       clock=lambda: now[0])
    asked: Counter[str] = Counter()
    _count_calls(engine, asked)
    looked_up: list[int] = []  # the second partition's control reads after each answer
    async with anyio.create_task_group() as tg:
        reader.run_ahead_in(tg)
        offset, answers = 1, 0
        while True:
            # Each answer has room for the first partition's next entry alone.
            out = await reader.read_many([ReadRequest(first, offset),
                                          ReadRequest(second, 1)], max_bytes=50)
            head, tail = out
            assert isinstance(head, ReadResult) and isinstance(tail, ReadResult)
            if not head.records:
                break
            answers += 1
            assert not tail.records and tail.next_offset == 1
            looked_up.append(asked["control " + second.partition_key])
            offset = head.next_offset
            if answers == 3:  # the fourth answer comes over a second after the lookup
                now[0] += MAX_AGE_S + 0.25
        tg.cancel_scope.cancel()
    assert answers >= 5
    # The second partition was looked up by the first answer; the next two took that
    # lookup instead of reading Oxia again. The fourth, over a second after it, looked
    # up afresh, and the later ones took that one.
    assert looked_up == [1, 1, 1] + [2] * (answers - 3), asked
    # Every answer kept the second partition's lookup for the next.
    assert reader.plans.statistics().reused == answers
