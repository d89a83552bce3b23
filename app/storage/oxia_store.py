"""An asynchronous facade over the synchronous ``oxia`` client.

Every call runs in a bounded worker pool (``anyio.to_thread.run_sync`` with a
``CapacityLimiter``), never on the event loop. The client sets no gRPC deadlines of its
own, so the channels it opens get an interceptor that adds one to every request/response
call; a stuck call therefore ends by itself and a worker thread is never leaked. The
long-lived streams (shard assignments, notifications, session keep-alives) are left alone.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import grpc
import oxia
import oxia.ex

from app.settings import Settings
from app.storage.errors import StorageUnavailable
from app.storage.metrics import StoreMetrics

T = TypeVar("T")
EXPECT_NOT_EXISTS = oxia.EXPECTED_RECORD_DOES_NOT_EXIST

# Request/response methods of the Oxia client service that must finish promptly.
_DEADLINE_METHODS = ("/Write", "/Read", "/List", "/RangeScan")


class VersionMismatch(Exception):
    """A conditional put or delete found another version (internal to the engine)."""


@dataclass(frozen=True)
class Record:
    key: str
    value: bytes
    version_id: int


class _DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    def __init__(self, timeout_s: float) -> None:
        self._timeout = timeout_s

    def _details(self, details: Any) -> Any:
        if details.timeout is not None or not details.method.endswith(_DEADLINE_METHODS):
            return details
        return _CallDetails(
            details.method, self._timeout, details.metadata, details.credentials,
            getattr(details, "wait_for_ready", None), getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)


@dataclass(frozen=True)
class _CallDetails(grpc.ClientCallDetails):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


def _install_deadlines(client: Any, timeout_s: float) -> None:
    """Make the client's connection pool open intercepted channels."""
    from oxia.internal.proto.io.streamnative.oxia.proto import OxiaClientStub

    pool = client._connections
    interceptor = _DeadlineInterceptor(timeout_s)

    def get(address: str) -> Any:
        with pool._lock:
            entry = pool.connections.get(address)
            if entry is None:
                channel = grpc.intercept_channel(grpc.insecure_channel(address), interceptor)
                entry = (channel, OxiaClientStub(channel))
                pool.connections[address] = entry
            return entry[1]

    pool.get = get


class OxiaStore:
    def __init__(self, settings: Settings, metrics: StoreMetrics, *,
                 identity: str | None = None) -> None:
        self._settings = settings
        self._metrics = metrics
        self._identity = identity or settings.broker_id
        self._limiter = anyio.CapacityLimiter(settings.oxia_max_threads)
        self._client: Any = None
        self._timeout = settings.oxia_request_timeout_s
        self._lock = threading.Lock()

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        return self._limiter

    async def __aenter__(self) -> OxiaStore:
        s = self._settings

        def connect() -> Any:
            client = oxia.Client(
                s.oxia_address,
                namespace=s.oxia_namespace,
                session_timeout_ms=s.oxia_session_timeout_ms,
                client_identifier=self._identity,
            )
            _install_deadlines(client, self._timeout)
            return client

        try:
            self._client = await anyio.to_thread.run_sync(connect, limiter=self._limiter)
        except Exception as exc:
            raise StorageUnavailable(f"cannot reach Oxia at {s.oxia_address}: {exc}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(client.close, limiter=self._limiter)

    @property
    def client(self) -> Any:
        """The underlying synchronous client (for threads of our own, e.g. notifications)."""
        return self._client

    async def _call(self, op: str, fn: Callable[[], T]) -> T:
        if self._client is None:
            raise StorageUnavailable("the Oxia client is closed")
        started = time.monotonic()
        outcome = "ok"
        try:
            # The interceptor bounds each gRPC call; fail_after also bounds waiting for a
            # free worker and the client's own shard-discovery waits.
            with anyio.fail_after(self._timeout * 2 + 5):
                return await anyio.to_thread.run_sync(fn, limiter=self._limiter)
        except (oxia.ex.KeyNotFound, VersionMismatch):
            outcome = "miss"
            raise
        except oxia.ex.UnexpectedVersionId:
            outcome = "conflict"
            raise VersionMismatch() from None
        except TimeoutError as exc:
            outcome = "error"
            raise StorageUnavailable(f"Oxia {op} timed out") from exc
        except (grpc.RpcError, oxia.ex.OxiaException, RuntimeError) as exc:
            outcome = "error"
            raise StorageUnavailable(f"Oxia {op} failed: {exc}") from exc
        finally:
            self._metrics.oxia_requests.labels(op, outcome).inc()
            self._metrics.oxia_latency.labels(op).observe(time.monotonic() - started)

    async def get(self, key: str, partition_key: str) -> Record | None:
        def run() -> Record | None:
            try:
                k, value, version = self._client.get(key, partition_key=partition_key)
            except oxia.ex.KeyNotFound:
                return None
            return Record(k, value, version.version_id())

        return await self._call("get", run)

    async def get_ceiling(self, key: str, partition_key: str) -> Record | None:
        """The first record with key >= ``key`` on the partition's shard (any prefix!)."""

        def run() -> Record | None:
            try:
                k, value, version = self._client.get(
                    key, partition_key=partition_key,
                    comparison_type=oxia.ComparisonType.CEILING,
                )
            except oxia.ex.KeyNotFound:
                return None
            return Record(k, value, version.version_id())

        return await self._call("get_ceiling", run)

    async def put(self, key: str, value: bytes, partition_key: str, *,
                  expected_version: int | None = None, ephemeral: bool = False) -> int:
        """Put; raises :class:`VersionMismatch` when ``expected_version`` does not hold.

        ``expected_version=EXPECT_NOT_EXISTS`` means create-if-absent.
        """

        def run() -> int:
            _, version = self._client.put(
                key, value, partition_key=partition_key,
                expected_version_id=expected_version, ephemeral=ephemeral,
            )
            return int(version.version_id())

        op = "put" if expected_version is None else "cas"
        return await self._call(op, run)

    async def delete(self, key: str, partition_key: str, *,
                     expected_version: int | None = None) -> bool:
        def run() -> bool:
            return bool(self._client.delete(
                key, partition_key=partition_key, expected_version_id=expected_version
            ))

        return await self._call("delete", run)

    async def delete_range(self, min_inclusive: str, max_exclusive: str,
                           partition_key: str) -> None:
        await self._call("delete_range", functools.partial(
            self._client.delete_range, min_inclusive, max_exclusive,
            partition_key=partition_key,
        ))

    async def range_scan(self, min_inclusive: str, max_exclusive: str, partition_key: str,
                         *, limit: int | None = None) -> list[Record]:
        def run() -> list[Record]:
            out: list[Record] = []
            it: Iterator[Any] = self._client.range_scan(
                min_inclusive, max_exclusive, partition_key=partition_key
            )
            try:
                for key, value, version in it:
                    out.append(Record(key, value, version.version_id()))
                    if limit is not None and len(out) >= limit:
                        break
            finally:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            return out

        return await self._call("range_scan", run)

    async def list_keys(self, min_inclusive: str, max_exclusive: str,
                        partition_key: str | None = None) -> list[str]:
        def run() -> list[str]:
            return list(self._client.list(
                min_inclusive, max_exclusive, partition_key=partition_key
            ))

        return await self._call("list", run)
