"""Compactors killed (SIGKILL) between protocol steps, racing, and losing their claims.

After a crash at any step, another compactor (another process's view: fresh clients)
must finish the job with the same end state as an uninterrupted run, and readers must see
the same records at the same offsets throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from app.compaction.compactor import STEPS, CompactionOutcome, Compactor
from app.compaction.scheduler import CompactionScheduler, Visit
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.keys import TopicPartition
from app.storage.metadata import CompactorClaim
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
    set_topic_compression,
)
from tests.helpers.stack import Engine, open_engine

pytestmark = pytest.mark.slow  # chaos: compactors killed between steps

WORKER = Path(__file__).parent / "helpers" / "compact_worker.py"
BATCHES, PER_BATCH = 6, 3
END = BATCHES * PER_BATCH


def _run_worker(settings: Settings, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    # The worker imports this tree's app, wherever the interpreter is installed from.
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **settings.as_env(), "PYTHONPATH": path}
    return subprocess.run([sys.executable, str(WORKER), "--topic", topic, *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def _lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture
def csettings(stack: LocalStack) -> Settings:
    return compaction_settings(stack)


async def _filled(settings: Settings, tp: TopicPartition, compression: str | None = None
                  ) -> dict[int, bytes]:
    """The partition's batches appended; with ``compression``, the topic asks for it
    and the records compress, so the compacted object is stored with that codec."""
    async with open_engine(settings) as e:
        if compression is None:
            return await append_batches(e.writer, tp, BATCHES, PER_BATCH)
        await set_topic_compression(e, tp.topic, compression)
        return await append_batches(e.writer, tp, BATCHES, PER_BATCH, tag="event " * 8)


# What a crash at each step leaves behind: (state of meta/compaction, end key type,
# old keys still there, cursor).
AFTER_CRASH = {
    "after_compacted_put": (None, "WAL", True, 1),
    "after_compaction_record": ("WRITING_COMPACTED_INDEX", "WAL", True, 1),
    "after_index_overwrite": ("WRITING_COMPACTED_INDEX", "COMPACTED", True, 1),
    "after_state_deleting_old": ("DELETING_OLD", "COMPACTED", True, 1),
    "after_delete_range": ("DELETING_OLD", "COMPACTED", False, 1),
    "after_state_updating_cursor": ("UPDATING_CURSOR", "COMPACTED", False, 1),
    "after_cursor_put": ("UPDATING_CURSOR", "COMPACTED", False, END + 1),
}
assert set(AFTER_CRASH) == set(STEPS)


@pytest.mark.parametrize("step", STEPS)
async def test_compactor_killed_at_each_step_is_finished_by_another(
    csettings: Settings, topic: str, step: str
) -> None:
    tp = TopicPartition(topic, 0)
    acked = await _filled(csettings, tp, "zstd")
    proc = _run_worker(csettings, topic, "--crash-at", step)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert _lines(proc) == [{"crashed_at": step}]

    state, end_type, old_keys, cursor = AFTER_CRASH[step]
    async with open_engine(csettings) as e:
        record = await compaction_record(e, tp)
        assert (record.state if record else None) == state
        # The recorded intent names the codec its blob was written with: a resumer
        # puts that in the COMPACTED entry, not whatever the topic says by then.
        assert record is None or (record.codec, record.raw_length is not None) == (
            "zstd", True)
        entries = await index_entries(e, tp)
        assert entries[-1][0] == END and entries[-1][1].type == end_type
        assert (len(entries) == BATCHES) == old_keys
        assert await cursor_of(e, tp) == cursor
        # Readers are correct in every interrupted state.
        assert await read_all(e, tp) == acked
        assert await read_all(e, tp, 5) == {o: v for o, v in acked.items() if o >= 5}

        if state is not None:  # the resumer must follow the record, not the topic
            await set_topic_compression(e, topic, None)
        outcome = await make_compactor(e).compact_once(tp)
        if state is None:  # nothing recorded: the run is simply done again (orphan blob)
            assert outcome.action == "compacted"
        else:
            assert (outcome.action, outcome.resumed_from) == ("resumed", state)
        assert (outcome.start_offset, outcome.end_offset) == (1, END)
        await assert_compacted(e, tp, Expected([(1, END)], codec="zstd"))
        assert await read_all(e, tp) == acked
        assert (await make_compactor(e).compact_once(tp)).action == "nothing_to_do"


def _pause_at(step: str, reached: anyio.Event, resume: anyio.Event) -> Any:
    """A step hook that parks the compactor at ``step`` until ``resume`` is set."""
    async def wait() -> None:
        reached.set()
        await resume.wait()

    def hook(name: str) -> Any:
        return wait() if name == step else None

    return hook


@pytest.fixture
async def two(csettings: Settings) -> AsyncIterator[tuple[Engine, Engine]]:
    """Two engines with their own Oxia sessions, as two compactor processes have."""
    async with open_engine(csettings) as a, open_engine(csettings) as b:
        yield a, b


def _scheduler(e: Engine, compactor: Compactor, name: str) -> CompactionScheduler:
    return CompactionScheduler(compactor, e.oxia, e.layout, e.settings, compactor_id=name)


async def test_claim_makes_the_second_compactor_move_on(
    two: tuple[Engine, Engine], tp: TopicPartition
) -> None:
    a, b = two
    acked = await append_batches(a.writer, tp, BATCHES, PER_BATCH)
    reached, resume = anyio.Event(), anyio.Event()
    sched_a = _scheduler(a, make_compactor(a, crash_hook=_pause_at(
        "after_compaction_record", reached, resume)), "A")
    sched_b = _scheduler(b, make_compactor(b), "B")
    visits: list[Visit] = []

    async def visit_a() -> None:
        visits.append(await sched_a.visit(tp))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(visit_a)
            await reached.wait()
            claim = await b.oxia.get(b.layout.compactor_claim(tp), tp.partition_key)
            assert claim is not None
            assert CompactorClaim.from_json(claim.value).compactor_id == "A"
            busy = await sched_b.visit(tp)
            assert busy.busy and busy.outcomes == [] and busy.error is None
            resume.set()
    (visit,) = visits
    assert [o.action for o in visit.outcomes] == ["compacted", "nothing_to_do"]
    assert visit.lag is not None and visit.lag.records == 0
    assert await a.oxia.get(a.layout.compactor_claim(tp), tp.partition_key) is None
    await assert_compacted(a, tp, Expected([(1, END)]))
    assert await read_all(b, tp) == acked


async def test_compactors_racing_through_claims(two: tuple[Engine, Engine],
                                                tp: TopicPartition) -> None:
    a, b = two
    acked = await append_batches(a.writer, tp, BATCHES, PER_BATCH)
    scheds = [_scheduler(a, make_compactor(a), "A"), _scheduler(b, make_compactor(b), "B")]
    visits: list[Visit] = []

    async def visit(s: CompactionScheduler) -> None:
        visits.append(await s.visit(tp))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for s in scheds:
                tg.start_soon(visit, s)
    outcomes = [o.action for v in visits for o in v.outcomes]
    assert outcomes.count("compacted") == 1, visits
    assert set(outcomes) <= {"compacted", "nothing_to_do"}
    assert all(v.error is None for v in visits)
    await assert_compacted(a, tp, Expected([(1, END)]))
    assert await read_all(b, tp) == acked


async def test_compactors_racing_without_claims_stay_correct(
    two: tuple[Engine, Engine], tp: TopicPartition
) -> None:
    """Claims are only advisory: unclaimed concurrent runs must still end correctly."""
    a, b = two
    acked = await append_batches(a.writer, tp, 4, PER_BATCH)
    results: list[CompactionOutcome] = []
    compactors = [make_compactor(a), make_compactor(b), make_compactor(a)]

    async def run(c: Compactor) -> None:
        results.append(await c.compact_once(tp))

    for round_ in range(3):  # each round appends more, then races three compactors
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for c in compactors:
                    tg.start_soon(run, c)
        while (await compactors[0].compact_once(tp)).did_work:
            pass
        if round_ < 2:
            acked |= await append_batches(a.writer, tp, 3, PER_BATCH, tag=f"r{round_}")
    assert await compaction_record(a, tp) is None
    entries = await index_entries(a, tp)
    assert all(x.type == "COMPACTED" for _, x in entries)
    assert await cursor_of(a, tp) == max(acked) + 1
    assert await read_all(b, tp) == acked
    assert {o.action for o in results} <= {"compacted", "resumed", "raced", "nothing_to_do",
                                           "advanced_cursor", "abandoned"}


async def test_concurrent_resumers_finish_one_run(two: tuple[Engine, Engine],
                                                  tp: TopicPartition) -> None:
    a, b = two
    acked = await append_batches(a.writer, tp, BATCHES, PER_BATCH)
    reached, resume = anyio.Event(), anyio.Event()
    slow = make_compactor(a, crash_hook=_pause_at("after_index_overwrite", reached, resume))
    results: list[CompactionOutcome] = []

    async def run_slow() -> None:
        results.append(await slow.compact_once(tp))

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_slow)
            await reached.wait()
            fast = await make_compactor(b).compact_once(tp)
            assert (fast.action, fast.resumed_from) == ("resumed", "WRITING_COMPACTED_INDEX")
            resume.set()
    (late,) = results
    assert (late.action, late.reason) == ("compacted", "finished by another compactor")
    await assert_compacted(a, tp, Expected([(1, END)]))
    assert await read_all(a, tp) == acked


async def test_killed_compactor_loses_its_claim_when_its_session_expires(
    csettings: Settings, topic: str
) -> None:
    tp = TopicPartition(topic, 0)
    acked = await _filled(csettings, tp)
    proc = _run_worker(csettings, topic, "--claim", "--compactor-id", "doomed",
                       "--crash-at", "after_index_overwrite")
    assert proc.returncode == -9
    assert _lines(proc) == [{"claimed": True}, {"crashed_at": "after_index_overwrite"}]
    assert csettings.oxia_session_timeout_ms == 3000

    async with open_engine(csettings) as e:
        claim_key = e.layout.compactor_claim(tp)
        scheduler = _scheduler(e, make_compactor(e), "heir")
        # The dead process's session has not expired yet: its claim still holds.
        busy = await scheduler.visit(tp)
        assert busy.busy, "the claim vanished before the session timeout"
        # No event announces a session expiry: poll Oxia, with a deadline.
        with anyio.fail_after(30):
            while True:
                if await e.oxia.get(claim_key, tp.partition_key) is None:
                    break
                await anyio.sleep(0.2)
        visit = await scheduler.visit(tp)
        assert not visit.busy and visit.error is None
        assert (visit.outcomes[0].action, visit.outcomes[0].resumed_from) == (
            "resumed", "WRITING_COMPACTED_INDEX")
        await assert_compacted(e, tp, Expected([(1, END)]))
        assert await read_all(e, tp) == acked
        assert await e.oxia.get(claim_key, tp.partition_key) is None  # released after use
