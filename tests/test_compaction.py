"""compact_once against real Oxia and MinIO: selection, the end state, and reads.

A compaction must leave one COMPACTED entry at the run's end, delete the other keys of
the run, move the cursor past it, and change nothing a reader sees.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from app.compaction.compactor import STEPS
from app.compaction.metrics import CompactionMetrics
from app.errors import CorruptData
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import Compaction, CompactionCursor
from app.stores.oxia.store import EXPECT_NOT_EXISTS
from tests.helpers.compaction import (
    Expected,
    append_batches,
    assert_compacted,
    compaction_record,
    compaction_settings,
    cursor_of,
    index_entries,
    make_compactor,
    read_all,
)
from tests.helpers.stack import Engine, open_engine


@pytest_asyncio.fixture
async def ce(stack: LocalStack) -> AsyncIterator[Engine]:
    async with open_engine(compaction_settings(stack)) as e:
        yield e


async def test_compacts_a_multi_append_partition(ce: Engine, tp: TopicPartition) -> None:
    acked = await append_batches(ce.writer, tp, batches=6, per_batch=3)
    before = await read_all(ce, tp)
    assert before == acked
    registry = CollectorRegistry()
    metrics = CompactionMetrics(registry)

    outcome = await make_compactor(ce, metrics=metrics).compact_once(tp)

    # The last append was still pending: materialised first, then compacted with the rest.
    assert outcome.action == "compacted" and outcome.materialised_pending
    assert (outcome.start_offset, outcome.end_offset) == (1, 18)
    assert (outcome.records, outcome.entries, outcome.cursor) == (18, 6, 19)
    # bytes-batch-v3-chunked, one chunk: the count, then a v3 body (its head, a length
    # and an append time per record, the values).
    assert outcome.bytes == 4 + 5 + 12 * len(acked) + sum(len(v) for v in acked.values())
    await assert_compacted(ce, tp, Expected([(1, 18)]))
    assert await read_all(ce, tp) == before
    for offset in (1, 7, 18):  # reads from inside the compacted range
        assert await read_all(ce, tp, offset) == {o: v for o, v in before.items() if o >= offset}
    assert registry.get_sample_value("llog_compaction_runs_total", {"action": "compacted"}) == 1
    assert registry.get_sample_value("llog_compaction_records_total") == 18
    assert registry.get_sample_value("llog_compaction_entries_replaced_total") == 6

    again = await make_compactor(ce).compact_once(tp)
    assert (again.action, again.reason) == ("nothing_to_do", "no_entries")


async def test_later_appends_get_their_own_compacted_range(ce: Engine, tp: TopicPartition
                                                           ) -> None:
    acked = await append_batches(ce.writer, tp, batches=3, per_batch=2, tag="a")
    compactor = make_compactor(ce)
    assert (await compactor.compact_once(tp)).end_offset == 6
    acked |= await append_batches(ce.writer, tp, batches=4, per_batch=2, tag="b")
    outcome = await compactor.compact_once(tp)
    assert (outcome.action, outcome.start_offset, outcome.end_offset) == ("compacted", 7, 14)
    await assert_compacted(ce, tp, Expected([(1, 6), (7, 14)]))
    assert await read_all(ce, tp) == acked


async def test_entry_budget_splits_the_backlog(ce: Engine, tp: TopicPartition) -> None:
    acked = await append_batches(ce.writer, tp, batches=7, per_batch=2)
    compactor = make_compactor(ce, max_entries=3)
    ranges = []
    while (outcome := await compactor.compact_once(tp)).action == "compacted":
        ranges.append((outcome.start_offset, outcome.end_offset))
    assert ranges == [(1, 6), (7, 12)]
    assert (outcome.action, outcome.reason) == ("nothing_to_do", "too_few_entries")
    await assert_compacted(ce, tp, Expected([(1, 6), (7, 12)], wal_after=1))
    assert await read_all(ce, tp) == acked


async def test_byte_budget_is_soft_below_min_entries(ce: Engine, tp: TopicPartition) -> None:
    acked = await append_batches(ce.writer, tp, batches=3, per_batch=1)
    # Every slice alone is over budget, yet two entries are taken, or the cursor would
    # never move past them.
    outcome = await make_compactor(ce, max_bytes=1).compact_once(tp)
    assert (outcome.start_offset, outcome.end_offset) == (1, 2)
    await assert_compacted(ce, tp, Expected([(1, 2)], wal_after=1))
    assert await read_all(ce, tp) == acked


async def test_young_entries_and_short_runs_are_left_alone(ce: Engine, tp: TopicPartition
                                                           ) -> None:
    await append_batches(ce.writer, tp, batches=3, per_batch=2)
    young = await make_compactor(ce, min_entry_age_ms=3_600_000).compact_once(tp)
    assert (young.action, young.reason) == ("nothing_to_do", "entries_too_young")
    assert not young.materialised_pending  # a young pending append is the writers' job
    short = await make_compactor(ce, min_entries=4).compact_once(tp)
    assert (short.action, short.reason) == ("nothing_to_do", "too_few_entries")
    assert [x.type for _, x in await index_entries(ce, tp)] == ["WAL"] * 3
    assert await cursor_of(ce, tp) == 1


async def test_empty_and_unknown_partitions_have_nothing_to_do(ce: Engine, topic: str) -> None:
    outcome = await make_compactor(ce).compact_once(TopicPartition(topic, 7))
    assert (outcome.action, outcome.reason) == ("nothing_to_do", "no_entries")


async def test_compacted_entry_at_the_cursor_only_moves_the_cursor(
    ce: Engine, tp: TopicPartition
) -> None:
    acked = await append_batches(ce.writer, tp, batches=3, per_batch=2)
    await make_compactor(ce).compact_once(tp)
    # As if the cursor update of that compaction had been lost.
    record = await ce.oxia.get(ce.layout.compaction_cursor(tp), tp.partition_key)
    assert record is not None
    await ce.oxia.put(ce.layout.compaction_cursor(tp), CompactionCursor(offset=1).to_json(),
                      tp.partition_key, expected_version=record.version_id)
    outcome = await make_compactor(ce).compact_once(tp)
    assert (outcome.action, outcome.start_offset, outcome.end_offset) == (
        "advanced_cursor", 1, 6)
    await assert_compacted(ce, tp, Expected([(1, 6)]))
    assert await read_all(ce, tp) == acked


async def test_stale_in_flight_record_is_dropped_without_touching_the_index(
    ce: Engine, tp: TopicPartition
) -> None:
    acked = await append_batches(ce.writer, tp, batches=4, per_batch=2)
    await make_compactor(ce).compact_once(tp)
    # A run selected before the compaction above, recorded after it finished: its start
    # is no longer the cursor, so it must never swap or delete a key.
    stale = Compaction(compaction_id="stale", state="WRITING_COMPACTED_INDEX", start_offset=1,
                       end_offset=4, msg_count=4, data_key=ce.layout.uri("nowhere"),
                       tail_entry_start_offset=3)
    await ce.oxia.put(ce.layout.compaction(tp), stale.to_json(), tp.partition_key,
                      expected_version=EXPECT_NOT_EXISTS)
    outcome = await make_compactor(ce).compact_once(tp)
    assert (outcome.action, outcome.resumed_from) == ("abandoned", "WRITING_COMPACTED_INDEX")
    await assert_compacted(ce, tp, Expected([(1, 8)]))
    assert await read_all(ce, tp) == acked


async def test_corrupt_slice_fails_before_anything_changes(ce: Engine, tp: TopicPartition
                                                           ) -> None:
    await append_batches(ce.writer, tp, batches=3, per_batch=2)
    assert await ce.writer.materialise_pending(tp)
    (end, entry), *_ = await index_entries(ce, tp)
    entry.crc32c = (entry.crc32c or 0) ^ 1
    await ce.oxia.put(ce.layout.index(tp, end), entry.to_json(), tp.partition_key)
    registry = CollectorRegistry()
    with pytest.raises(CorruptData, match="crc32c"):
        await make_compactor(ce, metrics=CompactionMetrics(registry)).compact_once(tp)
    assert registry.get_sample_value("llog_compaction_failures_total",
                                     {"error_type": "CorruptData"}) == 1
    assert await compaction_record(ce, tp) is None
    assert [x.type for _, x in await index_entries(ce, tp)] == ["WAL"] * 3
    assert await cursor_of(ce, tp) == 1


async def test_fenced_partition_is_still_compacted(ce: Engine, tp: TopicPartition) -> None:
    acked = await append_batches(ce.writer, tp, batches=3, per_batch=2)
    await ce.writer.fence(tp)
    outcome = await make_compactor(ce).compact_once(tp)
    assert (outcome.action, outcome.end_offset) == ("compacted", 6)
    control = await ce.reader.read_control(tp)
    assert control is not None and control.fenced and control.pending is None
    assert await read_all(ce, tp) == acked


async def test_reads_are_identical_at_every_step(ce: Engine, tp: TopicPartition) -> None:
    acked = await append_batches(ce.writer, tp, batches=5, per_batch=3)
    seen: list[str] = []

    async def check(step: str) -> None:
        seen.append(step)
        assert await read_all(ce, tp) == acked, step
        assert await read_all(ce, tp, 8) == {o: v for o, v in acked.items() if o >= 8}, step

    outcome = await make_compactor(ce, crash_hook=check).compact_once(tp)
    assert outcome.action == "compacted"
    assert seen == list(STEPS)
