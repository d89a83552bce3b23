"""The export job's part files against real Oxia and MinIO: two attempts of one task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.reader import ReadResult
from tests.helpers.spark_support import (
    SPARK_TESTS,
    Engine,
    append,
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
