"""Many concurrent large catch-up reads against one broker: its peak RSS beside the
answer budget (a script, not a timing test).

Starts its own real Oxia and MinIO and one broker process (``llog serve``) with
``LLOG_MAX_ANSWER_BYTES_IN_FLIGHT`` set to ``--budget-mib``, and what would hold memory
of its own off (object cache, tail cache, the compact role), so that what grows is what
answers hold. Writes ``--data-mib`` MiB over ``--partitions`` partitions, then runs
``--readers`` consumers at once, each reading a partition from offset 1 to its end
(``--rounds`` times), ``--fetch-mib`` per ``POST /consume``, half of them asking for
binary answers and half for JSON (``--format``); a 503 is retried after its
``Retry-After``.

It samples the broker's RSS (psutil, every 10 ms) and reads its peak (``VmHWM``), and
prints them beside the bound: the broker's RSS when idle and warmed, plus the budget,
plus a fixed overhead (``--overhead-mib``: the allocator's slack, socket buffers, the
reads' object-store buffers in flight). Without the budget the same load would hold
``readers x fetch`` (and the JSON encodings) at once: ``--unbounded`` runs it so, for
comparison.

    .venv/bin/python bench/answer_memory.py [--budget-mib 256] [--readers 64]
        [--fetch-mib 32] [--data-mib 512] [--unbounded]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import free_port
from app.localstack.stack import LocalStack, StackConfig
from app.wire import records as wire

MiB = 1024 * 1024
TOPIC = "answers"
UNBOUNDED = 1024 * 1024 * MiB  # the setting's largest value: in effect no budget


class RssSampler:
    """The largest RSS of a process tree seen while running, sampled in a thread (the
    broker is another process: sampling does not slow it)."""

    def __init__(self, pid: int, interval_s: float = 0.01) -> None:
        self.process = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        procs = [self.process, *self.process.children(recursive=True)]
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def vm_hwm(pid: int) -> int:
    """The kernel's record of the process's peak RSS."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


