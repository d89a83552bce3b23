"""What an S3 request costs the broker's process, by transport, at the sizes it sends.

The store (app/stores/s3/store.py) can send its data path's requests two ways: through
aiobotocore, or (``LLOG_S3_LEAN_REQUESTS``, the default) signed by
``app/stores/s3/sigv4.py`` over ``app/stores/s3/wire.py``, uploads and GETs alike.
This measures both through ``S3Store`` against one MinIO of
the project's local stack, in one run, alternating which goes first from round to
round: requests/s and the process's CPU per request (user and system, every thread; of
it, user alone), at the sizes and concurrency the broker sends:

- ``put``: a WAL object (``LLOG_BATCH_MAX_BYTES`` is 4 MiB; a flush under lighter load
  is smaller), ``S3Store.put``, ``--put-concurrency`` at a time (a broker has at most
  ``LLOG_BATCH_MAX_INFLIGHT``, 4, flushes in flight, and one while they are small);
- ``get whole``: a WAL object read whole for the slices of several partitions
  (``S3Store.get_head_buffer`` up to ``LLOG_READ_WAL_OBJECT_MAX_BYTES``, 4 MiB);
- ``get range``: a WAL slice of one partition, or a compacted chunk
  (``LLOG_COMPACTION_CHUNK_BYTES``, 1 MiB), ``S3Store.get_range_buffer`` at random
  offsets of a 4 MiB object;
- ``get cut``: a compacted range of 4 chunks of 1 MiB, each read into a buffer of its
  own (``S3Store.get_range_cut``), as a 4 MiB catch-up answer reads it;

GETs ``--concurrency`` at a time. Each row runs a third way too: the lean path with
its requests signed by botocore's ``S3SigV4Auth`` instead (what the project's own
signer saves per request). Then signing alone, without the network, CPU per signature.

    .venv/bin/python bench/s3_transports.py [--rounds 3] [--concurrency 8]
        [--put-concurrency 1,4] [--mib 64]

Each row sends ``--mib`` MiB (at least 48, at most 800 requests). The table gives the
median of the rounds (and their range) and each transport's CPU per request against
aiobotocore's. On loopback the kernel's work for both ends of a connection is partly
charged to whichever process is sending at the time, so the system share moves from run
to run more than the user share. It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import uvloop  # noqa: E402

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.stores.metrics import StoreMetrics  # noqa: E402
from app.stores.s3.store import S3Store  # noqa: E402

KIB, MIB = 1024, 1024 * 1024
WHOLE_MAX = 4 * MIB  # LLOG_READ_WAL_OBJECT_MAX_BYTES: a WAL object's read asks for this
CHUNK = 1 * MIB  # LLOG_COMPACTION_CHUNK_BYTES
SOURCE = "bench/s3-transports/source-4m"
SIGNED_BY_BOTOCORE = ", botocore's signer"


@dataclass(frozen=True)
class Row:
    op: str
    size: int
    transport: str  # what the store's lean path sends it through
    concurrency: int

    @property
    def label(self) -> str:
        size = f"{self.size // MIB} MiB" if self.size >= MIB else f"{self.size // KIB} KiB"
        return f"{self.op} {size}"


def rows(put_concurrency: list[int], concurrency: int) -> list[Row]:
    puts = [Row("put", size, "wire", c) for c in put_concurrency
            for size in (1 * MIB, 4 * MIB)]
    gets = [Row("get whole", 1 * MIB, "wire", concurrency),
            Row("get whole", 4 * MIB, "wire", concurrency),
            Row("get range", 4 * KIB, "wire", concurrency),
            Row("get range", 64 * KIB, "wire", concurrency),
            Row("get range", 1 * MIB, "wire", concurrency),
            Row("get cut 4x", 1 * MIB, "wire", concurrency)]
    return puts + gets


def _requests(row: Row, mib: int) -> int:
    total = row.size * (4 if row.op.startswith("get cut") else 1)
    return max(48, min(800, mib * MIB // total))


def _operation(s3: S3Store, row: Row, name: str, rng: random.Random
               ) -> Callable[[int], Awaitable[Any]]:
    """One request of ``row`` by worker ``w``."""
    if row.op == "put":
        body = os.urandom(row.size)
        return lambda w: s3.put(f"bench/s3-transports/put/{name}/{w}", body)
    if row.op == "get whole":
        key = f"bench/s3-transports/whole-{row.size}"
        return lambda w: s3.get_head_buffer(key, WHOLE_MAX)
    if row.op == "get range":
        slots = WHOLE_MAX // row.size
        return lambda w: s3.get_range_buffer(SOURCE, rng.randrange(slots) * row.size,
                                             row.size)
    spans = [(i * row.size, (i + 1) * row.size) for i in range(4)]
    return lambda w: s3.get_range_cut(SOURCE, 0, spans)


class BotocoreSigner:
    """What the lean path's signer does, done by botocore's ``S3SigV4Auth`` on an
    ``AWSRequest`` (the lean path signed so before ``app/stores/s3/sigv4.py``): the same
    headers, byte for byte (``tests/test_sigv4.py``)."""

    def __init__(self, settings: Settings) -> None:
        from botocore.config import Config
        from botocore.credentials import Credentials

        from app.stores.s3.sigv4 import host_of

        assert settings.s3_endpoint is not None
        assert settings.s3_access_key is not None and settings.s3_secret_key is not None
        self.host = host_of(settings.s3_endpoint)
        self._origin = settings.s3_endpoint.rstrip("/")
        self._region = settings.s3_region
        self._credentials = Credentials(settings.s3_access_key.get_secret_value(),
                                        settings.s3_secret_key.get_secret_value())
        self._config = Config(s3={"payload_signing_enabled": settings.s3_sign_payload})

    def headers(self, method: str, path: str, headers: dict[str, str],
                body: bytes | None) -> dict[str, str]:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method, self._origin + path, headers=dict(headers), data=body)
        request.context["client_config"] = self._config
        S3SigV4Auth(self._credentials, "s3", self._region).add_auth(request)
        return dict(request.headers.items())


@dataclass(frozen=True)
class Sample:
    rate: float  # requests/s
    cpu_us: float  # CPU (user + system) per request
    user_us: float  # of which user


async def _measure(s3: S3Store, row: Row, name: str, requests: int) -> Sample:
    """One transport on one row: ``requests`` requests, ``row.concurrency`` at a time."""
    one = _operation(s3, row, name, random.Random(7))
    for w in range(row.concurrency):  # the pool's connections open and warm
        await one(w)
    left = requests

    async def worker(w: int) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one(w)

    usage0, cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), \
        time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(row.concurrency):
            tg.start_soon(worker, w)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    user = resource.getrusage(resource.RUSAGE_SELF).ru_utime - usage0.ru_utime
    return Sample(requests / elapsed, cpu / requests * 1e6, user / requests * 1e6)


def _signing(n: int) -> tuple[float, float]:
    """CPU µs per signature of a ranged GET: botocore's signer, the store's own."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.config import Config
    from botocore.credentials import Credentials

    from app.stores.s3.sigv4 import SigV4Signer

    url, path = "http://127.0.0.1:9000/bkt/wal/0001/0000000000000042.wal", \
        "/bkt/wal/0001/0000000000000042.wal"
    credentials = Credentials("AKIDEXAMPLE", "secret")
    config = Config(s3={"payload_signing_enabled": False})

    def botocore() -> None:
        request = AWSRequest("GET", url, headers={"Range": "bytes=0-65535"})
        request.context["client_config"] = config
        S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)

    signer = SigV4Signer("AKIDEXAMPLE", "secret", "us-east-1", "http://127.0.0.1:9000",
                         sign_payload=False)

    def own() -> None:
        signer.headers("GET", path, {"Range": "bytes=0-65535"}, None)

    out = []
    for sign in (botocore, own):
        sign()
        t0 = time.process_time()
        for _ in range(n):
            sign()
        out.append((time.process_time() - t0) / n * 1e6)
    return out[0], out[1]


