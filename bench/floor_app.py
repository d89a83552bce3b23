"""The least a produce can cost in Python on this stack: the ceiling's HTTP work plus the
storage steps every acknowledged write needs, and nothing else.

bench/ceiling_app.py measures the HTTP layer alone (parse, walk every record, answer).
A broker must also make the records durable before it answers. This app does exactly
that much, with the broker's own fastest pieces and none of its checks or bookkeeping:

- ``POST /produce`` parses the JSON body as the ceiling does, encodes each partition's
  values as one bytes-batch-v3 body (``columnar.encode_values``, as the broker does) and
  waits for its flush; a binary body (LLP1) is parsed as the ceiling parses it, and each
  entry's bytes-batch-v3 body goes into the blob as it came;
- a flush takes the requests of one batch window (``--window-ms``; ``--max-inflight``
  flushes at once, one by default as the broker has one flush of a batch in flight:
  requests that come meanwhile wait for the next), packs their bodies into one shared
  blob as its parts (``codec.pack_shared_parts``, with its CRC32Cs: the bodies are not
  copied), PUTs it through the broker's S3 client for the data path
  (``app/stores/s3/lean.py``, the parts written as they are, with the upload's CRC32C
  for the store to verify), writes one Oxia key per partition in one Write request
  (``OxiaStore.put_group``: blind puts, no compare-and-set), and answers every waiter.

and for a consumer catching up through compacted data:

- ``POST /consume`` with ``Accept: application/vnd.llog.records`` answers ``max_bytes``
  of ``--record-bytes`` records as one stored bytes-batch-v3 body: one GET per answer
  from objects it writes at start for answers of ``--fetch-bytes`` (eight of them, read
  in turn; another size is written at its first request), the next
  answer's GET started while this one is sent (as the broker's read-ahead does), and the
  answer sent as its parts.

No validation beyond the parse, no idempotency, no compare-and-set, no tail cache, no
metrics, no middleware. It is not a log (a crash between the PUT and the put loses the
offsets it made up); it is the floor against which the broker's own cost is measured.
It reads its storage settings from the ``LLOG_*`` environment like the broker.

    LLOG_... .venv/bin/python bench/floor_app.py --port 8098 [--window-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import Response  # noqa: E402

from app.settings import Settings  # noqa: E402
from app.storage import codec, columnar  # noqa: E402
from app.stores.metrics import StoreMetrics  # noqa: E402
from app.stores.oxia.store import OxiaStore, PutSpec  # noqa: E402
from app.stores.s3.store import S3Store  # noqa: E402
from app.wire import produce as llp1  # noqa: E402
from app.wire import records as llr1  # noqa: E402


@dataclass
class _Waiter:
    topic: str
    partition: int
    body: bytes | memoryview
    count: int
    future: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class _Flusher:
    """Batch windows and flushes: the broker's batching with nothing around it."""

    def __init__(self, s3: S3Store, oxia: OxiaStore, window_s: float, max_inflight: int
                 ) -> None:
        self._s3, self._oxia = s3, oxia
        self._window_s = window_s
        self._slots = anyio.Semaphore(max_inflight)
        self._queue: list[_Waiter] = []
        self._arrived = asyncio.Event()
        self._end_offsets: dict[tuple[str, int], int] = {}

    def submit(self, waiters: list[_Waiter]) -> None:
        self._queue.extend(waiters)
        self._arrived.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                await self._arrived.wait()
                await anyio.sleep(self._window_s)
                await self._slots.acquire()
                batch, self._queue = self._queue, []
                self._arrived.clear()
                tg.start_soon(self._flush, batch)

    async def _flush(self, batch: list[_Waiter]) -> None:
        try:
            bodies = [codec.SliceBody(w.topic, w.partition, [w.body], columnar.ENCODING_V3,
                                     w.count) for w in batch]
            parts, _ = codec.pack_shared_parts(bodies, 0)
            await self._s3.put(f"floor/{uuid.uuid4().hex}", parts)
            puts, ends = {}, []
            for w in batch:
                tp = (w.topic, w.partition)
                end = self._end_offsets.get(tp, 0) + w.count
                self._end_offsets[tp] = end
                ends.append(end)  # each waiter's own last offset
                puts[tp] = PutSpec(f"floor/{w.topic}/{w.partition}", b"%d" % end,
                                   f"{w.topic}/{w.partition}")
            outcomes = await self._oxia.put_group(list(puts.values()))
            failed = next((o for o in outcomes if isinstance(o, Exception)), None)
            for w, end in zip(batch, ends, strict=True):
                if failed is not None:
                    w.future.set_exception(failed)
                else:
                    w.future.set_result(end)
        except Exception as exc:
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(exc)
        finally:
            self._slots.release()


