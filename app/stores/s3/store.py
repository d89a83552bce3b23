"""Asynchronous S3 access: one aiobotocore client and connection pool per process, and
for the data path's GETs, ranged GETs and PUTs, transports of the broker's own.

Which request goes which way. Listing, HEAD, DELETE and conditional creates always go
through aiobotocore. GETs, ranged GETs and the PUTs of WAL objects go over
``app/stores/s3/wire.py`` (connections whose GET bodies the kernel reads straight into
the buffers that keep them, and whose PUT bodies are written from their parts without
being joined), signed by ``app/stores/s3/sigv4.py`` (``app/stores/s3/lean.py``): when
``LLOG_S3_LEAN_REQUESTS`` is on (the default), the endpoint is set and the keys are
static. Otherwise (credentials from botocore's chain, an instance role) everything goes
through aiobotocore.

Why three transports and a signer of its own, measured (``bench/s3_transports.py``, 3
rounds alternating, the median; this process's CPU per request, user and system,
against MinIO on loopback, two shared cores, uvloop, GETs 8 at a time; aiobotocore ->
the own transport):

- ranged GET 4 KiB 1,681 -> 307 µs (-82%), 64 KiB 1,903 -> 268 (-86%), 1 MiB 2,361 ->
  573 (-76%); a WAL object read whole, 1 MiB 2,568 -> 602 (-77%), 4 MiB 8,216 -> 3,032
  (-63%); a compacted range of 4 chunks of 1 MiB, each in a buffer of its own, 6,551 ->
  2,711 (-59%). Requests/s rose 1.3-2x with them.
- PUT of a WAL object, one at a time: 1 MiB 1,938 -> 1,005 µs (-48%), 4 MiB 3,546 ->
  2,097 (-41%); 4 at a time (``LLOG_BATCH_MAX_INFLIGHT``): 2,262 -> 935 (-59%), 3,503
  -> 2,058 (-41%).
- Signing: the same GETs and PUTs signed by botocore's ``S3SigV4Auth`` instead cost
  457-461 µs for ranged GETs of 4-64 KiB (1.5-1.7 times 268-307) and 1,091-1,122
  for 1 MiB PUTs (12-17% more); from 1 MiB GETs and 4 MiB PUTs on, the difference is
  within the noise. A signature alone: 125 µs against 14.

A transport is kept when it saves at least a fifth of the CPU per request against
aiobotocore at every size the broker sends; each saves 41-86%, because botocore builds
every request through its event hooks, parameter validation, endpoint rules,
serialisers and response parsers (1-1.6 ms a request here whatever its size), and
aiohttp under it receives a body in new ``bytes`` of up to 256 KiB, copied then joined.
The signer is kept for the third or more of a small GET's CPU it saves on top. What
they cost to keep: retries as botocore's standard mode makes them (``lean.py``), as
much HTTP/1.1 as reading S3 objects needs (``wire.py``, held by
``tests/test_s3_wire.py``) and signatures equal to botocore's byte for byte
(``tests/test_sigv4.py``).

Uploads send their body at once, without ``Expect: 100-continue``. Waiting for the
store's ``100 Continue`` before the body, as botocore does, measured 2,058 µs for a 4 MiB
PUT, 4 at a time, against 4,059 without it in the run before (the body otherwise fills
socket buffers MinIO is not yet draining); but a store or proxy that never answers 100
would hold a flush for as long as the wait lasts. The body goes at once: through
aiohttp that saved 52-54% at 1 MiB and 25% at 4 MiB one at a time (a broker's flushes,
one in flight by default), and cost what aiobotocore's does four 4 MiB PUTs at a time
(+4%, within the noise). Over the own connections (a pool for uploads apart from the
GETs'), with the blob's parts written as they are (``codec.pack_shared_parts``: no
joined copy of the blob on uvloop over plain TCP), a flush's PUT of
1.7 MiB (4 partitions x 17 requests x 25 x 1 KiB) took 0.99-1.10 ms of CPU against
1.34-1.39 through aiohttp with the joined blob (the join included), three rounds
alternating against MinIO on loopback (docs/performance.md, #47's fifth step).

botocore's standard retry mode retries throttling, 5xx and connection errors with
backoff. On top of it, a conditional create that answers 409 (a concurrent conditional
write in flight) is retried here, while 412 (the object exists) is a definite answer.
Every request passes through :meth:`S3Store._request`, the one place that times it,
counts it and turns the clients' exceptions (botocore's, aiohttp's under it, and the
own transports') into the engine's :class:`~app.errors.StorageUnavailable` and
:class:`~app.errors.ObjectMissing`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import random
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import crc32c
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import SecretStr

from app.errors import ObjectMissing, StorageUnavailable
from app.settings import S3Settings
from app.stores.metrics import StoreMetrics
from app.stores.s3 import lean as s3_lean
from app.stores.s3.body import Body, body_parts, body_size
from app.stores.s3.lean import LeanS3, S3Status


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    last_modified_ms: int


def _reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


class _PreconditionFailed(Exception):
    """412: a conditional create found the key (internal to this module)."""


class _ConditionalConflict(Exception):
    """409: another conditional write to the key is in flight (internal)."""


def _translate(op: str, key: str, exc: BaseException) -> BaseException:
    """The one place where the S3 clients' exceptions become the engine's."""
    where = f"S3 {op} {key}"
    if isinstance(exc, ClientError):
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        code = str(exc.response.get("Error", {}).get("Code", ""))
        return _answered(where, status, code, exc)
    if isinstance(exc, S3Status):  # the lean path's final answers
        return _answered(where, exc.status, exc.code, exc)
    # BotoCoreError: connection, timeout and retry exhaustion. aiohttp's errors (a body
    # cut short is a ClientPayloadError) and timeouts surface while a body streams.
    return StorageUnavailable(f"{where} failed: {type(exc).__name__}: {exc}")


def _answered(where: str, status: int, code: str, exc: BaseException) -> BaseException:
    """The engine's error for an answer the store gave."""
    if status == 412 or code == "PreconditionFailed":
        return _PreconditionFailed()
    if status == 409 and code != "BucketAlreadyExists":
        return _ConditionalConflict()
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectMissing(f"{where}: the object does not exist")
    if code == "InvalidRange" or status == 416:
        return ObjectMissing(f"{where}: the range lies outside the object")
    return StorageUnavailable(f"{where} failed: {exc}")


