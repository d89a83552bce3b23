"""The asyncio (and trio, through anyio) producer: the sync producer's batching, on the
caller's event loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import httpx

from llog_client._compression import Compression
from llog_client._config import Routing, default_headers
from llog_client._errors import ProducerClosed
from llog_client._models import Bytesish, RecordMetadata
from llog_client._producer_core import (
    AsyncRecordFuture,
    DeliveryCallback,
    Headers,
    ProducerCore,
    as_partition,
    as_topic,
    delivery_hook,
    posts_for,
    unobserved_error,
)
from llog_client._producer_metrics import prometheus_text
from llog_client._producer_settings import ProducerSettings
from llog_client._sender import Sender
from llog_client._topic_meta import MAX_AGE_S, TopicMeta

# How long a run of sends may keep the event loop from the producer's own task. That
# task shares the caller's loop: a program that sends in a loop awaiting nothing else
# would have no batch sent and no answer read until its buffer filled (each record
# late by as long as that took, its callback too), so a send lets the loop run once
# this long.
# About a thousand loop turns a second: under 1 % of a send-bound program's CPU. The
# clock is read every YIELD_CHECK_SENDS sends only (a few µs apart), not on every send.
YIELD_EVERY_S = 0.001
YIELD_CHECK_SENDS = 32


class AsyncProducer:
    """See :class:`~llog_client.Producer`; used as ``async with`` (or ``await start()``
    and ``await close()`` in the same task)::

        async with AsyncProducer("http://127.0.0.1:8080") as producer:
            future = await producer.send("orders", b"created", key=b"customer-17")
            metadata = await future          # acknowledged: stored and committed

    ``await send(...)`` returns once the record is queued (it waits only for a topic's
    first lookup and while the buffer is full, and lets the loop run about once a
    millisecond, for the producer's own task); the future it returns resolves on
    acknowledgement. ``on_delivery`` runs on the event loop.
    """

    def __init__(self, brokers: str | Sequence[str] | None = None, *,
                 compression: Compression | None = None, route: Routing = "any",
                 token: str | None = None, on_delivery: DeliveryCallback | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, **options: Any) -> None:
        self._core = ProducerCore(brokers, ProducerSettings(**options), compression, route,
                                  anyio.Event, AsyncRecordFuture)
        self._deliver = delivery_hook(on_delivery)
        self._client_args: dict[str, Any] = {"headers": default_headers(token),
                                             "transport": transport}
        self._posts = posts_for(self._client_args)  # ValueError here, for the caller
        self._space = anyio.Event()
        self._http: httpx.AsyncClient | None = None
        self._sender: Sender | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._yield_at = 0.0  # when a send next lets the loop run (YIELD_EVERY_S)
        self._sends = 0

    async def start(self) -> None:
        if self._tg is not None:
            return
        core = self._core
        self._http = httpx.AsyncClient(**self._client_args)
        if self._posts is not None and self._posts.closed:  # started again after close
            self._posts = posts_for(self._client_args)
        self._sender = Sender(core.acc, core.lock, core.config, self._http,
                              core.settings.sender(core.compression), core.keys, core.metrics,
                              core.topics, self._space_freed, self._deliver,
                              posts=self._posts, sequences=core.sequences)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self._tg.start(self._run_sender)

    async def _run_sender(self, *, task_status: anyio.abc.TaskStatus[None]
                          = anyio.TASK_STATUS_IGNORED) -> None:
        """The sender, its crash kept from the caller's task: it has failed every batch
        with the cause, and sends refuse from then on."""
        assert self._sender is not None
        with contextlib.suppress(Exception):  # its batches failed with the cause
            await self._sender.run(task_status=task_status)

    def _space_freed(self) -> None:
        self._space.set()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- sending -----------------------------------------------------------------------

    async def send(self, topic: str, value: Bytesish | bytearray | memoryview, *,
                   key: Bytesish | bytearray | memoryview | None = None,
                   partition: int | None = None,
                   headers: Headers = None, timestamp_ms: int | None = None
                   ) -> AsyncRecordFuture:
        """Queue one record; its future (``await`` it for the record's metadata)."""
        core = self._core
        if self._sender is None:
            raise ProducerClosed("the producer is not started: use `async with` or start()")
        self._sends += 1
        if self._sends % YIELD_CHECK_SENDS == 0 and time.monotonic() >= self._yield_at:
            # Before the record is queued: cancelled here, the record was not sent.
            self._yield_at = time.monotonic() + YIELD_EVERY_S
            await anyio.lowlevel.checkpoint()
        if key is None and headers is None and timestamp_ms is None and type(value) is bytes:
            future: AsyncRecordFuture | None = core.express(topic, value, partition)
            if future is not None:
                return future
        raw, raw_key, raw_headers, size, timestamp_ms = core.record(value, key, headers,
                                                                   timestamp_ms)
        topic, partition = as_topic(topic), as_partition(partition)
        meta = core.topics.get(topic)
        if meta is None or meta.expires <= time.monotonic():
            if core.needs_topic(partition):
                meta = await self._topic(topic, meta)
            elif meta is None:
                meta = core.unlooked(topic)
        if core.acc.buffered + size > core.buffer_bytes:
            await self._wait_for_space(size)  # nothing runs between it and the append
        batch, index, wake = core.enqueue(meta, topic, partition, raw, raw_key, raw_headers,
                                          timestamp_ms, size, None)
        if wake:
            self._sender.wake()
        return AsyncRecordFuture(batch, index, core.lock)

    async def send_and_wait(self, topic: str, value: Bytesish | bytearray | memoryview,
                            **kwargs: Any) -> RecordMetadata:
        """``send``, then wait for the record's acknowledgement."""
        return await (await self.send(topic, value, **kwargs))

    async def _wait_for_space(self, size: int) -> None:
        acc, settings = self._core.acc, self._core.settings
        try:
            with anyio.fail_after(settings.max_block_ms / 1000):
                while acc.buffered + size > settings.buffer_bytes and not acc.closed:
                    if self._space.is_set():
                        self._space = anyio.Event()
                    await self._space.wait()
        except TimeoutError:
            raise self._core.buffer_full() from None

    async def _topic(self, topic: str, known: TopicMeta | None) -> TopicMeta:
        if self._sender is None or self._tg is None:
            raise ProducerClosed("the producer is closed")
        if known is not None:
            known.expires = time.monotonic() + MAX_AGE_S
            self._tg.start_soon(self._core.refresh, self._sender, topic)
            return known
        within_s = self._core.settings.max_block_ms / 1000
        try:
            with anyio.fail_after(within_s + self._core.settings.request_timeout_s):
                found = await self._sender.topic(topic, within_s)
        except TimeoutError:
            raise self._core.lookup_failed(topic) from None
        return self._core.remember(topic, found)

    # -- flush, close, metrics -----------------------------------------------------------

    async def flush(self) -> None:
        """See :meth:`Producer.flush` (bound it with ``anyio.fail_after``)."""
        waiting = self._core.flush_started()
        if self._sender is not None:
            self._sender.wake()
        try:
            for batch in waiting:
                await batch.waiter.wait()
        finally:
            self._core.flush_ended()
        error = unobserved_error(waiting)
        if error is not None:
            raise error

    async def close(self, grace_s: float | None = None) -> None:
        """See :meth:`Producer.close`: after ``grace_s`` seconds, records still
        undelivered fail with ``ProducerClosed``."""
        if self._tg is None or self._sender is None:
            return
        with self._core.lock:
            self._core.acc.closed = True
            self._space.set()
        self._sender.wake()
        tg, self._tg = self._tg, None
        try:
            with anyio.move_on_after(grace_s):
                await self._sender.stopped.wait()
        finally:
            # Cancelled meanwhile (the caller's scope), or not: the task group is left
            # and the connections closed, shielded, before anything else is raised.
            tg.cancel_scope.cancel()
            try:
                await tg.__aexit__(None, None, None)
            finally:
                with anyio.CancelScope(shield=True):
                    if self._http is not None:
                        await self._http.aclose()
                    if self._posts is not None:
                        self._posts.close()

    def metrics(self) -> dict[str, float]:
        return self._core.snapshot()

    def prometheus(self) -> str:
        return prometheus_text(self.metrics())
