"""What the ``llog compactor`` and ``llog compact-once`` commands run.

Both return a process exit code, so ``app/cli.py`` only parses arguments and settings.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import anyio

from app.compaction.claims import Claims
from app.compaction.compactor import CompactionConfig, CompactionOutcome, Compactor
from app.errors import LlogError
from app.settings import Settings
from app.storage.keys import KeyLayout, TopicPartition
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store

EXIT_BUSY = 3  # another compactor holds the partition's claim


def serve_compactor(settings: Settings, *, log_level: str = "info") -> int:
    """Run the standalone compactor service (HTTP on ``settings.host:port``)."""
    import logging.config

    import uvicorn

    from app.telemetry.logs import log_config, warn_unknown_variables
    from app.telemetry.registry import MULTIPROC_ENV

    # One process: it exposes its own registry, never a shared directory.
    os.environ.pop(MULTIPROC_ENV, None)
    # The factory re-reads the environment: make the CLI's overrides part of it.
    os.environ["LLOG_HOST"] = settings.host
    os.environ["LLOG_PORT"] = str(settings.port)
    logging_config = log_config(settings)
    logging.config.dictConfig(logging_config)
    warn_unknown_variables(os.environ)
    uvicorn.run(
        "app.compactor_app:create_compactor_app_from_env",
        factory=True, host=settings.host, port=settings.port, log_level=log_level,
        timeout_graceful_shutdown=30, lifespan="on", log_config=logging_config,
    )
    return 0


async def compact_partition(settings: Settings, tp: TopicPartition, *, claim: bool = True
                            ) -> CompactionOutcome | None:
    """One ``compact_once`` of ``tp`` under its claim; None if the claim is held."""
    metrics = StoreMetrics()
    layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
    async with OxiaStore(settings.oxia, metrics, identity=settings.broker_id) as oxia, \
            S3Store(settings.s3, metrics) as s3:
        compactor = Compactor(oxia, s3, layout, CompactionConfig.from_settings(
            settings.compaction))
        if not claim:
            return await compactor.compact_once(tp)
        async with Claims(oxia, layout, settings.broker_id).held(tp) as mine:
            return await compactor.compact_once(tp) if mine else None


def compact_once_main(settings: Settings, topic: str, partition: int, *,
                      claim: bool = True) -> int:
    """Print the outcome as JSON: 0 on success (nothing to do included), 3 if the
    partition is claimed by another compactor, 1 on a storage error."""
    try:
        tp = TopicPartition(topic, partition)
        outcome = anyio.run(functools.partial(compact_partition, settings, tp, claim=claim))
    except LlogError as exc:
        print(json.dumps({"error": exc.error_type, "detail": str(exc)}), file=sys.stderr)
        return 1
    if outcome is None:
        print(json.dumps({"tp": str(tp), "action": "busy",
                          "reason": "another compactor holds meta/compactor-claim"}))
        return EXIT_BUSY
    print(json.dumps(outcome.to_dict()))
    return 0
