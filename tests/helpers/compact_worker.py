"""A compactor process for crash and claim tests.

Runs one ``compact_once`` of a partition and prints its outcome as a JSON line.
``--crash-at STEP`` SIGKILLs the process when the compactor reaches that protocol step (a
real crash: no cleanup, the claim is left to Oxia's session expiry). ``--claim`` takes the
partition's ephemeral claim first, as the scheduler does. ``--hold-claim`` takes the claim,
prints ``{"claimed": ...}`` and then waits until it is killed. Settings come from the
LLOG_* environment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import anyio

from app.compaction.claims import Claims
from app.compaction.compactor import CompactionConfig, Compactor
from app.settings import Settings
from app.storage.keys import KeyLayout, TopicPartition
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--claim", action="store_true")
    parser.add_argument("--hold-claim", action="store_true")
    parser.add_argument("--compactor-id", default="worker")
    args = parser.parse_args()

    def hook(step: str) -> None:
        if step == args.crash_at:
            print(json.dumps({"crashed_at": step}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    async def run() -> None:
        settings = Settings.from_env()
        metrics = StoreMetrics()
        layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
        tp = TopicPartition(args.topic, args.partition)
        async with (
            OxiaStore(settings, metrics, identity=args.compactor_id) as ox,
            S3Store(settings, metrics) as s3,
        ):
            compactor = Compactor(ox, s3, layout, CompactionConfig.from_settings(settings),
                                  crash_hook=hook)
            claims = Claims(ox, layout, args.compactor_id)
            if args.claim or args.hold_claim:
                version = await claims.acquire(tp)
                print(json.dumps({"claimed": version is not None}), flush=True)
                if version is None:
                    return
                if args.hold_claim:
                    await anyio.sleep_forever()
            outcome = await compactor.compact_once(tp)
            print(json.dumps(outcome.to_dict()), flush=True)

    anyio.run(run)


if __name__ == "__main__":
    main()