_CLIENT_ERRORS = (ClientError, BotoCoreError, S3Status, aiohttp.ClientError,
                  asyncio.TimeoutError, OSError)
_OUTCOMES: dict[type[BaseException], str] = {
    _PreconditionFailed: "exists", _ConditionalConflict: "conflict", ObjectMissing: "missing",
}


def _send_bytes(request: Any, **_: Any) -> None:
    """Hand an upload's bytes to the HTTP session as they are.

    botocore wraps a ``bytes`` body in a ``BytesIO``; aiohttp then exports that buffer,
    which copies the whole body once more, and sends it in 64 KiB reads with a turn of
    the event loop after each. A WAL object is megabytes: given the bytes back (the
    ``BytesIO`` still shares them: ``getvalue`` copies nothing), aiohttp writes them to
    the socket in one call. A retry sends the same bytes again.
    """
    body = request.body
    if isinstance(body, io.BytesIO) and body.tell() == 0:
        request.body = body.getvalue()


_LOADERS = threading.local()


def _session() -> AioSession:
    """A botocore session of its own (credentials it resolves, with their refresh lock,
    stay with it and its event loop), sharing this thread's loader of botocore's models:
    loading the S3 service's description and the endpoints is most of the 0.1 s of CPU a
    first client costs, and a Spark task opens a store per partition it writes, a test
    one per engine. One loader per thread, as botocore's objects are not made to be
    shared between threads."""
    session = get_session()
    loader = getattr(_LOADERS, "loader", None)
    if loader is None:
        _LOADERS.loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", loader)
    return session


