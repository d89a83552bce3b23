"""The export job against real Oxia and MinIO: two attempts of one task, and every field
of records with keys, headers and timestamps, plain and compacted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload
from app.storage.reader import ReadResult
from app.storage.retention import move_log_start
from tests.helpers.spark_records import (
    compact_entries,
    export_row,
    read_back,
    sample_records,
)
from tests.helpers.spark_support import (
    SPARK_TESTS,
    Engine,
    append,
    index_rows,
    open_engine,
    run,
    stack_settings,
)

pytestmark = SPARK_TESTS


class _PausingReader:
    """The real reader; after its first batch it waits until ``resume`` is set, so a
    second attempt of the same part can run from start to finish in between."""

    def __init__(self, e: Engine, paused: anyio.Event, resume: anyio.Event) -> None:
        self._e = e
        self._paused = paused
        self._resume = resume
        self._reads = 0

    async def read(self, tp: TopicPartition, offset: int, **limits: Any) -> ReadResult:
        self._reads += 1
        if self._reads == 2:
            self._paused.set()
            await self._resume.wait()
        return await self._e.reader.read(tp, offset, **limits)


def test_two_attempts_of_one_part_never_share_a_temporary_file(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from jobs.spark.export import PartRange, _filesystem, part_name, write_part

    settings = stack_settings(stack)
    tp = TopicPartition(topic, 0)

    async def build(e: Engine) -> None:
        for i in range(5):
            await append(e, [(tp, [f"r{2 * i}".encode(), f"r{2 * i + 1}".encode()])])

    run(settings, build)
    fs, base = _filesystem(str(tmp_path / "out"))
    fs.create_dir(base)
    part = PartRange(3, topic, 0, 1, 10)
    rows: dict[str, tuple[Any, ...]] = {}

    async def attempts() -> None:
        async with open_engine(settings) as e:
            paused, resume = anyio.Event(), anyio.Event()

            async def slow() -> None:  # a zombie or speculative attempt, overtaken
                rows["slow"] = await write_part(_PausingReader(e, paused, resume), fs,
                                                base, part, 101, batch_records=2)

            async def fast() -> None:
                await paused.wait()
                rows["fast"] = await write_part(e.reader, fs, base, part, 102,
                                                batch_records=2)
                resume.set()

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow)
                    tg.start_soon(fast)

    anyio.run(attempts)
    assert rows["slow"] == rows["fast"] == (3, topic, 0, 1, 10, 10, 20, part_name(3))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [part_name(3)]
    written = pq.read_table(tmp_path / "out" / part_name(3)).to_pylist()
    assert [(r["offset"], r["value"]) for r in written] == [
        (o, f"r{o - 1}".encode()) for o in range(1, 11)]


def test_export_carries_keys_headers_timestamps_and_append_times(
        stack: LocalStack, spark: Any, topic: str, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from jobs.spark.export import ExportOptions, run_export
    from jobs.spark.report import Report

    settings = stack_settings(stack)
    tp, trimmed = TopicPartition(topic, 0), TopicPartition(topic, 1)

    async def build(e: Engine) -> dict[int, tuple[Payload, int]]:
        written: dict[int, tuple[Payload, int]] = {}
        # Plain-only appends (bytes-batch-v3), rich ones (v2 with headers) and mixed; the first
        # six entries are compacted (a v2 body with each record's own append time).
        for i in range(9):
            records = ([f"p{i}-{j}".encode() for j in range(3)] if i % 3 == 0
                       else sample_records(f"r{i}", 2 + i % 3))
            (result,) = await append(e, [(tp, records)])
            for offset, record in enumerate(records, result.start_offset):
                written[offset] = (record, result.append_time_ms)
        await compact_entries(e, tp, 6)
        await append(e, [(trimmed, sample_records("t", 10))])
        await move_log_start(e.oxia, e.layout, trimmed, 4, None)
        return written

    written = run(settings, build)
    entries = run(settings, lambda e: index_rows(e, tp))
    assert entries[0][1].type == "COMPACTED" and entries[0][1].encoding == "bytes-batch-v2"
    assert {entry.encoding for _, entry, _ in entries[1:]} == {"bytes-batch-v3",
                                                               "bytes-batch-v2"}
    tail = run(settings, lambda e: read_back(e, trimmed, 4))

    out = tmp_path / "out"
    outcome = run_export(spark, settings, ExportOptions(
        output=str(out), range_records=7, verify_output=True), Report(tmp_path / "r"))
    assert outcome.exit_code == 0, outcome.summary
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    expected = [export_row(topic, 0, o, record, at)
                for o, (record, at) in sorted(written.items())]
    expected += [export_row(topic, 1, o, record, at) for o, record, at in tail]
    assert len(expected) == len(written) + 7
    assert rows == expected
    # Every kind of record is there, the append times are the broker's, not zero.
    assert {r["key"] for r in rows} >= {None, b""}
    assert any(len(r["headers"]) == 3 for r in rows) and any(not r["headers"] for r in rows)
    assert all(r["append_time_ms"] > 0 for r in rows)
    assert outcome.summary["records_expected"] == len(expected)
