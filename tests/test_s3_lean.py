"""The lean S3 path (GET, ranged GET, PUT without botocore's pipeline): on the real MinIO
it reads and writes what botocore does and answers missing objects and bad ranges the
same way; against a scripted server, it retries what botocore's standard mode retries
and nothing else, and signs every request."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import crc32c
import pytest
from aiohttp import web

from app.errors import ObjectMissing, StorageUnavailable
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.stores.metrics import StoreMetrics
from app.stores.s3 import lean as s3_lean
from app.stores.s3.lean import LeanS3, S3Status
from app.stores.s3.store import S3Store
from tests.helpers.stack import make_settings


def _count(metrics: StoreMetrics, op: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "llog_s3_requests_total", {"op": op, "outcome": outcome})
    return value or 0.0


async def test_lean_and_botocore_read_the_same_objects(stack: LocalStack) -> None:
    body = uuid.uuid4().bytes * 50_000
    metrics = StoreMetrics()
    async with S3Store(make_settings(stack), metrics) as lean, \
            S3Store(make_settings(stack, s3_lean_requests=False), StoreMetrics()) as boto:
        assert lean._lean is not None and boto._lean is None
        written_lean, written_boto = f"t/{uuid.uuid4().hex}", f"t/{uuid.uuid4().hex}"
        await lean.put(written_lean, body)
        await boto.put(written_boto, body)
        for key in (written_lean, written_boto):
            for store in (lean, boto):
                assert await store.get(key) == body
                assert await store.get_range(key, 12_345, 6_789) == body[12_345:19_134]
                spans = [(0, 100), (100, 300_000), (300_010, 700_000), (700_000, 700_000)]
                cuts = await store.get_range_cut(key, 5, spans)
                assert cuts == [body[5 + a:5 + b] for a, b in spans]
                # Each span in a buffer of its own (none a view of the whole range):
                # read into it on the lean path, a copy of botocore's answer otherwise.
                own = bytearray if store is lean else bytes
                assert all(type(c) is own for c in cuts)
        assert _count(metrics, "put", "ok") == 1
        assert _count(metrics, "range_get", "ok") == 4


async def test_missing_objects_and_bad_ranges_are_object_missing(stack: LocalStack) -> None:
    metrics = StoreMetrics()
    async with S3Store(make_settings(stack), metrics) as s3:
        key = f"t/{uuid.uuid4().hex}"
        with pytest.raises(ObjectMissing, match="does not exist"):
            await s3.get(key)
        await s3.put(key, b"short")
        with pytest.raises(ObjectMissing, match="outside the object"):
            await s3.get_range(key, 100, 10)
        with pytest.raises(ObjectMissing, match="returned 5 bytes"):
            await s3.get_range(key, 0, 10)
        with pytest.raises(ObjectMissing, match="returned 4 bytes"):
            await s3.get_range_cut(key, 1, [(0, 2), (2, 10)])
        assert _count(metrics, "get", "missing") == 1
        assert _count(metrics, "range_get", "missing") == 1
        assert _count(metrics, "range_get", "ok") == 2  # a short answer is not missing


async def test_a_wrong_secret_is_refused_once_not_retried(stack: LocalStack) -> None:
    metrics = StoreMetrics()
    settings = make_settings(stack, s3_secret_key="not-the-secret-key", s3_max_attempts=5)
    async with S3Store(settings, metrics) as s3:
        with pytest.raises(StorageUnavailable, match="403 SignatureDoesNotMatch"):
            await s3.get(f"t/{uuid.uuid4().hex}")
        assert _count(metrics, "get", "error") == 1


def test_the_lean_path_needs_an_endpoint_and_static_keys() -> None:
    keys = {"s3_access_key": "k", "s3_secret_key": "s"}
    assert s3_lean.usable(Settings(s3_endpoint="http://s3.local", **keys))
    assert not s3_lean.usable(Settings(s3_endpoint=None, **keys))
    assert not s3_lean.usable(Settings(s3_endpoint="http://s3.local"))
    assert not s3_lean.usable(Settings(s3_endpoint="http://s3.local",
                                       s3_lean_requests=False, **keys))


# -- against a scripted server --------------------------------------------------------

@asynccontextmanager
async def _serving(answers: list[web.Response], seen: list[web.Request],
                   bodies: list[bytes]) -> AsyncIterator[str]:
    """A server that gives ``answers`` in turn (the last one forever)."""

    async def handle(request: web.Request) -> web.Response:
        seen.append(request)
        bodies.append(await request.read())
        answer = answers[min(len(seen), len(answers)) - 1]
        return web.Response(status=answer.status, body=answer.body)  # one use each

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _error(status: int, code: str) -> web.Response:
    return web.Response(status=status, body=f"<Error><Code>{code}</Code></Error>".encode())


def _settings(endpoint: str, **overrides: object) -> Settings:
    values: dict[str, object] = {"s3_endpoint": endpoint, "s3_bucket": "bkt",
                                 "s3_access_key": "AKIDEXAMPLE", "s3_secret_key": "secret"}
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


async def test_throttling_and_5xx_are_retried_until_an_answer() -> None:
    seen: list[web.Request] = []
    answers = [_error(503, "SlowDown"), _error(500, "InternalError"),
               web.Response(status=206, body=b"the bytes")]
    async with _serving(answers, seen, []) as url, \
            LeanS3(_settings(url), backoff_s=0.001) as lean:
        assert await lean.get("wal/a b", "bytes=0-8") == b"the bytes"
    assert len(seen) == 3
    assert seen[-1].raw_path == "/bkt/wal/a%20b"
    assert seen[-1].headers["Range"] == "bytes=0-8"
    assert seen[-1].headers["Authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert seen[-1].headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"


async def test_retries_stop_at_max_attempts() -> None:
    seen: list[web.Request] = []
    async with _serving([_error(503, "SlowDown")], seen, []) as url, \
            LeanS3(_settings(url, s3_max_attempts=3), backoff_s=0.001) as lean:
        with pytest.raises(S3Status) as raised:
            await lean.get("k", None)
    assert (raised.value.status, raised.value.code) == (503, "SlowDown")
    assert len(seen) == 3


@pytest.mark.parametrize(("status", "code"), [(403, "AccessDenied"), (404, "NoSuchKey"),
                                              (416, "InvalidRange"), (400, "BadDigest")])
async def test_other_answers_are_final(status: int, code: str) -> None:
    seen: list[web.Request] = []
    async with _serving([_error(status, code)], seen, []) as url, \
            LeanS3(_settings(url), backoff_s=0.001) as lean:
        with pytest.raises(S3Status) as raised:
            await lean.get("k", None)
    assert (raised.value.status, raised.value.code) == (status, code)
    assert len(seen) == 1


async def test_a_put_sends_its_body_and_checksum_once_per_attempt() -> None:
    seen: list[web.Request] = []
    bodies: list[bytes] = []
    body = b"x" * 100_000
    checksum = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
    async with _serving([_error(503, "SlowDown"), web.Response(status=200)], seen,
                        bodies) as url, LeanS3(_settings(url), backoff_s=0.001) as lean:
        await lean.put("wal/obj", body, checksum)
    assert bodies == [body, body]
    assert all(r.method == "PUT" and r.headers["x-amz-checksum-crc32c"] == checksum
               for r in seen)


async def test_a_put_to_a_store_that_never_answers_100_continue_is_not_held() -> None:
    """HTTP lets a server read a body without sending ``100 Continue``; a PUT that
    waited for one (aiohttp's wait has no bound) would hold its flush for good. The
    body goes at once, and the store's answer ends the PUT."""
    expected: list[str] = []

    async def store(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        expected.append(head)
        length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
        await reader.readexactly(length)  # never a 100: the body is read as it comes
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(store, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with LeanS3(_settings(f"http://127.0.0.1:{port}",
                                    s3_request_timeout_s=30)) as lean:
            with anyio.fail_after(10):
                await lean.put("wal/obj", b"x" * 100_000, None)
    finally:
        server.close()
    assert len(expected) == 1 and "expect:" not in expected[0]


async def test_a_put_never_waits_behind_reads_for_a_connection() -> None:
    """Uploads have a pool of their own: with every GET connection taken by reads the
    store is slow to answer, a flush's PUT still goes at once."""
    release, reading = asyncio.Event(), asyncio.Event()

    async def store(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            if head.startswith("get"):
                reading.set()
                await release.wait()  # a read that takes its time
                return
            length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(store, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with LeanS3(_settings(f"http://127.0.0.1:{port}",
                                    s3_max_pool_connections=1)) as lean, \
                anyio.create_task_group() as tg:
            tg.start_soon(lean.get, "wal/read", None)  # holds the one GET connection
            with anyio.fail_after(10):
                await reading.wait()
                await lean.put("wal/obj", [b"x" * 1000, memoryview(b"y" * 1000)], None)
            tg.cancel_scope.cancel()
    finally:
        release.set()
        server.close()


async def test_a_refused_connection_is_retried_then_raised() -> None:
    async with _serving([web.Response()], [], []) as url:
        pass  # the server is gone: its port refuses connections
    async with LeanS3(_settings(url, s3_max_attempts=2), backoff_s=0.001) as lean:
        with pytest.raises(OSError):  # aiohttp's ClientConnectorError is an OSError
            await lean.get("k", None)