class S3Store:
    """put, conditional create, get, range get, list, delete, with counters."""

    def __init__(self, s3: S3Settings, metrics: StoreMetrics) -> None:
        self._settings = s3
        self._metrics = metrics
        self.bucket = s3.s3_bucket
        self._client: Any = None
        self._lean: LeanS3 | None = None  # GET, ranged GET and PUT when usable
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def metrics(self) -> StoreMetrics:
        """The counters this store's requests go to (writers add what they stored)."""
        return self._metrics

    async def __aenter__(self) -> S3Store:
        s = self._settings
        config = AioConfig(
            max_pool_connections=s.s3_max_pool_connections,
            connect_timeout=min(10.0, s.s3_request_timeout_s),
            read_timeout=s.s3_request_timeout_s,
            retries={"max_attempts": s.s3_max_attempts, "mode": "standard"},
            # Unsigned payloads (unless LLOG_S3_SIGN_PAYLOAD): the CRC32C sent with each
            # upload protects its integrity, and SHA-256 over every body costs both sides.
            s3={"addressing_style": "path", "payload_signing_enabled": s.s3_sign_payload},
            # Every body carries its own CRC32C, checked on every read (docs/protocol.md):
            # botocore computes none; uploads send one computed here (_checksum).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._stack = contextlib.AsyncExitStack()
        session = _session()
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3",
                endpoint_url=s.s3_endpoint,
                region_name=s.s3_region,
                aws_access_key_id=_reveal(s.s3_access_key),
                aws_secret_access_key=_reveal(s.s3_secret_key),
                # A private CA's bundle for an https endpoint; None: the system's roots.
                verify=str(s.s3_ca_bundle) if s.s3_ca_bundle is not None else None,
                config=config,
            )
        )
        for operation in ("PutObject", "UploadPart"):
            self._client.meta.events.register(f"before-send.s3.{operation}", _send_bytes)
        if s3_lean.usable(s):
            self._lean = await self._stack.enter_async_context(LeanS3(s))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None
            self._client = None
            self._lean = None

    @contextlib.asynccontextmanager
    async def _request(self, op: str, key: str) -> AsyncIterator[None]:
        """Time and count one request, and translate whatever the client raises."""
        if self._client is None:
            raise StorageUnavailable("the S3 client is closed")
        started = time.monotonic()
        outcome = "ok"
        try:
            yield
        except _CLIENT_ERRORS as exc:
            translated = _translate(op, key, exc)
            outcome = _OUTCOMES.get(type(translated), "error")
            raise translated from exc
        except BaseException:
            outcome = "error"
            raise
        finally:
            self._metrics.s3_requests.labels(op, outcome).inc()
            self._metrics.s3_latency.labels(op).observe(time.monotonic() - started)

    def _crc32c(self, body: Body) -> str | None:
        """The upload's CRC32C for the store to verify (LLOG_S3_PUT_CHECKSUM)."""
        if not self._settings.s3_put_checksum:
            return None
        value = 0
        for part in body_parts(body):  # in order: the CRC of the bytes they make
            value = crc32c.crc32c(part, value)
        return base64.b64encode(value.to_bytes(4, "big")).decode()

    def _checksum(self, body: bytes) -> dict[str, str]:
        checksum = self._crc32c(body)
        return {} if checksum is None else {"ChecksumCRC32C": checksum}

    async def put(self, key: str, body: Body) -> None:
        """Store ``body`` at ``key``: its bytes, or its parts in order (a WAL object's
        head and slices), which the lean path writes without joining them."""
        async with self._request("put", key):
            if self._lean is not None:
                await self._lean.put(key, body, self._crc32c(body))
            else:
                whole = b"".join(body_parts(body))
                await self._client.put_object(Bucket=self.bucket, Key=key, Body=whole,
                                              **self._checksum(whole))
        self._metrics.s3_bytes.labels("out").inc(body_size(body))

    async def create_if_absent(self, key: str, body: bytes, *, attempts: int = 8) -> bool:
        """PUT with ``If-None-Match: *``: True if created, False if the key already exists.

        409 (another conditional write in flight) is retried with backoff; 412 is final.
        """
        delay = 0.05
        for _ in range(attempts):
            try:
                async with self._request("put", key):
                    await self._client.put_object(
                        Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*",
                        **self._checksum(body))
            except _PreconditionFailed:
                return False
            except _ConditionalConflict:
                await anyio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
                continue
            self._metrics.s3_bytes.labels("out").inc(len(body))
            return True
        raise StorageUnavailable(f"S3 conditional PUT {key}: conflicts did not clear")

    async def get(self, key: str) -> bytes:
        return await self._read("get", key, 0, None)

    async def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        body = await self._read("range_get", key, start, length)
        self._check_length(key, start, length, len(body))
        return body

    async def get_range_buffer(self, key: str, start: int, length: int
                               ) -> bytes | bytearray:
        """:meth:`get_range` in the buffer the body was read into (a ``bytearray`` on
        the lean path), not copied into ``bytes``: for a reader that reads it and
        never changes it, as the reader's caches hold what they keep."""
        if length <= 0:
            return b""
        body = await self._fetch("range_get", key, start, length)
        self._check_length(key, start, length, len(body))
        return body

    async def get_range_cut(self, key: str, start: int, spans: Sequence[tuple[int, int]]
                            ) -> list[bytes | bytearray]:
        """Bytes ``start`` up to the end of the last of ``spans`` in one ranged GET, as
        one buffer per span (``(offset, end)`` from ``start``, in order), each holding
        its span alone: what keeps spans one by one (the object cache) needs them apart,
        or one kept span would hold the whole range in memory. The lean path reads each
        span straight into its own ``bytearray``; botocore's answer is cut once."""
        length = spans[-1][1] if spans else 0
        if length <= 0:
            return [b"" for _ in spans]
        buffers: list[bytes | bytearray]
        async with self._request("range_get", key):
            if self._lean is not None:
                cuts, got = await self._lean.get_cut(key, start, spans)
                buffers = list(cuts)
            else:
                body = await self._boto_get(key, f"bytes={start}-{start + length - 1}")
                got, view = len(body), memoryview(body)
                buffers = [bytes(view[a:b]) for a, b in spans] if got == length else []
        self._metrics.s3_bytes.labels("in").inc(got)
        self._check_length(key, start, length, got)
        return buffers

    def _check_length(self, key: str, start: int, length: int, got: int) -> None:
        if got != length:
            raise ObjectMissing(
                f"s3://{self.bucket}/{key}: range [{start}, {start + length}) returned "
                f"{got} bytes (object truncated?)"
            )

    async def get_head(self, key: str, length: int) -> bytes:
        """The object's first ``length`` bytes, or all of it when it is shorter (one
        ranged GET: an object's size need not be known to read it whole)."""
        return await self._read("range_get", key, 0, max(length, 1))

    async def get_head_buffer(self, key: str, length: int) -> bytes | bytearray:
        """:meth:`get_head` in the buffer it was read into (as :meth:`get_range_buffer`)."""
        return await self._fetch("range_get", key, 0, max(length, 1))

    async def _read(self, op: str, key: str, start: int, length: int | None) -> bytes:
        """As :meth:`_fetch`, in immutable ``bytes``: callers may keep or hash them."""
        body = await self._fetch(op, key, start, length)
        return body if isinstance(body, bytes) else bytes(body)

    async def _fetch(self, op: str, key: str, start: int, length: int | None
                     ) -> bytes | bytearray:
        """The object, or ``length`` bytes of it from ``start`` (fewer where it ends:
        more are refused), in the buffer it was read into."""
        body: bytes | bytearray
        byte_range = None if length is None else f"bytes={start}-{start + length - 1}"
        async with self._request(op, key):
            if self._lean is None:
                body = await self._boto_get(key, byte_range)
            else:
                if length is None:
                    buffer = await self._lean.get(key, None)
                else:
                    (buffer, *_), _ = await self._lean.get_cut(key, start, [(0, length)])
                body = buffer
        self._metrics.s3_bytes.labels("in").inc(len(body))
        return body

    async def _boto_get(self, key: str, byte_range: str | None) -> bytes:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key}
        if byte_range is not None:
            kwargs["Range"] = byte_range
        resp = await self._client.get_object(**kwargs)
        async with resp["Body"] as stream:
            body: bytes = await stream.read()
        return body

    async def head(self, key: str) -> ObjectInfo | None:
        try:
            async with self._request("head", key):
                resp = await self._client.head_object(Bucket=self.bucket, Key=key)
        except ObjectMissing:
            return None
        return ObjectInfo(
            key, int(resp["ContentLength"]), int(resp["LastModified"].timestamp() * 1000)
        )

    async def list(self, prefix: str, *, page_size: int = 1000) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix,
                                      "MaxKeys": page_size}
            if token:
                kwargs["ContinuationToken"] = token
            async with self._request("list", prefix):
                resp = await self._client.list_objects_v2(**kwargs)
            for item in resp.get("Contents", []):
                yield ObjectInfo(
                    item["Key"], int(item["Size"]),
                    int(item["LastModified"].timestamp() * 1000),
                )
            if not resp.get("IsTruncated"):
                return
            token = resp.get("NextContinuationToken")

    async def delete(self, key: str) -> None:
        async with self._request("delete", key):
            await self._client.delete_object(Bucket=self.bucket, Key=key)
