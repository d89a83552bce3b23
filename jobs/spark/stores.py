"""The project's own Oxia and S3 clients, opened inside a Spark task (or the driver).

The same classes as the brokers, so executors speak to Oxia and S3 with exactly the
codecs, conditional creates and retries of the writers (docs/spark-jobs.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from app.settings import Settings
from app.storage.keys import KeyLayout
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from jobs.spark.job_settings import settings_from_payload

JOBS_PREFIX = "_jobs"  # {root}/_jobs/...: objects of the jobs themselves (never data)


def job_object_key(layout: KeyLayout, *parts: str) -> str:
    """``{root}/_jobs/{parts...}``: anchors, manifests and markers, never listed as data."""
    return "/".join((layout.root, JOBS_PREFIX, *parts))


@dataclass
class Stores:
    settings: Settings  # all of the task's settings: its code takes the groups it needs
    layout: KeyLayout
    metrics: StoreMetrics
    oxia: OxiaStore
    s3: S3Store


@contextlib.asynccontextmanager
async def open_stores(payload: Mapping[str, str], identity: str) -> AsyncIterator[Stores]:
    """The project's own Oxia and S3 clients, for one task (or the driver)."""
    # Gets and puts through the oxia package, not grpc.aio: a task runs in a Python worker that
    # Spark's daemon forked without exec, which gRPC Python does not support (grpc's
    # doc/fork_support.md); a grpc.aio channel there failed to connect in a CI run
    # ("timed out before receiving SETTINGS frame") where the package's client always
    # has. A task reads a few keys per partition: the event loop would gain it nothing.
    settings = settings_from_payload(payload, broker_id=identity, oxia_event_loop_reads=False,
                                     oxia_event_loop_writes=False)
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings.oxia, metrics, identity=identity) as ox:
        try:
            async with S3Store(settings.s3, metrics) as s3:
                yield Stores(settings, layout, metrics, ox, s3)
        finally:
            quiet_oxia_close(ox)


def quiet_oxia_close(oxia: OxiaStore) -> None:
    """Tell the client's shard-assignment thread that a close is coming.

    ``oxia.Client.close`` (0.2.x) closes its channels before it flags its service
    discovery as closed, so the assignment thread can retry on a closed channel and die
    with ``ValueError: Cannot invoke RPC: Channel closed!``. Setting the flag first
    makes that thread leave quietly. Harmless if the client's internals change.
    """
    discovery = getattr(oxia.client, "_service_discovery", None)
    if discovery is not None and hasattr(discovery, "_closed"):
        discovery._closed = True
