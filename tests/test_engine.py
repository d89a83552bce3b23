"""The log engine against real Oxia and MinIO: commit, read, fencing, key isolation."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from app.errors import (
    CorruptData,
    InvalidRequest,
    LogGap,
    ObjectMissing,
    OffsetOutOfRange,
    PartitionFenced,
)
from app.localstack.stack import LocalStack
from app.storage import codec
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.storage.metadata import Control, IndexEntry, Pending, now_ms
from app.storage.reader import LogReader, ReadRequest
from tests.helpers.clock import FakeClock
from tests.helpers.compaction import compaction_settings, make_compactor
from tests.helpers.stack import Engine, make_settings, open_engine


def _ok(result: object) -> AppendResult:
    assert isinstance(result, AppendResult), result
    return result


async def _append(engine: Engine, tp: TopicPartition, *values: bytes) -> AppendResult:
    (result,) = await engine.writer.append_shared([AppendGroup(tp, list(values))])
    return _ok(result)


async def test_append_then_read_back(engine: Engine, tp: TopicPartition) -> None:
    first = await _append(engine, tp, b"alpha", b"", b"\x00\x01")
    second = await _append(engine, tp, b"delta")
    assert (first.start_offset, first.end_offset, first.count) == (1, 3, 3)
    assert (second.start_offset, second.end_offset) == (4, 4)
    assert first.index_key == f"llog/{tp.topic}/partitions/0/index/00000000000000000003"
    assert first.wal_uri.startswith(f"s3://{engine.settings.s3_bucket}/llog/wal-shared/")

    result = await engine.reader.read(tp, 0)
    assert result.records == [(1, b"alpha"), (2, b""), (3, b"\x00\x01"), (4, b"delta")]
    assert result.high_watermark == 4
    assert result.next_offset == 5

    middle = await engine.reader.read(tp, 2, max_records=2)
    assert middle.records == [(2, b""), (3, b"\x00\x01")]
    assert middle.next_offset == 4


async def test_one_shared_blob_for_many_partitions(engine: Engine, topic: str) -> None:
    tps = [TopicPartition(topic, p) for p in range(3)] + [TopicPartition(topic + "-x", 0)]
    puts_before = engine.metrics.s3_requests.labels("put", "ok")._value.get()
    results = await engine.writer.append_shared(
        [AppendGroup(tp, [f"{tp}-{i}".encode() for i in range(i + 1)])
         for i, tp in enumerate(tps)]
    )
    assert engine.metrics.s3_requests.labels("put", "ok")._value.get() == puts_before + 1
    oks = [_ok(r) for r in results]
    assert len({r.wal_uri for r in oks}) == 1
    for i, (tp, r) in enumerate(zip(tps, oks, strict=True)):
        assert (r.start_offset, r.end_offset) == (1, i + 1)
        read = await engine.reader.read(tp, 1)
        assert [v for _, v in read.records] == [f"{tp}-{j}".encode() for j in range(i + 1)]

    # Several partitions of one blob in one read_many: fetched once, each gets its slice
    # (by a reader that has not kept the blob from the reads above).
    gets_before = engine.metrics.s3_requests.labels("range_get", "ok")._value.get()
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    many = await reader.read_many([ReadRequest(tp, 1) for tp in tps])
    assert engine.metrics.s3_requests.labels("range_get", "ok")._value.get() == gets_before + 1
    for i, r in enumerate(many):
        assert not isinstance(r, Exception)
        assert len(r.records) == i + 1


async def test_byte_budget_always_returns_the_first_record(
    engine: Engine, tp: TopicPartition
) -> None:
    await _append(engine, tp, b"x" * 100, b"y" * 10, b"z" * 10)
    first_only = await engine.reader.read(tp, 1, max_bytes=5)
    assert first_only.records == [(1, b"x" * 100)]
    two = await engine.reader.read(tp, 2, max_bytes=20)
    assert [o for o, _ in two.records] == [2, 3]
    one = await engine.reader.read(tp, 2, max_bytes=19)
    assert [o for o, _ in one.records] == [2]


async def test_reading_at_and_beyond_the_tail(engine: Engine, tp: TopicPartition) -> None:
    empty = await engine.reader.read(tp, 0)
    assert (empty.records, empty.high_watermark, empty.next_offset) == ([], 0, 1)
    with pytest.raises(OffsetOutOfRange):
        await engine.reader.read(tp, 2)
    await _append(engine, tp, b"a", b"b")
    tail = await engine.reader.read(tp, 3)
    assert (tail.records, tail.high_watermark, tail.next_offset) == ([], 2, 3)
    with pytest.raises(OffsetOutOfRange):
        await engine.reader.read(tp, 4)


async def test_invalid_appends_write_nothing(engine: Engine, tp: TopicPartition) -> None:
    with pytest.raises(InvalidRequest):
        await engine.writer.append_shared([])
    with pytest.raises(InvalidRequest):
        await engine.writer.append_shared([AppendGroup(tp, [])])
    with pytest.raises(InvalidRequest):
        TopicPartition("bad/topic", 0)
    assert await engine.reader.read_control(tp) is None


async def test_fenced_partition_refuses_appends_and_serves_reads(
    engine: Engine, stack: LocalStack, topic: str
) -> None:
    tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await _append(engine, tp, b"before")
    # Fenced by another process: this writer's cached control is stale.
    async with open_engine(make_settings(stack)) as operator:
        await operator.writer.fence(tp)
    results = await engine.writer.append_shared(
        [AppendGroup(tp, [b"refused"]), AppendGroup(other, [b"fine"])]
    )
    assert isinstance(results[0], PartitionFenced)
    assert _ok(results[1]).start_offset == 1  # one partition's failure is its own
    read = await engine.reader.read(tp, 1)
    assert read.records == [(1, b"before")]
    assert read.high_watermark == 1

    await engine.writer.unfence(tp)
    assert (await _append(engine, tp, b"after")).start_offset == 2


async def test_neighbouring_keys_never_answer_an_index_scan(
    engine: Engine, topic: str
) -> None:
    # Same shard (one-shard test stack): "p1" and "p10", and topic "a" next to "a.b".
    p1, p10 = TopicPartition(topic, 1), TopicPartition(topic, 10)
    dotted = TopicPartition(topic + ".b", 1)
    await _append(engine, p1, b"one")
    for _ in range(3):
        await _append(engine, p10, b"ten")
        await _append(engine, dotted, b"dot")
    await engine.writer.materialise_pending(p1)

    assert [span async for span in engine.reader.index.spans_from(p1, 2, 1)] == []
    assert [span.end async for span in engine.reader.index.spans_from(p1, 1, 1)] == [1]
    # Break p1's index under its high watermark: the reader reports a gap instead of
    # returning a neighbour's records.
    await engine.oxia.delete(engine.layout.index(p1, 1), p1.partition_key)
    with pytest.raises(LogGap):
        await engine.reader.read(p1, 1)
    assert [v for _, v in (await engine.reader.read(p10, 1)).records] == [b"ten"] * 3


async def test_pending_entry_is_readable_and_materialised_by_the_next_writer(
    stack: LocalStack, tp: TopicPartition
) -> None:
    async with open_engine(make_settings(stack)) as first:
        await _append(first, tp, b"first")
    async with open_engine(make_settings(stack)) as e:
        # As if the writer died right after its pending CAS: no index entry yet.
        await e.oxia.delete(e.layout.index(tp, 1), tp.partition_key)
        control = await e.reader.read_control(tp)
        assert control is not None and control.pending is not None
        assert (await e.reader.read(tp, 1)).records == [(1, b"first")]

        result = await _append(e, tp, b"second")
        assert result.start_offset == 2
        record = await e.oxia.get(e.layout.index(tp, 1), tp.partition_key)
        assert record is not None
        assert IndexEntry.from_json(record.value).append_id == control.pending.append_id
        assert (await e.reader.read(tp, 1)).records == [(1, b"first"), (2, b"second")]


async def test_materialise_pending_clears_control(engine: Engine, tp: TopicPartition) -> None:
    await _append(engine, tp, b"a", b"b")
    assert await engine.writer.materialise_pending(tp) is True
    control = await engine.reader.read_control(tp)
    assert control is not None and control.pending is None and control.sequence_counter == 2
    assert await engine.writer.materialise_pending(tp) is False
    assert (await engine.reader.read(tp, 1)).records == [(1, b"a"), (2, b"b")]


async def _install(engine: Engine, tp: TopicPartition, seq: int,
                   entries: list[tuple[int, IndexEntry]]) -> None:
    """Write control and index entries by hand (data made by other tools or releases)."""
    await engine.writer.ensure_partition(tp)
    record = await engine.oxia.get(engine.layout.control(tp), tp.partition_key)
    assert record is not None
    await engine.oxia.put(engine.layout.control(tp), Control("OPEN", seq, None).to_json(),
                          tp.partition_key, expected_version=record.version_id)
    for end, entry in entries:
        await engine.oxia.put(engine.layout.index(tp, end), entry.to_json(), tp.partition_key)


async def test_legacy_and_compacted_objects_stay_readable(
    engine: Engine, tp: TopicPartition
) -> None:
    legacy_key = engine.layout.legacy_wal_object(tp, uuid.uuid4().hex)
    compacted_key = engine.layout.compacted_object(tp, uuid.uuid4().hex)
    await engine.s3.put(legacy_key, codec.encode_batch([b"l1", b"l2"]))
    await engine.s3.put(compacted_key, codec.encode_batch([b"c3", b"c4", b"c5"]))
    await _install(engine, tp, 5, [
        (2, IndexEntry("WAL", 2, engine.layout.uri(legacy_key))),
        (5, IndexEntry("COMPACTED", 3, engine.layout.uri(compacted_key))),
    ])
    read = await engine.reader.read(tp, 1)
    assert read.records == [(1, b"l1"), (2, b"l2"), (3, b"c3"), (4, b"c4"), (5, b"c5")]
    assert (await engine.reader.read(tp, 4)).records == [(4, b"c4"), (5, b"c5")]
    # New appends continue after the legacy data.
    assert (await _append(engine, tp, b"n6")).start_offset == 6


async def test_corrupt_and_missing_objects_are_errors(
    engine: Engine, s3_client: Any, topic: str
) -> None:
    bad, gone = TopicPartition(topic, 0), TopicPartition(topic, 1)
    r_bad = await _append(engine, bad, b"payload-one", b"payload-two")
    r_gone = await _append(engine, gone, b"lost")
    bucket = engine.settings.s3_bucket
    _, bad_key = engine.layout.parse_uri(r_bad.wal_uri)
    original = s3_client.get_object(Bucket=bucket, Key=bad_key)["Body"].read()
    tampered = original.replace(b"payload-one", b"payload-0ne")
    assert tampered != original
    s3_client.put_object(Bucket=bucket, Key=bad_key, Body=tampered)
    with pytest.raises(CorruptData):
        await engine.reader.read(bad, 1)

    _, gone_key = engine.layout.parse_uri(r_gone.wal_uri)
    if gone_key != bad_key:
        s3_client.delete_object(Bucket=bucket, Key=gone_key)
    else:
        s3_client.delete_object(Bucket=bucket, Key=bad_key)
    with pytest.raises(ObjectMissing):
        await engine.reader.read(gone, 1)


async def test_concurrent_writers_in_one_process(stack: LocalStack, tp: TopicPartition) -> None:
    writers, batches, per_batch = 4, 12, 3
    acked: list[tuple[int, bytes]] = []

    async def run(w: int) -> None:
        async with open_engine(make_settings(stack)) as e:
            for b in range(batches):
                values = [f"w{w}-b{b}-r{i}".encode() for i in range(per_batch)]
                result = await _append(e, tp, *values)
                acked.extend(zip(range(result.start_offset, result.end_offset + 1), values,
                                 strict=True))

    async with anyio.create_task_group() as tg:
        for w in range(writers):
            tg.start_soon(run, w)

    total = writers * batches * per_batch
    assert sorted(o for o, _ in acked) == list(range(1, total + 1))
    async with open_engine(make_settings(stack)) as e:
        read = await e.reader.read(tp, 1)
    assert read.high_watermark == total
    assert dict(read.records) == dict(acked)


def test_pending_round_trips_through_control_json() -> None:
    pending = Pending("id", 3, 4, 2, "s3://b/k", byte_offset=9, byte_length=12, crc32c=7)
    control = Control("OPEN", 4, pending)
    again = Control.from_json(control.to_json())
    assert again.pending is not None and again.pending.index_entry().crc32c == 7


async def test_a_stray_wal_entry_inside_a_compacted_range_is_skipped(
    engine: Engine, tp: TopicPartition
) -> None:
    compacted_key = engine.layout.compacted_object(tp, uuid.uuid4().hex)
    stray_key = engine.layout.legacy_wal_object(tp, uuid.uuid4().hex)
    values = [f"v{i}".encode() for i in range(1, 7)]
    await engine.s3.put(compacted_key, codec.encode_batch(values))
    await engine.s3.put(stray_key, codec.encode_batch(values[1:3]))
    await _install(engine, tp, 6, [
        (3, IndexEntry("WAL", 2, engine.layout.uri(stray_key))),  # stray, covers 2..3
        (6, IndexEntry("COMPACTED", 6, engine.layout.uri(compacted_key))),
    ])
    for start in (1, 2, 3, 4):
        read = await engine.reader.read(tp, start)
        assert read.records == list(zip(range(start, 7), values[start - 1:], strict=True))


async def test_an_idempotency_key_appends_at_most_once(
    engine: Engine, stack: LocalStack, tp: TopicPartition
) -> None:
    group = AppendGroup(tp, [b"once-a", b"once-b"], idempotency_key="job-1/task-7")
    (first,) = await engine.writer.append_shared([group])
    await _append(engine, tp, b"other")
    # A re-run from another process (no cache) answers the first append's offsets.
    async with open_engine(make_settings(stack)) as fresh:
        (again,) = await fresh.writer.append_shared([group])
    assert isinstance(first, AppendResult) and isinstance(again, AppendResult)
    assert (first.start_offset, first.end_offset) == (1, 2)
    assert (again.start_offset, again.end_offset) == (1, 2)
    read = await engine.reader.read(tp, 1)
    assert read.records == [(1, b"once-a"), (2, b"once-b"), (3, b"other")]


async def test_groups_of_one_partition_commit_as_one_append_in_order(
        engine: Engine, tp: TopicPartition) -> None:
    results = await engine.writer.append_shared([
        AppendGroup(tp, [b"a1", b"a2"]), AppendGroup(tp, [b"b1"]), AppendGroup(tp, [b"c1"])])
    assert [(r.start_offset, r.end_offset) for r in results
            if isinstance(r, AppendResult)] == [(1, 2), (3, 3), (4, 4)]
    assert len({r.wal_uri for r in results if isinstance(r, AppendResult)}) == 1
    control = await engine.reader.read_control(tp)
    assert control is not None and control.pending is not None
    assert (control.pending.start_offset, control.pending.end_offset) == (1, 4)  # one CAS
    got = await engine.reader.read(tp, 1)
    assert [v for _, v in got.records] == [b"a1", b"a2", b"b1", b"c1"]


async def test_idempotency_keys_within_and_across_appends(engine: Engine,
                                                         tp: TopicPartition) -> None:
    first = await engine.writer.append_shared([
        AppendGroup(tp, [b"k1"], "key-1"), AppendGroup(tp, [b"k1-again"], "key-1"),
        AppendGroup(tp, [b"plain"])])
    a, echo, plain = first
    assert isinstance(a, AppendResult) and not a.duplicate and a.start_offset == 1
    assert isinstance(echo, AppendResult) and echo.duplicate and echo.start_offset == 1
    assert isinstance(plain, AppendResult) and plain.start_offset == 2
    # A retry of key-1 beside a new key-2: key-1 is answered, key-2 uploaded again alone.
    second = await engine.writer.append_shared([
        AppendGroup(tp, [b"k1-retry"], "key-1"), AppendGroup(tp, [b"k2"], "key-2")])
    again, k2 = second
    assert isinstance(again, AppendResult) and again.duplicate
    assert (again.start_offset, again.end_offset) == (1, 1)
    assert isinstance(k2, AppendResult) and not k2.duplicate and k2.start_offset == 3
    got = await engine.reader.read(tp, 1)
    assert [v for _, v in got.records] == [b"k1", b"plain", b"k2"]


async def test_keys_headers_timestamps_and_append_times_survive_compaction(
        stack: LocalStack, tp: TopicPartition) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        rich: list[Payload] = [LogRecord(b"v1", b"k1", (("h", b"x"), ("h", b"y")), 1234),
                               b"plain", LogRecord(b"v3", key=b"")]
        (first,) = await e.writer.append_shared([AppendGroup(tp, rich)])
        (second,) = await e.writer.append_shared([AppendGroup(tp, [b"p4"])])
        assert isinstance(first, AppendResult) and isinstance(second, AppendResult)
        assert second.append_time_ms >= first.append_time_ms > 0
        before = await e.reader.read(tp, 1)
        assert [v for _, v in before.records] == [*rich, b"p4"]
        assert before.append_times == [first.append_time_ms] * 3 + [second.append_time_ms]
        outcome = await make_compactor(e).compact_once(tp)
        assert (outcome.start_offset, outcome.end_offset) == (1, 4)
        after = await e.reader.read(tp, 1)
        assert after.records == before.records
        assert after.append_times == before.append_times


async def test_append_times_never_go_backwards(stack: LocalStack, tp: TopicPartition) -> None:
    """A writer whose clock is behind still appends at the partition's latest time."""
    async with open_engine(make_settings(stack)) as ahead:
        (late,) = await ahead.writer.append_shared([AppendGroup(tp, [b"a"])])
    behind = FakeClock(now_ms() - 60_000)
    async with open_engine(make_settings(stack), clock=behind) as e:
        (early,) = await e.writer.append_shared([AppendGroup(tp, [b"b"])])
    assert isinstance(late, AppendResult) and isinstance(early, AppendResult)
    assert early.append_time_ms == late.append_time_ms
