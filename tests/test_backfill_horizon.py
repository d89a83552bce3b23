"""backfill's append task honours the store's retry horizon: its writer refuses to commit
a blob older than the safe share of LLOG_RETRY_HORIZON_MS, as a broker's does, so vacuum
(which deletes unreferenced objects past that horizon) can never delete a blob a stalled
backfill then commits. Runs the task function itself against the real Oxia and MinIO;
no Spark is needed for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa  # type: ignore[import-untyped,import-not-found,unused-ignore]
import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]
import pytest

from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import Control
from jobs.spark import backfill_appends
from jobs.spark.job_settings import settings_payload
from tests.helpers.clock import FakeClock
from tests.helpers.stack import make_settings, open_engine

HORIZON_MS = 60_000  # the shortest LLOG_RETRY_HORIZON_MS: commits stop at 30 s


def _staged(path: Path, tp: TopicPartition, values: list[bytes]) -> str:
    """One staged file as backfill's staging step writes it: one chunk of ``tp``."""
    pq.write_table(pa.table({
        "_chunk": pa.array([0] * len(values), pa.int64()),
        "topic": pa.array([tp.topic] * len(values), pa.string()),
        "partition": pa.array([tp.partition] * len(values), pa.int32()),
        "value": pa.array(values, pa.binary())}), str(path))
    return path.as_uri()


def test_a_stalled_backfill_commit_is_refused_past_the_shared_horizon(
        stack: LocalStack, tp: TopicPartition, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(stack, retry_horizon_ms=HORIZON_MS)
    clock = FakeClock()

    def stall(step: str) -> None:  # the task stalls between its blob PUT and its commit
        if step == "after_blob_put":
            clock.advance(settings.retry_horizon_safe_ms + 1)

    class Stalled(backfill_appends.LogWriter):  # type: ignore[name-defined,misc]
        """The task's writer, however the task configures it, on a clock the test moves."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "clock": clock, "crash_hook": stall})

    monkeypatch.setattr(backfill_appends, "LogWriter", Stalled)
    params = backfill_appends.TaskParams(job_id="horizon", blob_bytes=1 << 20,
                                         marker_every=1, max_records_per_second=0)
    rows = list(backfill_appends.backfill_task(
        settings_payload(settings), params, [_staged(tmp_path / "c.parquet", tp, [b"a", b"b"])]))
    ((topic, partition, chunk, records, _, status, start, end, _, error),) = rows
    assert (topic, partition, chunk, records) == (tp.topic, tp.partition, 0, 2)
    assert status == backfill_appends.FAILED and (start, end) == (None, None)
    assert error is not None and error.startswith("CommitExpired")

    async def control() -> Control | None:
        async with open_engine(settings) as e:
            return await e.reader.read_control(tp)

    found = anyio.run(control)
    assert found is None or found.sequence_counter == 0  # nothing was committed
