"""Which topic-partitions a job works on:
:func:`app.storage.partition_discovery.discover_partitions` over any ``meta/`` or
``index/`` key, not only ``meta/control``.

The catalog's single listing already returns every per-partition key; a partition whose
``meta/control`` was lost but whose index survives is still audited, and still counts as
holding references for vacuum (leaving it out would let vacuum delete what its index
entries name).
"""

from __future__ import annotations

from app.settings import Settings
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.partition_discovery import discover_partitions
from app.stores.oxia.store import OxiaStore
from jobs.spark.job_settings import settings_payload
from jobs.spark.stores import open_stores
from jobs.spark.tasks import run_async, task_identity


async def discover_all(oxia: OxiaStore, layout: KeyLayout) -> list[TopicPartition]:
    """Every topic-partition with any ``meta/`` or ``index/`` key."""
    return await discover_partitions(oxia, layout, any_key=True)


def discover_on_driver(settings: Settings, job: str) -> list[TopicPartition]:
    payload = settings_payload(settings)

    async def run() -> list[TopicPartition]:
        async with open_stores(payload, task_identity(job)) as stores:
            return await discover_all(stores.oxia, stores.layout)

    return run_async(run)
