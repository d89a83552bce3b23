"""What an Oxia get costs the broker's process: on the event loop or in a worker thread.

The broker's gets (control records, cursors, group offsets) go through ``grpc.aio`` on
the event loop (app/stores/oxia/reads.py) unless ``LLOG_OXIA_EVENT_LOOP_READS=false``
sends them through the ``oxia`` package in a worker thread. This measures both through
``OxiaStore.get`` on one Oxia server, in one run, alternating: ``--concurrency`` gets at
a time, gets/s and the process's CPU per get (every thread), plain and with the event
loop kept busy by a task that computes in slices of ``--busy-ms`` (as a broker sending
answers does), which is where a worker thread's handovers of the GIL wait.

    .venv/bin/python bench/oxia_gets.py [--gets 2000] [--concurrency 1,16] [--rounds 2]

It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import anyio.lowlevel  # noqa: E402
import uvloop  # noqa: E402

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.stores.metrics import StoreMetrics  # noqa: E402
from app.stores.oxia.store import OxiaStore  # noqa: E402


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _measure(settings: Settings, gets: int, concurrency: int, busy_ms: float
                   ) -> tuple[float, float, float]:
    """Gets/s, CPU µs per get and mean ms per get, for one way and one load."""
    async with OxiaStore(settings.oxia, StoreMetrics(), identity=settings.broker_id) as store:
        await store.put("bench/gets", b"x" * 200, "bench")
        for _ in range(20):
            await store.get("bench/gets", "bench")
        left = gets
        spent: list[float] = []

        async def getter() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                await store.get("bench/gets", "bench")
                spent.append(time.perf_counter() - t0)

        async def busy(done: anyio.Event) -> None:
            while not done.is_set():
                until = time.perf_counter() + busy_ms / 1000
                while time.perf_counter() < until:
                    pass
                await anyio.lowlevel.checkpoint()

        cpu0, t0 = _cpu(), time.perf_counter()
        done = anyio.Event()
        async with anyio.create_task_group() as tg:
            if busy_ms > 0:
                tg.start_soon(busy, done)
            async with anyio.create_task_group() as getters:
                for _ in range(concurrency):
                    getters.start_soon(getter)
            done.set()
        elapsed, cpu = time.perf_counter() - t0, _cpu() - cpu0
    return gets / elapsed, cpu / gets * 1e6, sum(spent) / len(spent) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--busy-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llog-oxia-gets-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            os.environ.update(stack.settings_env())
            print(f"Oxia gets through OxiaStore, {args.gets} per row; CPU = this process, "
                  "every thread; busy = the event loop computing in "
                  f"{args.busy_ms:g} ms slices meanwhile")
            print(f"{'way':>12} {'conc':>5} {'busy':>5} {'gets/s':>8} {'CPU us/get':>10} "
                  f"{'ms/get':>7}")
            for _ in range(args.rounds):
                for conc in (int(c) for c in args.concurrency.split(",")):
                    for busy in (0.0, args.busy_ms):
                        for way, on_loop in (("event loop", True), ("thread", False)):
                            settings = Settings(oxia_event_loop_reads=on_loop)
                            rate, cpu, ms = uvloop.run(_measure(settings, args.gets, conc,
                                                                busy))
                            print(f"{way:>12} {conc:>5} {'yes' if busy else 'no':>5} "
                                  f"{rate:>8.0f} {cpu:>10.0f} {ms:>7.2f}", flush=True)
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
