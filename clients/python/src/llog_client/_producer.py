"""The blocking producer: ``send`` returns at once with a future, a thread of the
producer's own sends the batches."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import httpx

from llog_client._compression import Compression
from llog_client._config import Routing, default_headers
from llog_client._errors import ProducerClosed
from llog_client._http_post import PostPool
from llog_client._models import Bytesish
from llog_client._producer_core import (
    DeliveryCallback,
    Headers,
    ProducerCore,
    RecordFuture,
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


class Producer:
    """Sends records in batches, per partition, as Kafka's producers do
    (docs/client.md, Producer)::

        with Producer("http://127.0.0.1:8080") as producer:
            future = producer.send("orders", b"created", key=b"customer-17")
            producer.flush()
            print(future.result().offset)

    ``send`` adds a record to its partition's batch and returns a
    :class:`~llog_client.RecordFuture`; a thread of the producer's own sends a batch once
    it holds ``batch_bytes`` or has waited ``linger_ms``, many partitions' batches per
    request (binary bodies), ``max_in_flight`` requests at a time. Each batch is retried
    as the same append until ``delivery_timeout_ms``: a record is stored once however
    often it is sent. With ``ordered`` (the default) a partition's batches go as its
    producer sequence, ``in_flight_per_partition`` (5) at once, and the broker appends
    each only after the one before it: records of a partition are stored in the order
    sent.

    Options (``ProducerSettings``): ``linger_ms`` (5), ``batch_bytes`` (1 MiB),
    ``max_request_bytes`` (4 MiB), ``max_in_flight`` (8), ``buffer_bytes`` (64 MiB: ``send``
    blocks while the records not yet acknowledged fill it, and raises ``BufferFull`` after
    ``max_block_ms``, 60 s), ``delivery_timeout_ms`` (120 s), ``request_timeout_s`` (30),
    ``ordered`` (True), ``in_flight_per_partition`` (5). ``compression``: zstd, gzip or
    none for every request; None (the default): zstd for requests whose topics are stored
    compressed, else none.
    ``on_delivery(metadata, error)`` runs once per record on the producer's thread.
    """

    def __init__(self, brokers: str | Sequence[str] | None = None, *,
                 compression: Compression | None = None, route: Routing = "any",
                 token: str | None = None, on_delivery: DeliveryCallback | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, **options: Any) -> None:
        self._core = ProducerCore(brokers, ProducerSettings(**options), compression, route,
                                  threading.Event, RecordFuture)
        self._space = threading.Condition(self._core.lock)
        self._space_waiters = 0  # sends waiting for room in the buffer (lock held)
        self._deliver = delivery_hook(on_delivery)
        self._client_args: dict[str, Any] = {"headers": default_headers(token),
                                             "transport": transport}
        self._posts = posts_for(self._client_args)  # ValueError here, for the caller
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sender: Sender | None = None
        self._stop: anyio.CancelScope | None = None
        self._thread = threading.Thread(target=self._main, name="llog-producer", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._sender is None:
            raise ProducerClosed("the producer's thread did not start")

    # -- the sender's thread -----------------------------------------------------------

    def _main(self) -> None:
        try:
            # A crash of the sender has failed every batch with its cause already.
            with contextlib.suppress(Exception):
                anyio.run(self._serve, backend="asyncio")
        finally:
            with self._space:
                self._core.acc.closed = True
                self._space.notify_all()
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._run(self._posts)
        finally:
            if self._posts is not None:
                self._posts.close()

    async def _run(self, posts: PostPool | None) -> None:
        core = self._core
        async with httpx.AsyncClient(**self._client_args) as http, \
                anyio.create_task_group() as tg:
            self._stop = tg.cancel_scope
            sender = Sender(core.acc, core.lock, core.config, http,
                            core.settings.sender(core.compression), core.keys, core.metrics,
                            core.topics, self._space_freed, self._deliver, posts=posts,
                            sequences=core.sequences)
            await tg.start(sender.run)
            self._sender = sender
            self._ready.set()

    def _space_freed(self) -> None:
        """(lock held) Buffer bytes were freed: wake the sends that wait for room, if
        any (a notify costs a call into the lock even when nobody waits)."""
        if self._space_waiters:
            self._space.notify_all()

    def _wake(self) -> None:
        if self._loop is not None and self._sender is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended: nothing to wake
                self._loop.call_soon_threadsafe(self._sender.wake)

    # -- sending -----------------------------------------------------------------------

    def send(self, topic: str, value: Bytesish | bytearray | memoryview, *,
             key: Bytesish | bytearray | memoryview | None = None,
             partition: int | None = None,
             headers: Headers = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue one record; its future. Without ``partition``, a keyed record goes to
        its key's partition (the broker's rule) and the others to a partition chosen a
        batch at a time. Blocks only for a topic's first use (its partition count) and
        while the buffer is full."""
        core = self._core
        if key is None and headers is None and timestamp_ms is None and type(value) is bytes:
            future: RecordFuture | None = core.express(topic, value, partition)
            if future is not None:
                return future
        raw, raw_key, raw_headers, size, timestamp_ms = core.record(value, key, headers,
                                                                   timestamp_ms)
        topic, partition = as_topic(topic), as_partition(partition)
        meta = core.topics.get(topic)
        if meta is None or meta.expires <= time.monotonic():
            if core.needs_topic(partition):
                meta = self._topic(topic, meta)
            elif meta is None:
                meta = core.unlooked(topic)
        batch, index, wake = core.enqueue(meta, topic, partition, raw, raw_key, raw_headers,
                                          timestamp_ms, size, self._wait_for_space)
        if wake:
            self._wake()
        return RecordFuture(batch, index, core.lock)

    def _on_sender(self) -> bool:
        """Whether this is the producer's own thread (a delivery callback): it must never
        wait there, for only it could end the wait."""
        return threading.current_thread() is self._thread

    def _wait_for_space(self, size: int) -> None:
        """(lock held) Until the buffer has room for ``size`` more bytes."""
        acc, settings = self._core.acc, self._core.settings
        if self._on_sender():
            raise self._core.buffer_full()
        deadline = time.monotonic() + settings.max_block_ms / 1000
        self._space_waiters += 1
        try:
            while acc.buffered + size > settings.buffer_bytes and not acc.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._core.buffer_full()
                self._space.wait(left)
        finally:
            self._space_waiters -= 1

    def _topic(self, topic: str, known: TopicMeta | None) -> TopicMeta:
        """What is known of ``topic``: read now on its first use; read again in the
        background when it is old (the old answer serves meanwhile)."""
        if self._loop is None or self._sender is None or self._core.acc.closed:
            raise ProducerClosed("the producer is closed")
        if known is not None:
            known.expires = time.monotonic() + MAX_AGE_S
            asyncio.run_coroutine_threadsafe(self._core.refresh(self._sender, topic),
                                             self._loop)
            return known
        if self._on_sender():  # place by what is known now; the answer comes later
            asyncio.run_coroutine_threadsafe(self._core.refresh(self._sender, topic),
                                             self._loop)
            return self._core.remember(topic, TopicMeta(None, "none", time.monotonic() + 1))
        within_s = self._core.settings.max_block_ms / 1000
        try:
            asked = asyncio.run_coroutine_threadsafe(self._sender.topic(topic, within_s),
                                                     self._loop)
            # Its last request may outlast max_block_ms by a request timeout at most.
            found = asked.result(within_s + self._core.settings.request_timeout_s)
        except concurrent.futures.TimeoutError:
            asked.cancel()
            raise self._core.lookup_failed(topic) from None
        except (concurrent.futures.CancelledError, RuntimeError):  # the loop ended
            raise ProducerClosed("the producer closed while it looked a topic up") from None
        return self._core.remember(topic, found)

    # -- flush, close, metrics -----------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send every record queued so far at once, and wait until each is acknowledged
        or failed. Raises the first failure no future or callback has reported (the
        others are in their futures); TimeoutError after ``timeout`` seconds."""
        if self._on_sender():
            raise RuntimeError("flush() from a delivery callback would wait for itself")
        waiting = self._core.flush_started()
        self._wake()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for batch in waiting:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.waiter.wait(left):
                    raise TimeoutError(f"flush did not finish within {timeout} s")
        finally:
            self._core.flush_ended()
        error = unobserved_error(waiting)
        if error is not None:
            raise error

    def close(self, timeout: float | None = None) -> None:
        """Take no more records, deliver those queued (retrying within their delivery
        timeout), then stop. After ``timeout`` seconds, records still undelivered fail
        with ``ProducerClosed``."""
        if self._on_sender():
            raise RuntimeError("close() from a delivery callback would wait for itself")
        with self._space:
            self._core.acc.closed = True
            self._space.notify_all()
        self._wake()
        self._thread.join(timeout)
        if self._thread.is_alive() and self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.cancel)
            self._thread.join()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, float]:
        """Counters and gauges: records, bytes and batches sent, retries, request
        latency, the buffer in use (docs/client.md, Producer metrics)."""
        return self._core.snapshot()

    def prometheus(self) -> str:
        """:meth:`metrics` as Prometheus samples (text format, ``llog_producer_*``)."""
        return prometheus_text(self.metrics())