async def fill(url: str, data_mib: int, partitions: int, record_kib: int) -> None:
    value = "v" * (record_kib * 1024)
    per_request = max(1, 8 * MiB // len(value))
    per_partition = data_mib * MiB // len(value) // partitions
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        for p in range(partitions):
            for start in range(0, per_partition, per_request):
                n = min(per_request, per_partition - start)
                r = await http.post("/produce", json={"topic_partitions": [
                    {"topic": TOPIC, "partition": p, "records": [value] * n}]})
                r.raise_for_status()
                assert all(e["ok"] for e in r.json()["results"]), r.text
    print(f"wrote {data_mib} MiB in {partitions} partitions ({record_kib} KiB records) "
          f"in {time.monotonic() - started:.1f} s", flush=True)


class Load:
    def __init__(self) -> None:
        self.bytes = 0
        self.answers = 0
        self.refused = 0


async def catch_up(http: httpx.AsyncClient, partition: int, fetch: int, binary: bool,
                   load: Load) -> None:
    offset = 1
    while True:
        body = {"topic_partitions": [{"topic": TOPIC, "partition": partition,
                                      "fetch_offset": offset}],
                "max_wait_ms": 0, "max_bytes": fetch}
        r = await http.post("/consume", json=body,
                            headers={"accept": wire.CONTENT_TYPE} if binary else {})
        if r.status_code == 503:
            load.refused += 1
            await anyio.sleep(float(r.headers.get("retry-after", "1")))
            continue
        r.raise_for_status()
        load.answers += 1
        load.bytes += len(r.content)
        if binary:
            (answer,) = wire.parse(r.content)
            assert isinstance(answer, wire.Records), answer
            next_offset, hw = answer.next_offset, answer.high_watermark
        else:
            (result,) = r.json()["results"]
            next_offset, hw = result["next_offset"], result["high_watermark"]
        if next_offset > hw:
            return
        offset = next_offset


async def drive(url: str, readers: int, rounds: int, partitions: int, fetch: int,
                fmt: str) -> tuple[Load, float]:
    load = Load()
    started = time.monotonic()
    limits = httpx.Limits(max_connections=readers, max_keepalive_connections=readers)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:

        async def reader(i: int) -> None:
            for _ in range(rounds):
                binary = fmt == "binary" or (fmt == "both" and i % 2 == 1)
                await catch_up(http, i % partitions, fetch, binary=binary, load=load)

        async with anyio.create_task_group() as tg:
            for i in range(readers):
                tg.start_soon(reader, i)
    return load, time.monotonic() - started


async def answer_figures(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        r = await http.get("/metrics/prometheus")
    return {s.name: s.value for f in text_string_to_metric_families(r.text)
            for s in f.samples if s.name.startswith("llog_answer_")}


async def warm(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        for headers in ({}, {"accept": wire.CONTENT_TYPE}):
            r = await http.post("/consume", headers=headers, json={
                "topic_partitions": [{"topic": TOPIC, "partition": 0, "fetch_offset": 1}],
                "max_wait_ms": 0, "max_bytes": 1})
            r.raise_for_status()


def run(stack: LocalStack, args: argparse.Namespace, budget: int, logs: Path,
        fill_data: bool) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**stack.settings_env(), "LLOG_BROKER_ID": f"mem-{port}",
           "LLOG_MAX_ANSWER_BYTES_IN_FLIGHT": str(budget),
           "LLOG_ANSWER_BYTES_WAIT_MS": str(args.wait_ms),
           "LLOG_MAX_FETCH_BYTES": str(max(args.fetch_mib * MiB, 1024)),
           "LLOG_READ_OBJECT_CACHE_BYTES": "0", "LLOG_TAIL_CACHE_MAX_BYTES": "0",
           # No compaction in this process: it would start on the data written here
           # while the readers run, and its own buffers are not answers.
           "LLOG_ROLES": "write,read",
           "LLOG_DRAIN_S": "0"}
    proc = broker_process(env["LLOG_BROKER_ID"], port, env, logs / f"broker-{port}.log")
    proc.start()
    try:
        wait_healthy(proc, url)
        if fill_data:
            anyio.run(fill, url, args.data_mib, args.partitions, args.record_kib)
        anyio.run(warm, url)
        with RssSampler(proc.pid) as sampler:
            idle = sampler.rss()
            load, took = anyio.run(drive, url, args.readers, args.rounds, args.partitions,
                                   args.fetch_mib * MiB, args.format)
        peak = max(sampler.peak, vm_hwm(proc.pid))
        figures = anyio.run(answer_figures, url)
    finally:
        proc.stop()
    label = "unbounded" if budget == UNBOUNDED else f"budget {budget / MiB:.0f} MiB"
    bound = idle + (0 if budget == UNBOUNDED else budget) + args.overhead_mib * MiB
    print(f"\n{label}: {args.readers} readers x {args.rounds} catch-ups of "
          f"{args.data_mib // args.partitions} MiB, {args.fetch_mib} MiB per read, "
          f"{args.format} answers")
    print(f"  {load.answers} answers, {load.bytes / MiB:.0f} MiB in {took:.1f} s; "
          f"{load.refused} refused (503) and retried")
    held = figures.get("llog_answer_peak_bytes_in_flight", 0) / MiB
    print(f"  answers in flight: peak {held:.1f} MiB held, refusals "
          f"{figures.get('llog_answer_refused_total', 0):.0f}")
    print(f"  broker RSS: idle {idle / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB "
          f"(grew {(peak - idle) / MiB:.0f} MiB)")
    if budget != UNBOUNDED:
        verdict = "within" if peak <= bound else "OVER"
        print(f"  bound: idle + budget + overhead = {idle / MiB:.0f} + {budget / MiB:.0f} + "
              f"{args.overhead_mib} = {bound / MiB:.0f} MiB: peak {verdict} the bound")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fetch-mib", type=int, default=32)
    parser.add_argument("--data-mib", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--record-kib", type=int, default=64)
    parser.add_argument("--wait-ms", type=int, default=5000,
                        help="LLOG_ANSWER_BYTES_WAIT_MS: a read's wait for room, then 503")
    parser.add_argument("--format", choices=("both", "binary", "json"), default="both",
                        help="the readers' answers: half of each, or all of one")
    parser.add_argument("--overhead-mib", type=int, default=128)
    parser.add_argument("--unbounded", action="store_true",
                        help="also run the same load with no budget, for comparison")
    args: Any = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalStack(StackConfig.ephemeral(
            Path(tmp), root_prefix=f"bench-{uuid.uuid4().hex[:8]}")) as stack:
        run(stack, args, args.budget_mib * MiB, Path(tmp), fill_data=True)
        if args.unbounded:
            run(stack, args, UNBOUNDED, Path(tmp), fill_data=False)


if __name__ == "__main__":
    main()