class _Chunks:
    """Answers of ``count`` records read back from S3, one GET each, one fetched ahead."""

    OBJECTS = 8

    def __init__(self, s3: S3Store, record_bytes: int) -> None:
        self._s3 = s3
        self._record_bytes = record_bytes
        self._stored: set[int] = set()
        self._storing = anyio.Lock()
        self._ahead: dict[tuple[int, int], asyncio.Task[bytes]] = {}

    async def answer(self, offset: int, count: int) -> bytes:
        await self.store(count)
        task = self._ahead.pop((count, offset), None)
        body = await task if task is not None else await self._get(count, offset)
        for stale in self._ahead.values():
            stale.cancel()
        self._ahead = {(count, offset + count): asyncio.ensure_future(
            self._get(count, offset + count))}
        return body

    def _key(self, count: int, offset: int) -> str:
        return f"floor/chunks-{count}/{(offset - 1) // count % self.OBJECTS}"

    async def _get(self, count: int, offset: int) -> bytes:
        return await self._s3.get(self._key(count, offset))

    async def store(self, count: int) -> None:
        async with self._storing:
            if count in self._stored:
                return
            value = b"x" * self._record_bytes
            body = columnar.encode_values([value] * count)[0]
            for i in range(self.OBJECTS):
                await self._s3.put(self._key(count, 1 + i * count), body)
            self._stored.add(count)


class _PartsResponse(Response):
    """An answer sent as its parts, as the broker sends one (no copy into one buffer)."""

    def __init__(self, parts: list[bytes], media_type: str) -> None:
        super().__init__(b"", media_type=media_type)
        self.headers["content-length"] = str(sum(map(len, parts)))
        self._parts = parts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        for i, part in enumerate(self._parts):
            await send({"type": "http.response.body", "body": part,
                        "more_body": i < len(self._parts) - 1})


def _parse_binary(body: bytes) -> list[_Waiter]:
    return [_Waiter(e.topic, e.partition or 0, e.records.body, e.records.n_records)
            for e in llp1.parse(body, max_entries=100_000)]


def _parse(body: bytes) -> list[_Waiter]:
    """The ceiling's walk, with each partition's values kept as one v3 body."""
    waiters = []
    for entry in orjson.loads(body)["topic_partitions"]:
        values = [r.encode() if isinstance(r, str) else bytes(r) for r in entry["records"]]
        encoded, _ = columnar.encode_values(values)
        waiters.append(_Waiter(entry["topic"], entry.get("partition") or 0, encoded,
                               len(values)))
    return waiters


def create_app(settings: Settings, window_s: float, max_inflight: int,
               record_bytes: int, fetch_bytes: int) -> FastAPI:
    flusher: list[_Flusher] = []
    chunks: list[_Chunks] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        metrics = StoreMetrics()
        async with AsyncExitStack() as stack:
            s3 = await stack.enter_async_context(S3Store(settings.s3, metrics))
            oxia = await stack.enter_async_context(
                OxiaStore(settings.oxia, metrics, identity=settings.broker_id))
            flusher.append(_Flusher(s3, oxia, window_s, max_inflight))
            chunks.append(_Chunks(s3, record_bytes))
            await chunks[0].store(max(1, fetch_bytes // record_bytes))
            async with anyio.create_task_group() as tg:
                tg.start_soon(flusher[0].run)
                yield
                tg.cancel_scope.cancel()

    app = FastAPI(title="llog produce floor", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/produce")
    async def produce(request: Request) -> Response:
        binary = request.headers.get("content-type", "").startswith(llp1.CONTENT_TYPE)
        body = await request.body()
        waiters = _parse_binary(body) if binary else _parse(body)
        flusher[0].submit(waiters)
        results = []
        for w in waiters:
            end = await w.future
            results.append({"topic": w.topic, "partition": w.partition, "ok": True,
                            "start_offset": end - w.count + 1, "end_offset": end,
                            "count": w.count, "bytes": len(w.body)})
        return Response(orjson.dumps({"results": results, "success_count": len(results),
                                      "error_count": 0}), media_type="application/json")

    @app.post("/consume")
    async def consume(request: Request) -> Response:
        if not llr1.wants_binary(request.headers.get("accept", "")):
            return Response(b'{"detail":"the floor answers binary consumes only"}', 406,
                            media_type="application/json")
        ask = orjson.loads(await request.body())
        entry = ask["topic_partitions"][0]
        offset = int(entry["fetch_offset"])
        count = max(1, int(ask.get("max_bytes", 4 << 20)) // record_bytes)
        body = await chunks[0].answer(offset, count)
        topic = entry["topic"].encode()
        head = b"".join([b"LLR1", struct.pack(">IH", 1, len(topic)), topic,
                         struct.pack(">IBqqqqBI", int(entry["partition"]), 1, 2**62, 1,
                                     offset + count, offset, 3, len(body))])
        return _PartsResponse([head, body], llr1.CONTENT_TYPE)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8098)
    parser.add_argument("--window-ms", type=float, default=5.0)
    parser.add_argument("--max-inflight", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=1024,
                        help="size of the records /consume answers with")
    parser.add_argument("--fetch-bytes", type=int, default=8 << 20,
                        help="the max_bytes of the consumes to expect (their objects are "
                             "written at start)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()

    import uvicorn

    app = create_app(Settings(), args.window_ms / 1000, args.max_inflight,
                     args.record_bytes, args.fetch_bytes)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                lifespan="on", timeout_graceful_shutdown=5)


if __name__ == "__main__":
    main()
