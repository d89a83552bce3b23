"""The reader's work and memory are bounded by what it is asked for, and the races it
can meet (a truncated body, compaction and vacuum, strays) are answered, not crashed on.
Everything runs against the real Oxia and MinIO."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable

import anyio
import pytest

from app.errors import StorageUnavailable
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry
from app.storage.reader import LogReader, ReadRequest, ReadResult
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from tests.helpers.compaction import (
    append_batches,
    compaction_settings,
    index_entries,
    make_compactor,
    read_all,
)
from tests.helpers.faults import truncating_proxy
from tests.helpers.stack import Engine, open_engine


def _bytes_in(e: Engine) -> float:
    value = e.metrics.registry.get_sample_value("llog_s3_bytes_total", {"direction": "in"})
    return value or 0.0


def _fresh_reader(e: Engine, **kwargs: int) -> LogReader:
    return LogReader(e.oxia, e.s3, e.layout, **kwargs)


async def _compacted_partition(e: Engine, tp: TopicPartition, *, batches: int,
                               per_batch: int, **config: int) -> dict[int, bytes]:
    acked = await append_batches(e.writer, tp, batches, per_batch, tag="x" * 90)
    compactor = make_compactor(e, **config)
    while (await compactor.compact_once(tp)).did_work:
        pass
    return acked


async def _one_chunked_blob(e: Engine, tp: TopicPartition
                            ) -> tuple[dict[int, bytes], IndexEntry]:
    """A partition compacted into one blob of 4 KiB chunks: what was written, its entry."""
    acked = await _compacted_partition(e, tp, batches=40, per_batch=50, chunk_bytes=4096)
    (compacted,) = [x for _, x in await index_entries(e, tp) if x.type == "COMPACTED"]
    return acked, compacted


async def test_catch_up_through_a_compacted_blob_fetches_what_it_returns(
        stack: LocalStack, tp: TopicPartition) -> None:
    settings = compaction_settings(stack, compaction_chunk_bytes=4096)
    async with open_engine(settings) as e:
        acked, compacted = await _one_chunked_blob(e, tp)
        end = compacted.msg_count
        assert compacted.object_bytes is not None and compacted.object_bytes > 150_000
        assert compacted.chunks is not None and len(compacted.chunks) > 30

        reader = _fresh_reader(e)
        before = _bytes_in(e)
        first = await reader.read(tp, 1, max_bytes=8192)
        fetched = _bytes_in(e) - before
        assert first.records and first.size <= 8192
        assert fetched <= 8192 + 2 * 4096 + 1024  # the budget plus a chunk, not the object

        offset, got = 1, {}
        while offset <= end:
            page = await reader.read(tp, offset, max_bytes=8192)
            got.update(page.records)
            offset = page.next_offset
        assert got == acked
        assert _bytes_in(e) - before <= compacted.object_bytes + 8192  # each chunk once


async def test_one_fetch_plans_by_bytes_across_many_compacted_blobs(
        stack: LocalStack, tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        await _compacted_partition(e, tp, batches=40, per_batch=50, max_entries=4)
        compacted = [x for _, x in await index_entries(e, tp) if x.type == "COMPACTED"]
        assert len(compacted) == 10
        reader = _fresh_reader(e)
        before = _bytes_in(e)
        result = await reader.read(tp, 1, max_bytes=4096)
        assert result.records
        assert _bytes_in(e) - before <= 2 * max(x.object_bytes or 0 for x in compacted)


async def test_downloads_per_request_are_bounded(stack: LocalStack, topic: str) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        tps = [TopicPartition(topic, p) for p in range(8)]
        for tp in tps:  # a blob of its own for every partition
            await e.writer.append_shared([AppendGroup(tp, [b"v" * 1000])])
        active, peak = 0, 0
        real, real_head = e.s3.get_range_buffer, e.s3.get_head_buffer

        async def counted(fetch: Awaitable[bytes | bytearray]) -> bytes | bytearray:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            try:
                await anyio.sleep(0.05)  # hold the slot, so overlap would show
                return await fetch
            finally:
                active -= 1

        async def counting(key: str, start: int, length: int) -> bytes | bytearray:
            return await counted(real(key, start, length))

        async def counting_head(key: str, length: int
                                ) -> bytes | bytearray:  # WAL objects read whole
            return await counted(real_head(key, length))

        e.s3.get_range_buffer = counting  # type: ignore[method-assign]
        e.s3.get_head_buffer = counting_head  # type: ignore[method-assign]
        reader = _fresh_reader(e, fetch_concurrency=2, max_concurrent_fetches=3)
        results = await reader.read_many([ReadRequest(tp, 1) for tp in tps])
        assert all(isinstance(r, ReadResult) and len(r.records) == 1 for r in results)
        assert peak == 2


async def test_a_truncated_body_is_a_retriable_storage_error(stack: LocalStack,
                                                            tp: TopicPartition) -> None:
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        await e.writer.append_shared([AppendGroup(tp, [b"t" * 50_000])])
        host, port = stack.s3_endpoint.removeprefix("http://").rsplit(":", 1)
        async with truncating_proxy(host, int(port), body_bytes=1000) as proxy_port:
            cut = settings.model_copy(update={
                "s3_endpoint": f"http://127.0.0.1:{proxy_port}", "s3_max_attempts": 1})
            async with S3Store(cut, StoreMetrics()) as s3:
                reader = LogReader(e.oxia, s3, e.layout)
                with anyio.fail_after(30):
                    (outcome,) = await reader.read_many([ReadRequest(tp, 1)])
        assert isinstance(outcome, StorageUnavailable) and outcome.retriable


async def test_oxia_unreachable_is_a_retriable_error_of_the_partition(
        stack: LocalStack, tp: TopicPartition) -> None:
    """The control record and the first index page are read at once: when Oxia fails,
    the partition's outcome is the storage error, as a sequential read's would be."""
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        await e.writer.append_shared([AppendGroup(tp, [b"a", b"b"])])
        closed = OxiaStore(settings, StoreMetrics())  # never connected: every call fails
        reader = LogReader(closed, e.s3, e.layout)
        with anyio.fail_after(30):
            outcomes = await reader.read_many([ReadRequest(tp, 1), ReadRequest(tp, 0)])
        assert all(isinstance(o, StorageUnavailable) and o.retriable for o in outcomes)
        (served,) = await _fresh_reader(e).read_many([ReadRequest(tp, 2)])
        assert isinstance(served, ReadResult) and [v for _, v in served.records] == [b"b"]


async def test_a_read_racing_compaction_and_vacuum_plans_again(
        stack: LocalStack, tp: TopicPartition) -> None:
    """Planned against WAL entries; before the fetch, compaction replaces them and
    vacuum deletes their blobs: the read plans once more and serves the compacted copy."""
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        acked = await append_batches(e.writer, tp, 4, 3)
        blobs = {x.data_key for _, x in await index_entries(e, tp)}
        reader = _fresh_reader(e)
        real_fetch = reader._fetch
        raced = {"done": False}

        async def fetch_after_the_race(units: list[object]) -> None:
            if not raced["done"]:
                raced["done"] = True
                await make_compactor(e).compact_once(tp)
                for uri in blobs:  # what vacuum does to unreferenced WAL blobs
                    await e.s3.delete(e.layout.parse_uri(uri)[1])
            await real_fetch(units)  # type: ignore[arg-type]

        reader._fetch = fetch_after_the_race  # type: ignore[method-assign]
        result = await reader.read(tp, 1)
        assert raced["done"]
        assert dict(result.records) == acked


async def _install_strays(e: Engine, tp: TopicPartition, offsets: range) -> None:
    """WAL entries inside a compacted range, pointing at a blob that no longer exists
    (what a long-delayed materialising create leaves behind)."""
    gone = e.layout.uri(e.layout.shared_wal_object(uuid.uuid4().hex))
    for offset in offsets:
        stray = IndexEntry("WAL", 1, gone, byte_offset=8, byte_length=9)
        await e.oxia.put(e.layout.index(tp, offset), stray.to_json(), tp.partition_key)


@pytest.mark.parametrize("strays", [range(1, 3), range(2, 102)])
async def test_strays_never_surface_as_errors(stack: LocalStack, tp: TopicPartition,
                                              strays: range) -> None:
    """Whether a stray covers the offset read (its blob is gone) or a hundred of them
    stand between the offset and the compacted entry that covers it."""
    settings = compaction_settings(stack)
    async with open_engine(settings) as e:
        acked = await append_batches(e.writer, tp, 1, 120)
        await append_batches(e.writer, tp, 1, 1)
        outcome = await make_compactor(e).compact_once(tp)
        assert (outcome.start_offset, outcome.end_offset) == (1, 121)
        await _install_strays(e, tp, strays)
        assert await read_all(e, tp) == {**acked, 121: b"r-0-0"}


def _range_gets(e: Engine) -> float:
    value = e.metrics.registry.get_sample_value(
        "llog_s3_requests_total", {"op": "range_get", "outcome": "ok"})
    return value or 0.0


async def test_a_read_inside_a_compacted_blob_reads_the_next_chunks_ahead(
        stack: LocalStack, tp: TopicPartition) -> None:
    settings = compaction_settings(stack, compaction_chunk_bytes=4096)
    async with open_engine(settings) as e:
        acked, compacted = await _one_chunked_blob(e, tp)
        _, key = e.layout.parse_uri(compacted.data_key)
        reader = LogReader(e.oxia, e.s3, e.layout, read_ahead=2)
        async with anyio.create_task_group() as tg:
            reader.ahead.run_in(tg)
            offset, got, probes, served = 1, {}, 0, 0
            while offset <= compacted.msg_count:
                page = await reader.read(tp, offset, max_bytes=8192)
                await reader.ahead.wait(key)  # what was started for the next read is in
                got.update(page.records)
                offset = page.next_offset
                if offset <= compacted.msg_count:
                    # The next read finds its first chunk cached: no GET of its own.
                    gets = _range_gets(e)
                    nxt = await reader.read(tp, offset, max_bytes=1)
                    assert nxt.records and nxt.records[0][0] == offset
                    probes += 1
                    served += _range_gets(e) == gets
                    await reader.ahead.wait(key)
            tg.cancel_scope.cancel()
        stats = reader.ahead.statistics()
    assert got == acked
    assert stats.started > 10 and stats.failed == 0 and stats.inflight == 0
    assert served == probes > 10



@pytest.mark.parametrize("stored", ["compacted", "wal"])
async def test_partitions_with_a_budget_each_share_every_answer(
        stack: LocalStack, topic: str, stored: str) -> None:
    """One consumer reading 4 partitions, a budget each that together make the
    answer's: once each resumes inside the chunk (compacted) or the shared WAL object
    (not compacted yet) its last answer ended in, every partition gets records in every
    answer (what the last read kept is not counted again against the answer's budget),
    and each record comes once, in order."""
    settings = compaction_settings(stack, compaction_chunk_bytes=4096)
    async with open_engine(settings) as e:
        tps = [TopicPartition(topic, p) for p in range(4)]
        acked: dict[TopicPartition, dict[int, bytes]] = {tp: {} for tp in tps}
        if stored == "compacted":
            for tp in tps:
                acked[tp] = await _compacted_partition(e, tp, batches=10, per_batch=40,
                                                       chunk_bytes=4096)
        else:  # every flush a shared WAL object with a slice of each partition
            for flush in range(10):
                groups = [AppendGroup(tp, [f"{flush}-{i}-".encode() + b"w" * 90
                                           for i in range(40)]) for tp in tps]
                outcomes = await e.writer.append_shared(groups)
                for group, outcome in zip(groups, outcomes, strict=True):
                    assert isinstance(outcome, AppendResult)
                    acked[group.tp].update(zip(
                        range(outcome.start_offset, outcome.end_offset + 1),
                        group.records, strict=True))
        reader = _fresh_reader(e)
        offsets = dict.fromkeys(tps, 1)
        got: dict[TopicPartition, dict[int, bytes]] = {tp: {} for tp in tps}
        starved = []
        for round_ in range(8):
            results = await reader.read_many(
                [ReadRequest(tp, offsets[tp], max_bytes=4096) for tp in tps],
                max_bytes=4 * 4096)
            for tp, result in zip(tps, results, strict=True):
                assert isinstance(result, ReadResult)
                if round_ and not result.records:
                    starved.append((round_, tp.partition))
                got[tp].update(result.records)
                offsets[tp] = result.next_offset
        assert starved == []
        for tp in tps:
            assert offsets[tp] > 40
            assert got[tp] == {o: v for o, v in acked[tp].items() if o < offsets[tp]}