Results = dict[tuple[Row, str], list[Sample]]


async def _run(settings: Settings, table: list[Row], args: argparse.Namespace) -> Results:
    results: Results = {}
    lean_settings = settings.model_copy(update={"s3_lean_requests": True})
    boto_settings = settings.model_copy(update={"s3_lean_requests": False})
    async with S3Store(lean_settings, StoreMetrics()) as lean, \
            S3Store(lean_settings, StoreMetrics()) as lean_botocore_signer, \
            S3Store(boto_settings, StoreMetrics()) as boto:
        assert lean._lean is not None and lean_botocore_signer._lean is not None
        assert boto._lean is None
        lean_botocore_signer._lean._signer = BotocoreSigner(lean_settings)  # type: ignore[assignment]
        await boto.put(SOURCE, os.urandom(WHOLE_MAX))
        for size in {r.size for r in table if r.op == "get whole"}:
            await boto.put(f"bench/s3-transports/whole-{size}", os.urandom(size))
        for r in range(args.rounds):
            for row in table:
                ways = [("aiobotocore", boto), (row.transport, lean),
                        (f"{row.transport}{SIGNED_BY_BOTOCORE}", lean_botocore_signer)]
                ways = ways[r % 3:] + ways[:r % 3]  # which goes first turns round by round
                for name, store in ways:
                    got = await _measure(store, row, name, _requests(row, args.mib))
                    results.setdefault((row, name), []).append(got)
                    print(f"  round {r + 1} {row.label:>16} x{row.concurrency} {name:>28}: "
                          f"{got.rate:7.1f}/s {got.cpu_us:7.0f} µs CPU per request "
                          f"({got.user_us:.0f} user)", flush=True)
    return results


