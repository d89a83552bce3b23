"""Consumers and producers while compaction runs over and over on the same partition.

Producers must keep getting contiguous offsets; every read, at whatever moment of
whatever compaction step, must return the same bytes at the same offsets.
"""

from __future__ import annotations

import itertools
import random

import anyio

from app.compaction.compactor import CompactionOutcome
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from tests.helpers.compaction import (
    Expected,
    assert_compacted,
    compaction_settings,
    index_entries,
    make_compactor,
    read_all,
)
from tests.helpers.stack import Engine, open_engine

PRODUCERS, BATCHES, PER_BATCH = 2, 25, 3


async def test_reads_and_appends_stay_correct_during_repeated_compaction(
    stack: LocalStack, tp: TopicPartition
) -> None:
    settings = compaction_settings(stack)
    acked: dict[int, bytes] = {}
    seen: dict[int, bytes] = {}
    outcomes: list[CompactionOutcome] = []
    reads = 0
    producers_done = anyio.Event()
    compaction_done = anyio.Event()

    # Producers and the compactor each get their own clients, as separate brokers would.
    async with (
        open_engine(settings) as p0, open_engine(settings) as p1,
        open_engine(settings) as c, open_engine(settings) as r,
    ):
        async def produce(e: Engine, tag: str) -> None:
            for b in range(BATCHES):
                records = [f"{tag}-{b}-{i}".encode() for i in range(PER_BATCH)]
                (result,) = await e.writer.append_shared([AppendGroup(tp, records)])
                assert isinstance(result, AppendResult), result
                for offset, value in zip(range(result.start_offset, result.end_offset + 1),
                                         records, strict=True):
                    assert offset not in acked
                    acked[offset] = value

        async def producers() -> None:
            async with anyio.create_task_group() as tg:
                for i, e in enumerate((p0, p1)):
                    tg.start_soon(produce, e, f"p{i}")
            producers_done.set()

        async def compact() -> None:
            compactor = make_compactor(c, max_entries=4)
            while True:
                outcome = await compactor.compact_once(tp)
                outcomes.append(outcome)
                if producers_done.is_set() and not outcome.did_work:
                    break
            compaction_done.set()

        def check(records: dict[int, bytes], offset: int) -> None:
            assert sorted(records) == list(range(offset, offset + len(records)))
            for o, value in records.items():
                assert seen.setdefault(o, value) == value, f"offset {o} changed"
                if o in acked:
                    assert acked[o] == value, f"offset {o} is not what was acknowledged"

        async def consume() -> None:
            nonlocal reads
            rng = random.Random(7)
            while not compaction_done.is_set():
                hw = await r.reader.high_watermark(tp)
                offset = 1 if reads % 2 == 0 else rng.randint(1, max(1, hw))
                if hw:
                    check(await read_all(r, tp, offset), offset)
                reads += 1

        with anyio.fail_after(240):
            async with anyio.create_task_group() as tg:
                tg.start_soon(producers)
                tg.start_soon(compact)
                tg.start_soon(consume)

        total = PRODUCERS * BATCHES * PER_BATCH
        assert sorted(acked) == list(range(1, total + 1))  # contiguous, no duplicates
        final = await read_all(r, tp)
        assert final == acked
        check(final, 1)
        compacted = [o for o in outcomes if o.action == "compacted"]
        assert len(compacted) >= 2 and reads >= 2
        ranges = [(o.start_offset or 0, o.end_offset or 0) for o in compacted]
        assert ranges[0][0] == 1
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))  # back to back
        # Whatever the last run left uncompacted is fewer than min_entries entries.
        tail = [x for x in await index_entries(c, tp) if x[1].type == "WAL"]
        assert len(tail) < 2
        await assert_compacted(c, tp, Expected(ranges, wal_after=len(tail)))
