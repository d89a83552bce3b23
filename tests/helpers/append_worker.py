"""A writer process for concurrency and crash tests.

Appends ``--batches`` batches of ``--records`` records to one partition and prints one
JSON line per acknowledged batch. ``--crash-at STEP`` SIGKILLs the process the
``--crash-nth`` time the writer reaches that protocol step (a real crash: no cleanup).
``--repair`` instead runs ``materialise_pending`` once (the compactor's first step).
Settings come from the LLOG_* environment.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import anyio

from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.writer import LogWriter
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--records", type=int, default=3)
    parser.add_argument("--tag", default="w")
    parser.add_argument("--crash-at", default="")
    parser.add_argument("--crash-nth", type=int, default=1)
    parser.add_argument("--repair", action="store_true")
    args = parser.parse_args()
    seen = {"n": 0}

    def hook(step: str) -> None:
        if step == args.crash_at:
            seen["n"] += 1
            if seen["n"] >= args.crash_nth:
                print(json.dumps({"crashed_at": step}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    async def run() -> None:
        settings = Settings.from_env()
        metrics = StoreMetrics()
        layout = KeyLayout(settings.root_prefix, settings.s3_bucket)
        tp = TopicPartition(args.topic, args.partition)
        async with (
            OxiaStore(settings, metrics) as ox,
            S3Store(settings, metrics) as s3,
            LogWriter(ox, s3, layout, metrics, crash_hook=hook) as writer,
        ):
            if args.repair:
                done = await writer.materialise_pending(tp)
                print(json.dumps({"repaired": done}), flush=True)
                return
            for b in range(args.batches):
                records = [f"{args.tag}-{b}-{i}".encode() for i in range(args.records)]
                (result,) = await writer.append_shared([AppendGroup(tp, records)])
                if isinstance(result, AppendResult):
                    print(json.dumps({
                        "start": result.start_offset, "end": result.end_offset,
                        "records": [r.decode() for r in records],
                    }), flush=True)
                else:
                    print(json.dumps({"error": result.error_type, "detail": str(result)}),
                          flush=True)

    anyio.run(run)


if __name__ == "__main__":
    sys.exit(main())
