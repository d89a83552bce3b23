"""An asynchronous facade over the synchronous ``oxia`` client.

Every call of the package runs in a bounded worker pool (``anyio.to_thread.run_sync``
with a ``CapacityLimiter``), never on the event loop; gets, range scans and the group
puts of commits go through ``grpc.aio`` on the loop instead (app/stores/oxia/reads.py,
app/stores/oxia/writes.py), and through the package only when that cannot take them.
The package sets no gRPC deadlines of its own, so it is built with channels that add one
to every request/response call (:func:`app.stores.oxia.patches.connect`); a stuck call
therefore ends by itself and a worker thread is never leaked.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import grpc
import grpc.aio
import oxia
import oxia.ex

from app.errors import StorageUnavailable, VersionMismatch
from app.settings import OxiaSettings, default_broker_id
from app.stores.metrics import StoreMetrics
from app.stores.oxia import patches as oxia_patches
from app.stores.oxia.channels import LeaderChannels
from app.stores.oxia.discovery import STALE_LEADER_CODES
from app.stores.oxia.reads import EventLoopReads
from app.stores.oxia.wire import NotUnderstood, PutSpec, SendExpired, in_time
from app.stores.oxia.writes import EventLoopWrites

T = TypeVar("T")
EXPECT_NOT_EXISTS = oxia.EXPECTED_RECORD_DOES_NOT_EXIST

__all__ = ["EXPECT_NOT_EXISTS", "OxiaStore", "PutSpec", "Record", "SendExpired",
           "describe"]

@dataclass(frozen=True)
class Record:
    key: str
    value: bytes
    version_id: int


class OxiaStore:
    def __init__(self, oxia: OxiaSettings, metrics: StoreMetrics, *,
                 identity: str | None = None) -> None:
        """``identity`` names this client's session to Oxia (its ephemeral records carry
        it): the process's LLOG_BROKER_ID, or a compactor's or task's id; none: the
        default broker id."""
        self._settings = oxia
        self._metrics = metrics
        self._identity = identity or default_broker_id()
        self._limiter = anyio.CapacityLimiter(oxia.oxia_max_threads)
        self._client: Any = None
        self._channels: LeaderChannels | None = None
        self._reads: EventLoopReads | None = None
        self._writes: EventLoopWrites | None = None
        self._timeout = oxia.oxia_request_timeout_s
        self._puts = _PutCoalescer(self, max_inflight=oxia.oxia_max_inflight_writes)

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        return self._limiter

    async def __aenter__(self) -> OxiaStore:
        s = self._settings

        def connect() -> Any:
            return oxia_patches.connect(
                s.oxia_address, namespace=s.oxia_namespace,
                session_timeout_ms=s.oxia_session_timeout_ms,
                client_identifier=self._identity, request_timeout_s=self._timeout,
                tls=oxia_patches.TlsFiles(s.oxia_tls_ca_file, s.oxia_tls_cert_file,
                                         s.oxia_tls_key_file) if s.oxia_tls else None,
            )

        try:
            self._client = await anyio.to_thread.run_sync(connect, limiter=self._limiter)
        except Exception as exc:
            raise StorageUnavailable(f"cannot reach Oxia at {s.oxia_address}: {exc}") from exc
        if (s.oxia_event_loop_reads or s.oxia_event_loop_writes) and _on_asyncio():
            credentials = None if not s.oxia_tls else await anyio.to_thread.run_sync(
                oxia_patches.TlsFiles(s.oxia_tls_ca_file, s.oxia_tls_cert_file,
                                     s.oxia_tls_key_file).credentials)
            self._channels = LeaderChannels(self._client, credentials=credentials,
                                            options=oxia_patches.CHANNEL_OPTIONS)
            if s.oxia_event_loop_reads:
                self._reads = EventLoopReads(self._channels, timeout_s=self._timeout)
            if s.oxia_event_loop_writes:
                self._writes = EventLoopWrites(
                    self._channels, timeout_s=self._timeout, describe=describe,
                    on_stale_leader=lambda exc: _suspect_if_stale(self._client, exc))
        return self

    async def __aexit__(self, *exc: object) -> None:
        channels, self._channels = self._channels, None
        self._reads = self._writes = None
        if channels is not None:
            with anyio.CancelScope(shield=True):
                await channels.aclose()
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(client.close, limiter=self._limiter)

    @property
    def client(self) -> Any:
        """The underlying synchronous client (for threads of our own, e.g. notifications)."""
        return self._client

    async def _call(self, op: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a worker thread: the one place that times and counts Oxia calls
        and turns the client's exceptions into the engine's."""
        if self._client is None:
            raise StorageUnavailable("the Oxia client is closed")
        started = time.monotonic()
        outcome = "ok"
        try:
            # Every gRPC call carries its own deadline (oxia_patches.connect), so a worker
            # thread always comes back. The outer bound covers waiting for a free worker;
            # if it fires, the caller is released and the thread ends at its deadline.
            with anyio.fail_after(self._timeout * 2 + 5):
                return await anyio.to_thread.run_sync(fn, limiter=self._limiter,
                                                      abandon_on_cancel=True)
        except (oxia.ex.KeyNotFound, VersionMismatch):
            outcome = "miss"
            raise
        except oxia.ex.UnexpectedVersionId:
            outcome = "conflict"
            raise VersionMismatch() from None
        except TimeoutError as exc:
            outcome = "error"
            _suspect_leaders(self._client)
            raise StorageUnavailable(f"Oxia {op} timed out") from exc
        except StorageUnavailable:
            outcome = "error"
            raise
        except Exception as exc:  # gRPC errors, the client's own ("No shard found", ...)
            outcome = "error"
            _suspect_if_stale(self._client, exc)
            raise StorageUnavailable(f"Oxia {op} failed: {describe(exc)}") from exc
        finally:
            self._metrics.oxia_requests.labels(op, outcome).inc()
            self._metrics.oxia_latency.labels(op).observe(time.monotonic() - started)

    async def get(self, key: str, partition_key: str) -> Record | None:
        if self._reads is not None:
            try:
                return await self._get_on_loop(self._reads, key, partition_key)
            except NotUnderstood:
                pass  # through the package, which reports what it makes of it

        def run() -> Record | None:
            try:
                k, value, version = self._client.get(key, partition_key=partition_key)
            except oxia.ex.KeyNotFound:
                return None
            return Record(k, value, version.version_id())

        return await self._call("get", run)

    async def _get_on_loop(self, reads: EventLoopReads, key: str, partition_key: str
                           ) -> Record | None:
        found = await self._on_loop("get", reads.get(key, partition_key))
        return None if found is None else Record(found.key, found.value, found.version_id)

    async def _write_batch(self, puts: list[PutSpec]) -> list[int | Exception]:
        """One Write request per shard for ``puts``: on the loop, or through the package
        in a worker thread when the loop's client cannot send them (nothing was sent)."""
        if self._writes is not None:
            try:
                return await self._on_loop("write_batch", self._writes.write(puts))
            except NotUnderstood:
                pass  # not sent: the package waits for the shard's leader or fails
        client = self._client
        try:
            return await self._call("write_batch", lambda: _write(client, puts))
        except StorageUnavailable as exc:
            return [exc] * len(puts)

    async def _on_loop(self, op: str, read: Awaitable[T]) -> T:
        """A call through :class:`EventLoopReads` or :class:`EventLoopWrites`, timed and
        counted as :meth:`_call` does, its gRPC errors reported as the package's are;
        :class:`NotUnderstood` is left to the caller, which makes the call again through
        the package."""
        started = time.monotonic()
        outcome = "ok"
        try:
            return await read
        except NotUnderstood:
            outcome = "fallback"
            raise
        except grpc.aio.AioRpcError as exc:
            outcome = "error"
            _suspect_if_stale(self._client, exc)
            raise StorageUnavailable(f"Oxia {op} failed: {describe(exc)}") from exc
        except BaseException:
            outcome = "error"
            raise
        finally:
            self._metrics.oxia_requests.labels(op, outcome).inc()
            self._metrics.oxia_latency.labels(op).observe(time.monotonic() - started)

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

        ``expected_version=EXPECT_NOT_EXISTS`` means create-if-absent. Concurrent puts are
        coalesced into one request per shard (ephemeral ones, bound to the session, are
        sent on their own).
        """
        if self._client is None:
            raise StorageUnavailable("the Oxia client is closed")
        if not ephemeral:
            (outcome,) = await self._puts.put_group([PutSpec(key, value, partition_key,
                                                             expected_version)])
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        def run() -> int:
            return oxia_patches.put_ephemeral(self._client, key, value, partition_key,
                                             expected_version)

        op = "put" if expected_version is None else "cas"
        return await self._call(op, run)

    async def put_group(self, puts: list[PutSpec]) -> list[int | Exception]:
        """Send ``puts`` together, in order, in one request per shard; one outcome each
        (a version, :class:`VersionMismatch` or :class:`StorageUnavailable`; or
        :class:`SendExpired` for a put not sent by its ``send_by``: a group past it when
        its batch is taken is refused whole).

        Oxia applies one write request as a single log entry, so puts of one shard in a
        group are applied in order and together, or not at all.
        """
        if self._client is None:
            raise StorageUnavailable("the Oxia client is closed")
        return await self._puts.put_group(puts)

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
        if self._reads is not None:
            try:
                found = await self._on_loop("range_scan", self._reads.range_scan(
                    min_inclusive, max_exclusive, partition_key, limit))
                return [Record(f.key, f.value, f.version_id) for f in found]
            except NotUnderstood:
                pass  # through the package, which reports what it makes of it

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


class _PutCoalescer:
    """Group commit for Oxia puts: concurrent puts share one Write request per shard.

    The first caller that finds a free flusher slot becomes a flusher: it lets the loop
    turn once (so puts started together arrive), takes whatever is queued (its own put
    included), sends one request per shard, hands every waiter
    its own outcome, and repeats while more is queued. Under load the batches grow by
    themselves; alone, a put costs what it did before. Each put keeps its own status, so
    one CAS failing never affects another in the same request.

    A put may wait here for a long time (``max_inflight`` requests, each up to its
    deadline), so a group whose ``send_by`` has passed when its batch is taken is not
    sent: it is answered :class:`SendExpired`, whole. The write paths check again as each
    shard's request goes out (a worker thread may be waited for, too).
    """

    def __init__(self, store: OxiaStore, *, max_batch: int = 512, max_inflight: int = 4
                 ) -> None:
        self._store = store
        self._max_batch = max_batch
        self._max_inflight = max_inflight
        self._queue: list[_QueuedGroup] = []
        self._flushers = 0
        self._collecting = False  # a flusher is letting the puts of this turn arrive

    async def put_group(self, puts: list[PutSpec]) -> list[int | Exception]:
        future: asyncio.Future[list[int | Exception]] = (
            asyncio.get_running_loop().create_future())
        self._queue.append(_QueuedGroup(puts, future))
        if not self._collecting and self._flushers < self._max_inflight:
            self._flushers += 1
            try:
                # Shielded: other callers' results depend on this flush (each request
                # carries a deadline, so the shield is bounded).
                with anyio.CancelScope(shield=True):
                    # One turn of the event loop first: puts started together (the
                    # partitions of one produce flush) then share one request.
                    self._collecting = True
                    try:
                        await asyncio.sleep(0)
                    finally:
                        self._collecting = False
                    while self._queue:
                        await self._flush(self._take())
            finally:
                self._flushers -= 1
        return await future

    def _take(self) -> list[_QueuedGroup]:
        """Whole groups (never split) up to about ``max_batch`` puts."""
        taken, size = 0, 0
        while taken < len(self._queue) and (
            taken == 0 or size + len(self._queue[taken].puts) <= self._max_batch
        ):
            size += len(self._queue[taken].puts)
            taken += 1
        groups = self._queue[:taken]
        del self._queue[:taken]
        return groups

    async def _flush(self, groups: list[_QueuedGroup]) -> None:
        """Send ``groups`` and resolve every one of their futures, whatever happens."""
        try:
            await self._send(groups)
        except BaseException as exc:
            error = exc if isinstance(exc, StorageUnavailable) else StorageUnavailable(
                f"Oxia write failed unexpectedly: {type(exc).__name__}: {exc}")
            for group in groups:
                if not group.future.done():
                    group.future.set_result([error] * len(group.puts))
            if not isinstance(exc, Exception):
                raise  # cancellation and the like still propagate

    def _refuse_late(self, groups: list[_QueuedGroup]) -> list[_QueuedGroup]:
        """Answer the groups with a put past its ``send_by`` (every put SendExpired: a
        group is sent whole or not at all); the others, to be sent."""
        sending = []
        for group in groups:
            sendable, _ = in_time(group.puts)
            if len(sendable) == len(group.puts):
                sending.append(group)
                continue
            for put in group.puts:
                self._store._metrics.oxia_puts.labels(_op(put), "expired").inc()
            if not group.future.done():
                group.future.set_result([SendExpired(
                    "not sent: its group's deadline to be sent had passed")] * len(group.puts))
        return sending

    async def _send(self, groups: list[_QueuedGroup]) -> None:
        groups = self._refuse_late(groups)
        if not groups:
            return
        puts = [p for g in groups for p in g.puts]
        outcomes = await self._store._write_batch(puts)
        if len(outcomes) != len(puts):
            raise StorageUnavailable(f"Oxia answered {len(outcomes)} of {len(puts)} puts")
        metrics = self._store._metrics
        metrics.oxia_batch_size.observe(len(puts))
        for put, outcome in zip(puts, outcomes, strict=True):
            kind = ("ok" if not isinstance(outcome, Exception) else
                    "conflict" if isinstance(outcome, VersionMismatch) else
                    "expired" if isinstance(outcome, SendExpired) else "error")
            metrics.oxia_puts.labels(_op(put), kind).inc()
        i = 0
        for group in groups:
            mine = outcomes[i:i + len(group.puts)]
            i += len(group.puts)
            if not group.future.done():
                group.future.set_result(mine)


@dataclass
class _QueuedGroup:
    puts: list[PutSpec]
    future: asyncio.Future[list[int | Exception]]


def _op(put: PutSpec) -> str:
    return "put" if put.expected_version is None else "cas"


def _on_asyncio() -> bool:
    """Whether the running event loop is asyncio's (grpc.aio needs it; trio is not)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def describe(exc: BaseException) -> str:
    """A gRPC error as its status and details (its repr is a page of debug text)."""
    if isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None)):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _stale_leader(exc: BaseException) -> bool:
    """Whether a call failed as a call to a dead or stalled leader does."""
    return (isinstance(exc, grpc.RpcError) and callable(getattr(exc, "code", None))
            and exc.code() in STALE_LEADER_CODES)


