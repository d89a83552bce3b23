"""The compactor's parts, each alone over a fake Oxia (pure logic): which entries make a
run (app/compaction/selection.py), the cursor that only moves forward
(app/compaction/progress.py) and the steps after a run's intent is recorded
(app/compaction/run_steps.py). The protocol over the real Oxia and MinIO, crashes at
every step included, is tests/test_compaction.py and tests/test_compaction_crash.py."""

from __future__ import annotations

from collections.abc import Callable

from app.compaction.progress import CompactionProgress
from app.compaction.run_steps import STEPS, RunSteps
from app.compaction.selection import select_run
from app.errors import VersionMismatch
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Compaction, CompactionCursor, IndexEntry
from app.storage.spans import Span
from app.stores.oxia.store import EXPECT_NOT_EXISTS, Record

TP = TopicPartition("t", 0)
LAYOUT = KeyLayout("llog", "bucket")


class FakeOxia:
    """Versioned keys with conditional puts and deletes; ``before_put`` runs before
    each put (another compactor's write, say)."""

    def __init__(self) -> None:
        self.kv: dict[str, tuple[bytes, int]] = {}
        self.versions = 0
        self.before_put: Callable[[str], None] | None = None

    def _check(self, key: str, expected: int | None) -> None:
        held = self.kv.get(key)
        if expected == EXPECT_NOT_EXISTS:
            if held is not None:
                raise VersionMismatch(key)
        elif expected is not None and (held is None or held[1] != expected):
            raise VersionMismatch(key)

    async def get(self, key: str, partition_key: str) -> Record | None:
        held = self.kv.get(key)
        return None if held is None else Record(key, held[0], held[1])

    async def put(self, key: str, value: bytes, partition_key: str, *,
                  expected_version: int | None = None) -> int:
        if self.before_put is not None:
            self.before_put(key)
        self._check(key, expected_version)
        self.versions += 1
        self.kv[key] = (value, self.versions)
        return self.versions

    async def delete(self, key: str, partition_key: str, *,
                     expected_version: int | None = None) -> bool:
        self._check(key, expected_version)
        return self.kv.pop(key, None) is not None

    async def delete_range(self, lo: str, hi: str, partition_key: str) -> None:
        for key in [k for k in self.kv if lo <= k < hi]:
            del self.kv[key]

    def cursor(self) -> int:
        return CompactionCursor.from_json(self.kv[LAYOUT.compaction_cursor(TP)][0]).offset


def _wal(end: int, count: int, *, created: int = 0, size: int = 100) -> Span:
    return Span(end, IndexEntry("WAL", count, "s3://bucket/w", byte_offset=0,
                                byte_length=size, created_at_ms=created))


def test_a_run_is_contiguous_old_enough_and_within_its_budgets() -> None:
    spans = [_wal(2, 2), _wal(4, 2), _wal(7, 2), _wal(9, 2)]  # 5 is missing
    run, reason = select_run(spans, newest_allowed_ms=10, min_entries=2, max_entries=10,
                             max_bytes=1000)
    assert [s.end for s in run] == [2, 4] and reason is None
    run, _ = select_run(spans[:2], newest_allowed_ms=10, min_entries=1, max_entries=1,
                        max_bytes=1000)
    assert [s.end for s in run] == [2]
    young = [_wal(2, 2), _wal(4, 2, created=11)]
    assert select_run(young, newest_allowed_ms=10, min_entries=2, max_entries=10,
                      max_bytes=1000) == ([], "entries_too_young")
    assert select_run(spans[:1], newest_allowed_ms=10, min_entries=2, max_entries=10,
                      max_bytes=1000) == ([], "too_few_entries")


def test_the_byte_budget_gives_way_below_the_minimum_entries() -> None:
    big = [_wal(2, 2, size=5000), _wal(4, 2, size=5000), _wal(6, 2)]
    run, reason = select_run(big, newest_allowed_ms=10, min_entries=2, max_entries=10,
                             max_bytes=1000)
    assert [s.end for s in run] == [2, 4] and reason is None


async def test_the_cursor_moves_forward_only_and_retries_a_conflict() -> None:
    oxia = FakeOxia()
    progress = CompactionProgress(oxia, LAYOUT)  # type: ignore[arg-type]
    assert (await progress.cursor(TP)).offset == 1
    raced = []

    def another_compactor(key: str) -> None:  # moves the cursor to 5 under the first put
        if not raced:
            raced.append(key)
            oxia.versions += 1
            oxia.kv[key] = (CompactionCursor(offset=5).to_json(), oxia.versions)

    oxia.before_put = another_compactor
    await progress.advance_cursor(TP, 9)
    assert raced and oxia.cursor() == 9
    await progress.advance_cursor(TP, 3)  # never back
    assert oxia.cursor() == 9


def _record(state: str, start: int = 1, end: int = 4) -> Compaction:
    return Compaction(compaction_id="c1", state=state,  # type: ignore[arg-type]
                      start_offset=start, end_offset=end, msg_count=end - start + 1,
                      data_key="s3://bucket/compacted/1", tail_entry_start_offset=3,
                      extra={"entries": 2, "bytes": 10})


async def _steps(oxia: FakeOxia, record: Compaction) -> tuple[RunSteps, list[str], int]:
    steps: list[str] = []
    progress = CompactionProgress(oxia, LAYOUT)  # type: ignore[arg-type]
    version = await oxia.put(LAYOUT.compaction(TP), record.to_json(), TP.partition_key)
    return RunSteps(oxia, LAYOUT, progress, metrics=None,  # type: ignore[arg-type]
                    step_hook=steps.append), steps, version


async def test_a_run_is_driven_from_the_state_it_recorded_to_its_end() -> None:
    oxia = FakeOxia()
    for end in (2, 4, 6):
        await oxia.put(LAYOUT.index(TP, end), _wal(end, 2).entry.to_json(), "")
    record = _record("DELETING_OLD")
    steps, called, version = await _steps(oxia, record)
    outcome = await steps.drive(TP, record, version, resumed_from="DELETING_OLD")
    assert (outcome.action, outcome.cursor, outcome.records) == ("resumed", 5, 4)
    assert called == list(STEPS[4:])  # the steps after the recorded state, in order
    assert LAYOUT.index(TP, 2) not in oxia.kv and LAYOUT.index(TP, 6) in oxia.kv
    assert LAYOUT.compaction(TP) not in oxia.kv and oxia.cursor() == 5


async def test_a_record_that_never_started_at_the_cursor_is_dropped_as_stale() -> None:
    oxia = FakeOxia()
    await oxia.put(LAYOUT.compaction_cursor(TP), CompactionCursor(offset=3).to_json(), "")
    await oxia.put(LAYOUT.index(TP, 4), _wal(4, 2).entry.to_json(), "")
    record = _record("WRITING_COMPACTED_INDEX")
    steps, called, version = await _steps(oxia, record)
    outcome = await steps.drive(TP, record, version, resumed_from=None)
    assert (outcome.action, outcome.records, outcome.cursor) == ("raced", 0, 3)
    assert called == [] and LAYOUT.compaction(TP) not in oxia.kv
    assert IndexEntry.from_json(oxia.kv[LAYOUT.index(TP, 4)][0]).type == "WAL"
