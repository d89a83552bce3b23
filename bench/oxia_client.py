"""What an Oxia call costs the broker's process: the ``oxia`` package against grpc.aio.

The broker calls Oxia through the ``oxia`` package: a synchronous gRPC client with a
pure-Python protobuf runtime, run in worker threads (app/stores/oxia/store.py). The
alternative is an asyncio client on ``grpc.aio`` with the C protobuf runtime. This
measures both on one Oxia server in one run: single-put writes, ``--concurrency`` at a
time, writes/s and the client process's CPU per write (threads included), which is
what a broker pays per commit, get or index scan besides the server's round trip. Then
the broker's own store (``OxiaStore.put_group``, a flush's commits of 4 partitions in
one request) with its writes through the package and on the event loop.

The grpc.aio side needs stubs compiled from Oxia's own ``client.proto`` (taken from
the Go module the server is built from) with ``grpcio-tools``, which is not a project
dependency: ``.venv/bin/pip install grpcio-tools``.

    .venv/bin/python bench/oxia_client.py [--writes 3000] [--concurrency 16] [--rounds 2]

It measures and prints; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.stores.oxia import patches as oxia_patches  # noqa: E402

VALUE = b"x" * 200
GROUP = 4  # partitions committed by one flush in the store rows
OXIA_MODULE = "github.com/oxia-db/oxia"


def oxia_proto() -> Path:
    """``client.proto`` of the Oxia version deploy/servers/oxia/go.mod pins."""
    gomod = (ROOT / "deploy" / "servers" / "oxia" / "go.mod").read_text()
    version = next(line.split()[-1] for line in gomod.splitlines() if OXIA_MODULE in line)
    cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True,
                           check=True).stdout.strip()
    path = Path(cache) / f"{OXIA_MODULE}@{version}" / "proto" / "client.proto"
    if not path.exists():
        raise SystemExit(f"{path} is missing: build the servers first (scripts/test)")
    return path


def compile_stubs(out: Path) -> tuple[ModuleType, ModuleType]:
    try:
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit("grpcio-tools is needed: .venv/bin/pip install grpcio-tools") from None
    proto = oxia_proto()
    (out / "client.proto").write_bytes(proto.read_bytes())
    if protoc.main(["protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                    str(out / "client.proto")]) != 0:
        raise SystemExit("protoc failed")
    sys.path.insert(0, str(out))
    return importlib.import_module("client_pb2"), importlib.import_module("client_pb2_grpc")


async def _timed(writes: int, concurrency: int, write: Callable[[str], Awaitable[None]]
                 ) -> dict[str, float]:
    left = [writes]

    async def worker(w: int) -> None:
        while left[0] > 0:
            left[0] -= 1
            await write(f"/bench/{w}/{left[0]}")

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    return {"writes_per_s": writes / wall, "cpu_us_per_write": cpu / writes * 1e6}


async def through_package(address: str, writes: int, concurrency: int) -> dict[str, float]:
    client = oxia_patches.connect(address, request_timeout_s=10)
    limiter = anyio.CapacityLimiter(concurrency)

    async def write(key: str) -> None:
        await anyio.to_thread.run_sync(
            functools.partial(client.put, key, VALUE, partition_key="bench"), limiter=limiter)

    try:
        return await _timed(writes, concurrency, write)
    finally:
        client.close()


async def through_grpc_aio(address: str, writes: int, concurrency: int, pb: Any, pbg: Any
                           ) -> dict[str, float]:
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = pbg.OxiaClientStub(channel)

        async def write(key: str) -> None:
            # One shard (the stack's standalone server): shard 0.
            answer = await stub.Write(pb.WriteRequest(shard=0, puts=[pb.PutRequest(
                key=key, value=VALUE, partition_key="bench")]), timeout=10)
            if answer.puts[0].status != 0:
                raise RuntimeError(f"write refused: {answer}")

        return await _timed(writes, concurrency, write)


async def through_grpc_aio_betterproto(address: str, writes: int, concurrency: int
                                       ) -> dict[str, float]:
    """grpc.aio with the ``oxia`` package's own (pure-Python) messages: no stubs to build."""
    import grpc
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary("/io.streamnative.oxia.proto.OxiaClient/Write",
                                   request_serializer=pb.WriteRequest.SerializeToString,
                                   response_deserializer=pb.WriteResponse.FromString)

        async def write(key: str) -> None:
            answer = await call(pb.WriteRequest(shard=0, puts=[pb.PutRequest(
                key=key, value=VALUE, partition_key="bench")]), timeout=10)
            if answer.puts[0].status != pb.Status.OK:
                raise RuntimeError(f"write refused: {answer}")

        return await _timed(writes, concurrency, write)


async def through_store(address: str, writes: int, concurrency: int, *, on_loop: bool
                        ) -> dict[str, float]:
    """The broker's own path: ``OxiaStore.put_group`` of a flush's commits (``GROUP``
    partitions of one topic), through the package in worker threads or on the loop
    (app/stores/oxia/writes.py). A row's "write" is one group."""
    from app.settings import Settings
    from app.stores.metrics import StoreMetrics
    from app.stores.oxia.store import OxiaStore, PutSpec

    settings = Settings(oxia_address=address, oxia_event_loop_writes=on_loop)
    async with OxiaStore(settings.oxia, StoreMetrics()) as store:
        async def write(key: str) -> None:
            outcomes = await store.put_group([PutSpec(f"{key}/{p}", VALUE, f"bench:{p}")
                                              for p in range(GROUP)])
            if any(isinstance(o, Exception) for o in outcomes):
                raise RuntimeError(f"write refused: {outcomes}")

        return await _timed(writes, concurrency, write)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2, help="each client this many times")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llog-oxia-client-") as tmp:
        pb, pbg = compile_stubs(Path(tmp))
        stack = LocalStack(StackConfig.ephemeral(Path(tmp) / "stack", oxia_shards=1))
        stack.start()
        try:
            address = stack.oxia_address
            print(f"single-put Oxia writes, {args.writes} per row, {args.concurrency} at a "
                  "time, one Oxia server on loopback; CPU = this process, threads included")
            for _ in range(args.rounds):
                for name, run in (
                        ("oxia package, worker threads",
                         through_package(address, args.writes, args.concurrency)),
                        ("grpc.aio, C protobuf",
                         through_grpc_aio(address, args.writes, args.concurrency, pb, pbg)),
                        ("grpc.aio, the package's messages",
                         through_grpc_aio_betterproto(address, args.writes,
                                                      args.concurrency)),
                        (f"store, {GROUP} puts a group, package",
                         through_store(address, args.writes, args.concurrency, on_loop=False)),
                        (f"store, {GROUP} puts a group, loop",
                         through_store(address, args.writes, args.concurrency, on_loop=True))):
                    row = asyncio.run(run)
                    print(f"  {name:30s} {row['writes_per_s']:8,.0f} writes/s "
                          f"{row['cpu_us_per_write']:7,.0f} us CPU per write")
        finally:
            stack.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
