"""Shared WAL objects are read once for every partition that wants a slice of them, the
records stay exactly what was written, and a corrupt or missing object is still
reported. Against the real Oxia and MinIO."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from app.errors import CorruptData, LlogError, ObjectMissing
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.reader import LogReader, ReadRequest
from tests.helpers.stack import Engine

PARTITIONS = 4
FLUSHES = 6
PER_GROUP = 20


def _gets(e: Engine) -> float:
    """S3 GETs, whole and ranged, by this engine's clients so far."""
    sample = e.metrics.registry.get_sample_value
    return sum(sample("llog_s3_requests_total", {"op": op, "outcome": "ok"}) or 0.0
               for op in ("get", "range_get"))


async def _flushes(e: Engine, topic: str) -> tuple[list[TopicPartition], dict[
        TopicPartition, list[bytes]], list[str]]:
    """``FLUSHES`` shared blobs, each with a slice of every partition; what each
    partition holds, in order, and the blobs' keys."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    written: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}
    keys = []
    for flush in range(FLUSHES):
        groups = [AppendGroup(tp, [f"{tp.partition}-{flush}-{i}-".encode() + b"v" * 200
                                   for i in range(PER_GROUP)]) for tp in tps]
        results = await e.writer.append_shared(groups)
        for group, result in zip(groups, results, strict=True):
            assert isinstance(result, AppendResult), result
            written[group.tp].extend(group.records)
        keys.append(e.layout.parse_uri(results[0].wal_uri)[1])
    assert len(set(keys)) == FLUSHES
    return tps, written, keys


async def _read_all(reader: LogReader, tp: TopicPartition, max_bytes: int) -> list[bytes]:
    """The partition from offset 1 to its end, checking offsets are contiguous."""
    out: list[bytes] = []
    offset = 1
    while True:
        result = await reader.read(tp, offset, max_bytes=max_bytes)
        if not result.records:
            return out
        for at, value in result.records:
            assert at == len(out) + 1  # contiguous from offset 1
            assert isinstance(value, bytes)
            out.append(value)
        assert result.next_offset == len(out) + 1
        offset = result.next_offset


async def test_each_wal_object_is_fetched_once_for_all_its_partitions(
        engine: Engine, topic: str) -> None:
    tps, written, _ = await _flushes(engine, topic)
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    before = _gets(engine)
    # One partition after the other, as a consumer of several partitions catching up
    # (or several consumers) reads them: the later partitions' slices are in memory.
    for tp in tps:
        assert await _read_all(reader, tp, max_bytes=3 * PER_GROUP * 220) == written[tp]
    assert _gets(engine) - before == FLUSHES
    stats = reader.objects.statistics()
    assert stats.wal_objects_read == FLUSHES
    assert stats.wal_slices_served >= FLUSHES * PARTITIONS  # a slice an answer ends in twice


async def test_one_read_of_several_partitions_and_concurrent_reads_share_the_gets(
        engine: Engine, topic: str) -> None:
    tps, written, _ = await _flushes(engine, topic)
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    before = _gets(engine)
    got: dict[TopicPartition, list[bytes]] = {}

    async def read(tp: TopicPartition) -> None:
        got[tp] = await _read_all(reader, tp, max_bytes=1 << 20)

    async with anyio.create_task_group() as tg:
        for tp in tps[:2]:
            tg.start_soon(read, tp)
    many = await reader.read_many([ReadRequest(tp, 1) for tp in tps[2:]])
    for tp, result in zip(tps[2:], many, strict=True):
        assert not isinstance(result, LlogError)
        got[tp] = [v for _, v in result.records]  # type: ignore[misc]
    assert got == written
    assert _gets(engine) - before == FLUSHES


async def test_records_stay_whole_when_the_cache_drops_objects(
        engine: Engine, topic: str) -> None:
    tps, written, _ = await _flushes(engine, topic)
    # Room for about two objects: reading the partitions one after the other drops
    # objects before their other partitions are read.
    blob = PARTITIONS * PER_GROUP * 220
    reader = LogReader(engine.oxia, engine.s3, engine.layout,
                       object_cache_bytes=5 * blob, wal_object_max_bytes=blob * 2)
    for tp in tps:
        assert await _read_all(reader, tp, max_bytes=2 * PER_GROUP * 220) == written[tp]
    stats = reader.objects.statistics()
    assert stats.evictions > 0
    # Interleaved, in small reads, the same records again.
    offsets = dict.fromkeys(tps, 1)
    again: dict[TopicPartition, list[bytes]] = {tp: [] for tp in tps}
    while any(offsets[tp] <= len(written[tp]) for tp in tps):
        for tp in tps:
            result = await reader.read(tp, offsets[tp], max_bytes=PER_GROUP * 220)
            assert not result.records or result.records[0][0] == offsets[tp]
            again[tp].extend(v for _, v in result.records)  # type: ignore[misc]
            offsets[tp] = result.next_offset
    assert again == written


async def test_a_corrupt_slice_is_reported_and_its_neighbours_still_served(
        engine: Engine, s3_client: Any, topic: str) -> None:
    tps, written, keys = await _flushes(engine, topic)
    bucket = engine.settings.s3_bucket
    original = s3_client.get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    tampered = original.replace(b"1-0-3-", b"1-0-X-")
    assert tampered != original
    s3_client.put_object(Bucket=bucket, Key=keys[0], Body=tampered)
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    # Partition 0 reads the object whole first (it is kept), then partition 1 meets
    # its corrupt slice: reported, never skipped, however often it is asked.
    assert await _read_all(reader, tps[0], max_bytes=1 << 20) == written[tps[0]]
    for _ in range(2):
        with pytest.raises(CorruptData):
            await reader.read(tps[1], 1)
    (result,) = await reader.read_many([ReadRequest(tps[2], 1)])
    assert not isinstance(result, LlogError)
    assert [v for _, v in result.records] == written[tps[2]]


async def test_a_missing_object_is_reported(engine: Engine, s3_client: Any,
                                            topic: str) -> None:
    tps, _, keys = await _flushes(engine, topic)
    s3_client.delete_object(Bucket=engine.settings.s3_bucket, Key=keys[0])
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    for tp in tps[:2]:
        with pytest.raises(ObjectMissing):
            await reader.read(tp, 1)


async def test_a_catch_up_in_the_wal_reads_the_next_objects_ahead(
        engine: Engine, topic: str) -> None:
    tps, written, keys = await _flushes(engine, topic)
    tp = tps[0]
    reader = LogReader(engine.oxia, engine.s3, engine.layout, read_ahead=4)
    async with anyio.create_task_group() as tg:
        reader.run_ahead_in(tg)
        first = await reader.read(tp, 1, max_bytes=2 * PER_GROUP * 220)
        assert [v for _, v in first.records] == written[tp][:len(first.records)]
        nxt = first.next_offset
        # The lookup for the next read, and the objects of about as many bytes after it.
        assert await reader.plans.take(tp, nxt) is not None
        await reader.ahead.wait(f"{tp}@{nxt}")
        before = _gets(engine)
        second = await reader.read(tp, nxt, max_bytes=2 * PER_GROUP * 220)
        assert _gets(engine) == before  # its objects were read ahead
        assert second.records and second.records[0][0] == nxt
        got = [v for _, v in first.records] + [v for _, v in second.records]
        assert got == written[tp][:len(got)]
        tg.cancel_scope.cancel()


async def test_a_partition_behind_one_that_fills_the_answer_plans_no_further(
        engine: Engine, topic: str) -> None:
    tps = [TopicPartition(topic, p) for p in range(2)]
    for flush in range(40):
        results = await engine.writer.append_shared(
            [AppendGroup(tp, [b"%d-%d" % (flush, i) + b"v" * 100 for i in range(5)])
             for tp in tps])
        assert all(isinstance(r, AppendResult) for r in results)
    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    scans: list[str] = []
    real = engine.oxia.range_scan

    async def recording(lo: str, hi: str, partition_key: str, **kw: Any) -> Any:
        scans.append(lo)
        return await real(lo, hi, partition_key, **kw)

    engine.oxia.range_scan = recording  # type: ignore[method-assign]
    # Partition 0 fills the answer with about thirty entries (more than an index page).
    first, second = await reader.read_many([ReadRequest(tp, 1) for tp in tps],
                                           max_bytes=30 * 5 * 110)
    engine.oxia.range_scan = real  # type: ignore[method-assign]
    assert not isinstance(first, LlogError) and not isinstance(second, LlogError)
    assert len(first.records) >= 25 * 5 and not second.records
    assert second.high_watermark == 200
    behind = [lo for lo in scans if lo.startswith(engine.layout.index_prefix(tps[1]))]
    assert len(behind) == 1  # its first page, read beside its control record
