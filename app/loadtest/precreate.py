"""Create every partition of a scenario before the load starts.

Uses the engine's own ``LogWriter.ensure_partition`` (idempotent: creates
``meta/control`` and ``meta/compaction-cursor`` when absent), so the first produce of the
run does not pay for partition creation and broker metrics count only the load.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from app.settings import Settings
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store


def stack_settings(stack_env: dict[str, str], **overrides: Any) -> Settings:
    """Settings pointing at a run's Oxia and MinIO (from stack.json's ``settings_env``)."""
    values: dict[str, Any] = {
        key.removeprefix("LLOG_").lower(): value for key, value in stack_env.items()
    }
    values.setdefault("broker_id", "loadtest-precreate")
    values.update(overrides)
    return Settings(**values)


async def _precreate(settings: Settings, partitions: list[TopicPartition],
                     concurrency: int) -> None:
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as oxia, \
            S3Store(settings.s3, metrics) as s3:
        writer = LogWriter.from_settings(oxia, s3, layout, metrics, settings.writer)
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(tp: TopicPartition) -> None:
            async with limiter:
                await writer.ensure_partition(tp)

        async with anyio.create_task_group() as tg:
            for tp in partitions:
                tg.start_soon(one, tp)


def precreate(stack_env: dict[str, str], topics: list[tuple[str, int]],
              concurrency: int = 32) -> dict[str, Any]:
    """Ensure every (topic, partition count) exists; returns what precreate.json records."""
    partitions = [TopicPartition(t, p) for t, n in topics for p in range(n)]
    started = time.monotonic()
    anyio.run(_precreate, stack_settings(stack_env), partitions, concurrency)
    return {
        "method": "LogWriter.ensure_partition",
        "partitions": len(partitions),
        "topics": {t: n for t, n in topics},
        "seconds": round(time.monotonic() - started, 3),
        "at": time.time(),
    }
