"""The writer under the races that matter for safety, against the real Oxia and MinIO:
an unanswered commit meeting compaction, a long-idle cache meeting compaction, an upload
that grew too old, and which control versions are this process's own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.errors import (
    CommitConflict,
    CommitExpired,
    CommitInDoubt,
    StorageUnavailable,
)
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.stores.oxia.store import EXPECT_NOT_EXISTS, PutSpec
from tests.helpers.clock import FakeClock
from tests.helpers.compaction import compaction_settings, index_entries, make_compactor, read_all
from tests.helpers.stack import Engine, open_engine


def _answer_lost_once(e: Engine, meanwhile: Callable[[], Awaitable[None]]) -> None:
    """The writer's next commit CAS is applied by Oxia, but its answer is lost: the
    writer sees StorageUnavailable after ``meanwhile`` has run."""
    real = e.oxia.put_group
    armed = {"on": True}

    async def put_group(puts: list[PutSpec]) -> list[int | Exception]:
        outcomes = await real(puts)
        cas = puts[-1]
        if armed["on"] and cas.key.endswith("/meta/control") and cas.expected_version not in (
                None, EXPECT_NOT_EXISTS):
            armed["on"] = False
            await meanwhile()
            return [StorageUnavailable("the answer was lost")] * len(outcomes)
        return outcomes

    e.oxia.put_group = put_group  # type: ignore[method-assign]


async def _values(e: Engine, tp: TopicPartition) -> list[bytes]:
    return list((await read_all(e, tp)).values())


async def test_an_unanswered_commit_settled_through_the_index(stack: LocalStack,
                                                              tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        async def meanwhile() -> None:  # the next writer materialises a's append
            await b.writer.append_shared([AppendGroup(tp, [b"b"])])

        _answer_lost_once(a, meanwhile)
        (result,) = await a.writer.append_shared([AppendGroup(tp, [b"a"])])
        assert isinstance(result, AppendResult) and result.start_offset == 1
        assert await _values(a, tp) == [b"a", b"b"]  # committed once, not appended again


async def test_an_unanswered_commit_whose_range_was_compacted_is_in_doubt(
        stack: LocalStack, tp: TopicPartition) -> None:
    """Compaction removed the index entry that would show the append_id: the writer
    must say "in doubt", never append a second copy."""
    settings = compaction_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        async def meanwhile() -> None:
            await b.writer.append_shared([AppendGroup(tp, [b"b"])])
            outcome = await make_compactor(b).compact_once(tp)
            assert outcome.action == "compacted" and outcome.end_offset == 2

        _answer_lost_once(a, meanwhile)
        (result,) = await a.writer.append_shared([AppendGroup(tp, [b"a"])])
        assert isinstance(result, CommitInDoubt) and result.maybe_written
        assert await _values(b, tp) == [b"a", b"b"]


async def test_an_unanswered_keyed_commit_is_settled_by_its_key(stack: LocalStack,
                                                                tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        async def meanwhile() -> None:
            await b.writer.append_shared([AppendGroup(tp, [b"b"])])
            await make_compactor(b).compact_once(tp)

        _answer_lost_once(a, meanwhile)
        (result,) = await a.writer.append_shared([AppendGroup(tp, [b"a"], "key-a")])
        assert isinstance(result, AppendResult) and not result.duplicate
        assert result.start_offset == 1
        assert await _values(b, tp) == [b"a", b"b"]


async def test_an_idle_writer_never_recreates_a_compacted_index_key(
        stack: LocalStack, tp: TopicPartition) -> None:
    """A cached pending append old enough to have been compacted is read again, so the
    writer's next commit cannot re-create its deleted index key (a stray)."""
    settings = compaction_settings(stack)
    clock = FakeClock()
    async with (open_engine(settings, clock=clock, pending_reread_ms=15_000) as a,
                open_engine(settings) as b):
        (first,) = await a.writer.append_shared([AppendGroup(tp, [b"a1"])])
        assert isinstance(first, AppendResult) and first.start_offset == 1  # a caches it
        for value in (b"b2", b"b3"):
            await b.writer.append_shared([AppendGroup(tp, [value])])
        outcome = await make_compactor(b).compact_once(tp)
        assert (outcome.start_offset, outcome.end_offset) == (1, 3)
        clock.advance(20_000)
        (last,) = await a.writer.append_shared([AppendGroup(tp, [b"a4"])])
        assert isinstance(last, AppendResult) and last.start_offset == 4
        entries = await index_entries(b, tp)
        assert [(end, e.type) for end, e in entries] == [(3, "COMPACTED")]
        assert await _values(b, tp) == [b"a1", b"b2", b"b3", b"a4"]


async def test_an_upload_older_than_the_commit_horizon_is_not_committed(
        stack: LocalStack, tp: TopicPartition) -> None:
    clock = FakeClock()

    def pause(step: str) -> None:  # the process stalls between its PUT and its CAS
        if step == "after_blob_put":
            clock.advance(1_001)

    settings = compaction_settings(stack)
    async with open_engine(settings, clock=clock, crash_hook=pause,
                           commit_horizon_ms=1_000) as e:
        (result,) = await e.writer.append_shared([AppendGroup(tp, [b"late"])])
        assert isinstance(result, CommitExpired) and result.retriable
        control = await e.reader.read_control(tp)
        assert control is not None and control.sequence_counter == 0


async def test_only_versions_this_process_wrote_are_its_own(stack: LocalStack,
                                                            tp: TopicPartition) -> None:
    """A version read after a conflict belongs to another process: its change
    notification must reach this process's consumers."""
    settings = compaction_settings(stack)
    async with open_engine(settings, max_attempts=1) as a, open_engine(settings) as b:
        await a.writer.append_shared([AppendGroup(tp, [b"a1"])])
        mine = await a.oxia.get(a.layout.control(tp), tp.partition_key)
        assert mine is not None and a.writer.owns_version(tp, mine.version_id)
        await b.writer.append_shared([AppendGroup(tp, [b"b2"])])
        theirs = await a.oxia.get(a.layout.control(tp), tp.partition_key)
        assert theirs is not None
        (refused,) = await a.writer.append_shared([AppendGroup(tp, [b"a3"])])
        assert isinstance(refused, CommitConflict)  # a met b's version and gave up
        assert not a.writer.owns_version(tp, theirs.version_id)
        assert b.writer.owns_version(tp, theirs.version_id)


async def test_a_compacted_blob_older_than_the_horizon_is_never_referenced(
        stack: LocalStack, tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        for value in (b"1", b"2", b"3"):
            await e.writer.append_shared([AppendGroup(tp, [value])])
        clock = FakeClock()  # from now: every entry is old enough to compact

        def pause(step: str) -> None:  # the compactor stalls between its PUT and intent
            if step == "after_compacted_put":
                clock.advance(1_001)

        compactor = make_compactor(e, commit_horizon_ms=1_000, crash_hook=pause)
        compactor._clock = clock
        outcome = await compactor.compact_once(tp)
        assert (outcome.action, outcome.reason) == ("abandoned", "upload_expired")
        assert await e.oxia.get(e.layout.compaction(tp), tp.partition_key) is None
        assert all(x.type == "WAL" for _, x in await index_entries(e, tp))
        assert await _values(e, tp) == [b"1", b"2", b"3"]