def _suspect_if_stale(client: Any, exc: BaseException) -> None:
    """:func:`_suspect_leaders` when ``exc`` is how calls to a replaced leader fail."""
    if _stale_leader(exc):
        _suspect_leaders(client)


def _suspect_leaders(client: Any) -> None:
    """Have the shard assignments read again (app/stores/oxia/discovery.py): the
    leader that failed may have been replaced without this client hearing of it."""
    refresh = getattr(getattr(client, "_service_discovery", None), "refresh", None)
    if refresh is not None:
        refresh()


def _write(client: Any, batch: list[PutSpec]) -> list[int | Exception]:
    """One Write request per shard for ``batch`` (runs in a worker thread), of the puts
    still in time as it goes out (the others are answered SendExpired, unsent)."""
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    by_shard: dict[int, tuple[Any, list[int]]] = {}
    for i, item in enumerate(batch):
        shard, stub = client._service_discovery.get_leader(item.key, item.partition_key)
        by_shard.setdefault(shard, (stub, []))[1].append(i)
    out: list[int | Exception] = [StorageUnavailable("not sent")] * len(batch)
    for shard, (stub, all_indexes) in by_shard.items():
        # Checked as each request goes out: the ones before it may have taken long.
        sendable, unsent = in_time([batch[i] for i in all_indexes])
        for i, outcome in zip(all_indexes, unsent, strict=True):
            out[i] = outcome  # SendExpired, or replaced by the answer below
        indexes = [all_indexes[k] for k in sendable]
        if not indexes:
            continue
        request = pb.WriteRequest(shard=shard, puts=[
            pb.PutRequest(key=batch[i].key, value=batch[i].value,
                          partition_key=batch[i].partition_key,
                          expected_version_id=batch[i].expected_version)
            for i in indexes
        ])
        try:
            response = stub.write(request)
        except grpc.RpcError as exc:
            _suspect_if_stale(client, exc)
            for i in indexes:
                out[i] = StorageUnavailable(
                    f"Oxia write to shard {shard} failed: {describe(exc)}")
            continue
        for i, result in zip(indexes, response.puts, strict=True):
            if result.status == pb.Status.OK:
                out[i] = int(result.version.version_id)
            elif result.status == pb.Status.UNEXPECTED_VERSION_ID:
                out[i] = VersionMismatch()
            else:
                out[i] = StorageUnavailable(f"Oxia put {batch[i].key}: status {result.status}")
    return out
