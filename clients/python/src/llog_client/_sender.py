"""The producer's background task: it drains ready batches into requests, sends up to
``max_in_flight`` of them at once, and settles each batch from its answer (acknowledged,
retried within its delivery deadline, or failed).

It runs on an event loop: the async producer's own, or, for the sync producer, a loop on
a thread of its own. Appends wake it (a new batch starts its linger, a full one is
ready); otherwise it sleeps until the next batch's linger or backoff ends. Should it
crash, every batch waiting fails with the cause and the producer refuses new records:
no caller waits on a future nobody will settle.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

import anyio
import anyio.abc
import httpx

from llog_client import _batch_wire as batch_wire
from llog_client._accumulator import Accumulator, Batch
from llog_client._batching import KeySource
from llog_client._codec import CONTENT_TYPE
from llog_client._compression import HAS_ZSTD, Compression, encode_body
from llog_client._config import COMMIT_DEADLINE_HEADER, ClientConfig, broken_of, reply_of
from llog_client._errors import DeliveryTimeout, LlogError, ProducerClosed
from llog_client._ops import Send
from llog_client._producer_metrics import ProducerMetrics
from llog_client._routing import DIGEST_HEADER
from llog_client._topic_meta import TopicMeta
from llog_client._wire import Broken, Outcome, broken_error

OFF_LOOP_BYTES = 64 * 1024  # a body at least this large is compressed on a worker thread
_PRODUCE = Send("POST", "/produce")  # what the client's settings are asked about


@dataclass(frozen=True)
class SenderSettings:
    max_in_flight: int
    max_request_bytes: int
    max_request_records: int
    max_request_entries: int
    delivery_timeout_s: float
    backoff_s: float
    backoff_max_s: float
    compression: Compression | None  # None: as the topics store their records


class Sender:
    """See the module. ``lock`` guards the accumulator; ``space`` is called (lock
    held) when bytes of the buffer are freed; ``deliver`` runs for each finished batch
    (lock not held: a callback may send again)."""

    def __init__(self, acc: Accumulator, lock: threading.Lock, config: ClientConfig,
                 http: httpx.AsyncClient, settings: SenderSettings, keys: KeySource,
                 metrics: ProducerMetrics, topics: dict[str, TopicMeta],
                 space: Callable[[], None], deliver: Callable[[Batch], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._acc, self._lock, self._config, self._http = acc, lock, config, http
        self._settings, self._keys, self.metrics = settings, keys, metrics
        self._topics, self._space, self._deliver, self._clock = topics, space, deliver, clock
        self._wake = anyio.Event()
        self._in_flight = 0
        self.crashed: BaseException | None = None
        self.stopped = anyio.Event()

    def wake(self) -> None:
        """Look again now (call on the sender's loop)."""
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                await self._loop(tg)
        except BaseException as exc:
            self._crash(exc)
            raise
        finally:
            self.stopped.set()

    async def _loop(self, tg: anyio.abc.TaskGroup) -> None:
        s = self._settings
        while True:
            routes = self._config.routes
            if routes is not None and routes.stale():
                await self._fetch_map()
            now = self._clock()
            with self._lock:
                expired = self._acc.expired(now)
                for batch in expired:
                    self._fail(batch, self._timed_out(batch, None))
                batches = (self._acc.drain(now, s.max_request_bytes, s.max_request_records,
                                           s.max_request_entries, self._group())
                           if self._in_flight < s.max_in_flight else [])
                finished = self._acc.closed and self._acc.empty()
                delay = self._acc.next_check_s(now)
                if expired:
                    self._space()
            self._notify(expired)
            if batches:
                self._in_flight += 1
                tg.start_soon(self._send, batches)
                continue
            if finished and not self._in_flight:
                return
            with anyio.move_on_after(delay if math.isfinite(delay) else None):
                await self._wake.wait()
            if self._wake.is_set():
                self._wake = anyio.Event()

    async def _fetch_map(self) -> None:
        """The members' map of ``route="preferred"`` (``GET /cluster``); without an
        answer, requests go to the brokers given until it is asked for again."""
        try:
            response: httpx.Response | None = await self._http.get(
                self._config.url("/cluster"), timeout=self._config.timeout(_PRODUCE))
        except httpx.TransportError:
            response = None
        self._config.took_map(response)

    def _group(self) -> Callable[[Batch], object] | None:
        routes = self._config.routes
        if routes is None:
            return None
        # Batches placed by key (partition -1) go with the brokers given.
        return lambda batch: (routes.url_for(batch.topic, batch.partition)
                              if batch.partition >= 0 else None)

    def _crash(self, exc: BaseException) -> None:
        """Fail every batch still waiting: nobody else will settle them."""
        self.crashed = exc
        error = ProducerClosed(f"the producer's sender stopped: {exc!r}")
        with self._lock:
            self._acc.closed = True
            left = self._acc.take_all()
            for batch in left:
                self._fail(batch, error)
            self._space()
        self._notify(left)

    # -- one request -----------------------------------------------------------------

    async def _send(self, batches: list[Batch]) -> None:
        outcome: Outcome | None = None
        started = self._clock()
        try:
            for batch in batches:
                if not batch.idempotency_key:
                    batch.idempotency_key = self._keys.next()
                batch.attempts += 1
            outcome = await self._post(batches)
        finally:
            self._in_flight -= 1
            if outcome is None:  # cancelled or crashed mid-request: not settled here
                outcome = Broken("the request was abandoned", maybe_sent=True)
            self._settle(batches, outcome, started)
            self.wake()

    async def _post(self, batches: list[Batch]) -> Outcome:
        content = batch_wire.envelope(batches)
        headers = {"content-type": CONTENT_TYPE}
        deadline_ms = self._config.commit_deadline_ms()
        if deadline_ms is not None:
            headers[COMMIT_DEADLINE_HEADER] = str(deadline_ms)
        compression = self._compression(batches)
        if compression != "none":
            if len(content) >= OFF_LOOP_BYTES:
                content, encoding = await anyio.to_thread.run_sync(
                    encode_body, content, compression)
            else:
                content, encoding = encode_body(content, compression)
            if encoding is not None:
                headers["content-encoding"] = encoding
        url = self._target(batches[0])
        self.metrics.request_bytes += len(content)
        try:
            response = await self._http.post(url, content=content, headers=headers,
                                             timeout=self._config.timeout(_PRODUCE))
        except httpx.TransportError as exc:
            self._unreached(url)
            return broken_of(exc)
        if self._config.routes is not None:
            self._config.routes.noticed(response.headers.get(DIGEST_HEADER))
        return reply_of(response)

    def _compression(self, batches: list[Batch]) -> Compression:
        chosen = self._settings.compression
        if chosen is not None:
            return chosen
        stored = {(self._topics.get(b.topic) or TopicMeta.UNKNOWN).compression
                  for b in batches}
        return "zstd" if HAS_ZSTD and stored == {"zstd"} else "none"

    def _target(self, batch: Batch) -> str:
        routes = self._config.routes
        if routes is not None and batch.partition >= 0:
            url = routes.url_for(batch.topic, batch.partition)
            if url is not None:
                return url + "/produce"
        return self._config.url("/produce")

    def _unreached(self, url: str) -> None:
        routes = self._config.routes
        if routes is not None and url != self._config.url("/produce"):
            routes.failed(url.removesuffix("/produce"))
        else:
            self._config.next_broker()

    # -- settling ----------------------------------------------------------------------

    def _settle(self, batches: list[Batch], outcome: Outcome, started: float) -> None:
        now = self._clock()
        settled, placed = batch_wire.settle(batches, outcome)
        self.metrics.request(now - started, failed=isinstance(settled[0], LlogError)
                             and all(isinstance(s, LlogError) for s in settled))
        split = len(batches) > 1 and _refused_whole(outcome)
        done: list[Batch] = []
        with self._lock:
            for batch, result, partition in zip(batches, settled, placed, strict=True):
                if not isinstance(result, LlogError):
                    self._acc.settled(batch)
                    batch.route = (batch.topic, partition, batch.route[2])
                    batch.finish(*result)
                    self.metrics.delivered(batch)
                    done.append(batch)
                    continue
                error = self._retry_or_error(batch, result, now, split)
                if error is not None:
                    self._acc.settled(batch)
                    self._fail(batch, error)
                    done.append(batch)
            self._space()
        self._notify(done)

    def _notify(self, batches: list[Batch]) -> None:
        for batch in batches:
            batch.notify()
            self._deliver(batch)

    def _retry_or_error(self, batch: Batch, error: LlogError, now: float, split: bool
                        ) -> LlogError | None:
        """Requeue ``batch`` for another attempt if one may succeed before its deadline
        (None); else the error to fail it with."""
        if error.maybe_written:
            batch.last_error = error  # remembered: a later failure may not say so
        elif batch.last_error is not None and batch.last_error.maybe_written:
            error = copy.copy(error)
            error.maybe_written = True
        if split:
            batch.alone = True  # refused whole with others: try it by itself
            self._acc.requeue(batch, now)
            return None
        if not error.retriable:
            return error
        s = self._settings
        backoff = min(s.backoff_max_s, s.backoff_s * 2 ** (batch.attempts - 1))
        if error.retry_after_s is not None:
            backoff = max(backoff, min(error.retry_after_s, s.backoff_max_s))
        if now + backoff >= batch.deadline:
            return self._timed_out(batch, error)
        self.metrics.retries += 1
        self._acc.requeue(batch, now + backoff)
        return None

    def _timed_out(self, batch: Batch, cause: LlogError | None) -> LlogError:
        cause = cause or batch.last_error
        error = DeliveryTimeout(
            f"{len(batch)} records not acknowledged within the delivery timeout "
            f"({self._settings.delivery_timeout_s:g} s, {batch.attempts} attempts"
            + (f"; last: {cause}" if cause is not None else "") + ")",
            maybe_written=bool(batch.last_error and batch.last_error.maybe_written),
            topic=batch.topic, partition=batch.partition)
        error.__cause__ = cause
        return error

    def _fail(self, batch: Batch, error: LlogError) -> None:
        """(lock held; :meth:`_notify` it after)"""
        self.metrics.failed(batch)
        batch.fail(error)

    # -- metadata --------------------------------------------------------------------

    async def topic(self, topic: str, within_s: float) -> TopicMeta:
        """The topic's partition count and compression (``GET /topics/{topic}``); an
        unknown topic is :data:`TopicMeta.UNKNOWN` (produce creates it when the brokers
        create topics on use). Retriable failures are retried for ``within_s``, then
        the last is raised; others at once."""
        deadline = self._clock() + within_s
        attempt = 0
        while True:
            try:
                return await self._topic_once(topic)
            except LlogError as exc:
                s = self._settings
                pause = min(s.backoff_max_s, s.backoff_s * 2 ** attempt)
                if not exc.retriable or self._clock() + pause >= deadline:
                    raise
            await anyio.sleep(pause)
            attempt += 1

    async def _topic_once(self, topic: str) -> TopicMeta:
        path = "/topics/" + quote(topic, safe="")
        try:
            response = await self._http.get(self._config.url(path),
                                            timeout=self._config.timeout(_PRODUCE))
        except httpx.TransportError as exc:
            self._config.next_broker()
            raise broken_error(broken_of(exc)) from None
        return TopicMeta.parse(reply_of(response), self._clock())


def _refused_whole(outcome: Outcome) -> bool:
    """A request refused as a whole for what it holds (400, 413): one batch of it may be
    the cause, and the others would go through alone."""
    return not isinstance(outcome, Broken) and outcome.status in (400, 413)