def _span(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _report(results: Results, table: list[Row], args: argparse.Namespace) -> None:
    print()
    print("| request | at a time | transport | requests | requests/s | CPU µs per request "
          "| of which user | CPU against aiobotocore |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for row in table:
        boto_cpu = statistics.median(s.cpu_us for s in results[(row, "aiobotocore")])
        for name in ("aiobotocore", row.transport, f"{row.transport}{SIGNED_BY_BOTOCORE}"):
            samples = results[(row, name)]
            cpu = statistics.median(s.cpu_us for s in samples)
            against = "" if name == "aiobotocore" else f"{cpu / boto_cpu - 1:+.0%}"
            print(f"| {row.label} | {row.concurrency} | {name} | {_requests(row, args.mib)} "
                  f"| {_span([s.rate for s in samples], '.0f')} "
                  f"| {_span([s.cpu_us for s in samples], ',.0f')} "
                  f"| {statistics.median(s.user_us for s in samples):,.0f} | {against} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8, help="GETs at a time")
    parser.add_argument("--put-concurrency", default="1,4",
                        help="PUTs at a time, comma separated (a broker has at most "
                             "LLOG_BATCH_MAX_INFLIGHT, 4, flushes in flight)")
    parser.add_argument("--mib", type=int, default=64, help="MiB each row sends")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the event loop (the broker runs on uvloop under uvicorn)")
    parser.add_argument("--signatures", type=int, default=5000)
    args = parser.parse_args()
    table = rows([int(c) for c in args.put_concurrency.split(",")], args.concurrency)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="llog-s3-transports-") as tmp:
        stack = LocalStack(StackConfig.ephemeral(Path(tmp)))
        stack.start()
        try:
            os.environ.update(stack.settings_env())
            settings = Settings()
            print(f"S3Store against MinIO on loopback, commit {commit}, {args.loop}, "
                  f"{args.rounds} rounds, load average {os.getloadavg()[0]:.2f}; "
                  f"s3_put_checksum={settings.s3_put_checksum} "
                  f"s3_sign_payload={settings.s3_sign_payload} "
                  f"s3_max_pool_connections={settings.s3_max_pool_connections} "
                  f"s3_max_attempts={settings.s3_max_attempts}; CPU = this process, "
                  "user + system, every thread", flush=True)
            run = uvloop.run if args.loop == "uvloop" else asyncio.run
            results = run(_run(settings, table, args))
        finally:
            stack.stop()
    _report(results, table, args)
    botocore, own = _signing(args.signatures)
    print(f"\nsigning a ranged GET, {args.signatures} times: botocore's S3SigV4Auth "
          f"{botocore:.0f} µs, app/stores/s3/sigv4.py {own:.0f} µs CPU per signature")


if __name__ == "__main__":
    main()
