"""The producer's background task: it drains ready batches into requests, sends up to
``max_in_flight`` of them at once, and settles each batch from its answer (acknowledged,
retried within its delivery deadline, or failed).

It runs on an event loop: the async producer's own, or, for the sync producer, a loop on
a thread of its own. Appends wake it (a new batch starts its linger, a full one is
ready); otherwise it sleeps until the next batch's linger or backoff ends. Should it
crash, every batch waiting fails with the cause and the producer refuses new records:
no caller waits on a future nobody will settle. A caller's callback that raises is
logged and changes nothing else.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from urllib.parse import quote

import anyio
import anyio.abc
import httpx

from llog_client import _batch_wire as batch_wire
from llog_client._accumulator import Accumulator, Batch
from llog_client._batching import KeySource
from llog_client._codec import CONTENT_TYPE
from llog_client._compression import HAS_ZSTD, Compression, encode_body
from llog_client._config import (
    COMMIT_DEADLINE_HEADER,
    ClientConfig,
    broken_of,
    reply_from,
    reply_of,
)
from llog_client._errors import LlogError, ProducerClosed
from llog_client._http_post import NotSent, PostFailed, PostPool
from llog_client._ops import Send
from llog_client._producer_metrics import ProducerMetrics
from llog_client._retry_rules import RetryRules, SenderSettings
from llog_client._routing import DIGEST_HEADER
from llog_client._sequences import ProducerSequences
from llog_client._topic_meta import TopicMeta
from llog_client._wire import Broken, Outcome, broken_error

OFF_LOOP_BYTES = 64 * 1024  # a body at least this large is compressed on a worker thread
_PRODUCE = Send("POST", "/produce")  # what the client's settings are asked about
log = logging.getLogger("llog_client.producer")

__all__ = ["Sender", "SenderSettings"]


class Sender:
    """See the module. ``lock`` guards the accumulator; ``space`` is called (lock
    held) when bytes of the buffer are freed; ``deliver`` runs for each finished batch
    (lock not held: a callback may send again)."""

    def __init__(self, acc: Accumulator, lock: threading.Lock, config: ClientConfig,
                 http: httpx.AsyncClient, settings: SenderSettings, keys: KeySource,
                 metrics: ProducerMetrics, topics: dict[str, TopicMeta],
                 space: Callable[[], None], deliver: Callable[[Batch], None],
                 clock: Callable[[], float] = time.monotonic,
                 posts: PostPool | None = None,
                 sequences: ProducerSequences | None = None) -> None:
        self._acc, self._lock, self._config, self._http = acc, lock, config, http
        self._posts = posts  # produce requests to http:// brokers go this way
        self._settings, self._keys, self.metrics = settings, keys, metrics
        self._topics, self._space, self._deliver, self._clock = topics, space, deliver, clock
        # Ordered producers send each partition's batches as a producer sequence; unordered
        # ones, many batches of a partition at once, with idempotency keys.
        self._sequences = sequences if acc.ordered else None
        if self._sequences is not None:
            acc.position = self._sequences.position
        self._rules = RetryRules(settings, acc, metrics, config, self._sequences)
        self._wake = anyio.Event()
        self._in_flight = 0
        self._map_wanted = False  # a fetch of the members' map is under way
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
            if routes is not None and routes.stale() and not self._map_wanted:
                self._map_wanted = True  # fetched aside: produce goes on meanwhile
                tg.start_soon(self._fetch_map)
            now = self._clock()
            can_send = self._in_flight < s.max_in_flight
            with self._lock:
                expired = self._acc.expired(now)
                for batch in expired:
                    self._rules.expire(batch)
                batches = (self._acc.drain(now, s.max_request_bytes, s.max_request_records,
                                           s.max_request_entries, self._group())
                           if can_send else [])
                for batch in batches:  # in the order drained: a partition's, in its order
                    sequenced = self._sequences is not None and self._sequences.assign(batch)
                    if not sequenced and not batch.idempotency_key:
                        batch.idempotency_key = self._keys.next()
                finished = self._acc.closed and self._acc.empty()
                delay = self._acc.next_check_s(now, can_send)
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
        except httpx.HTTPError:
            response = None
        finally:
            self._map_wanted = False
        self._config.took_map(response)
        self.wake()

    def _group(self) -> Callable[[Batch], object] | None:
        routes = self._config.routes
        if routes is None:
            return None
        # Batches placed by key (partition -1) go with the brokers given.
        return lambda batch: (routes.url_for(batch.topic, batch.partition)
                              if batch.partition >= 0 else None)

    def _crash(self, exc: BaseException) -> None:
        """Fail every batch still waiting: nobody else will settle them."""
        with self._lock:
            self._acc.closed = True
            left = self._acc.take_all()
            for batch in left:
                error = ProducerClosed(f"the producer's sender stopped: {exc!r}")
                self._rules.fail(batch, self._rules.carried(batch, error))
            self._space()
        self._notify(left)

    def _notify(self, batches: list[Batch]) -> None:
        """Wake each batch's waiters, then its callbacks: every waiter is woken whatever
        a callback does."""
        for batch in batches:
            batch.waiter.set()
        for batch in batches:
            if batch.callbacks is not None:
                # Taken off the batch first: a callback's function may hold a future
                # of the batch, and a batch left in a cycle with it (and its records)
                # waits for Python's collector.
                callbacks = batch.callbacks
                batch.callbacks = None
                for fn, future in callbacks.each(batch):
                    try:
                        fn(future)
                    except Exception:
                        log.exception("a record's callback raised; the producer goes on")
            try:
                self._deliver(batch)
            except Exception:
                log.exception("on_delivery raised; the producer goes on")

    # -- one request -----------------------------------------------------------------

    async def _send(self, batches: list[Batch]) -> None:
        outcome: Outcome | None = None
        started = self._clock()
        url = self._target(batches[0])
        try:
            for batch in batches:
                batch.attempts += 1
            outcome = await self._post(batches, url)
        finally:
            self._in_flight -= 1
            if outcome is None:  # cancelled or crashed mid-request: not settled here
                outcome = Broken("the request was abandoned", maybe_sent=True)
            self._settle(batches, outcome, started, url)
            self.wake()

    async def _post(self, batches: list[Batch], url: str) -> Outcome:
        try:
            content, headers = await self._request(batches)
        except (ValueError, OverflowError, UnicodeError) as exc:  # nothing was sent
            return Broken(f"the request could not be built: {exc}", maybe_sent=False)
        self.metrics.request_bytes += len(content)
        if self._posts is not None and self._posts.handles(url):
            return await self._post_plain(self._posts, url, content, headers)
        try:
            # httpx's timeout bounds each read; this bounds the whole answer.
            with anyio.fail_after(self._config.timeout_s * 2 + 5):
                response = await self._http.post(url, content=content, headers=headers,
                                                 timeout=self._config.timeout(_PRODUCE))
        except (httpx.HTTPError, TimeoutError) as exc:
            self._away_from(url)
            if isinstance(exc, httpx.TransportError):
                return broken_of(exc)
            return Broken(f"{type(exc).__name__}: {exc}", maybe_sent=True)
        if self._config.routes is not None:
            self._config.routes.noticed(response.headers.get(DIGEST_HEADER))
        return reply_of(response)

    async def _post_plain(self, posts: PostPool, url: str, content: bytes,
                          headers: dict[str, str]) -> Outcome:
        """:meth:`_post` through the producer's own connections (plain HTTP)."""
        timeout = self._config.timeout(_PRODUCE)
        try:
            with anyio.fail_after(self._config.timeout_s * 2 + 5):
                answer = await posts.post(url, content, headers,
                                          connect_s=timeout.connect or 10.0,
                                          read_s=timeout.read or self._config.timeout_s)
        except (PostFailed, TimeoutError) as exc:
            self._away_from(url)
            return Broken(str(exc) or type(exc).__name__,
                          maybe_sent=not isinstance(exc, NotSent))
        except (OSError, ValueError) as exc:  # outside PostPool's own: it may have gone
            self._away_from(url)
            return Broken(f"{type(exc).__name__}: {exc}", maybe_sent=True)
        if self._config.routes is not None:
            self._config.routes.noticed(answer.headers.get(DIGEST_HEADER))
        return reply_from(answer.status, answer.body, answer.headers.get("retry-after"))

    async def _request(self, batches: list[Batch]) -> tuple[bytes, dict[str, str]]:
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
        return content, headers

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

    def _away_from(self, url: str) -> None:
        """``url`` did not take a request: pass it over. Its preferred broker is marked
        down a while; a broker of the list is left for the next one, unless another
        request's failure moved the list on already (many requests fail together, and
        each moving it on would bring it back to the broker that failed)."""
        current = self._config.url("/produce")
        routes = self._config.routes
        if routes is not None and url != current:
            routes.failed(url.removesuffix("/produce"))
        elif url == current:
            self._config.next_broker()

    def _settle(self, batches: list[Batch], outcome: Outcome, started: float, url: str
                ) -> None:
        try:
            settled, placed = batch_wire.settle(batches, outcome)
        except Exception as exc:  # an answer outside the contract: it may have written
            error = batch_wire.outside_contract(outcome, exc)
            settled, placed = [error] * len(batches), [b.partition for b in batches]
        with self._lock:
            done, refused = self._rules.settle(batches, settled, placed, outcome, started,
                                               self._clock())
            if refused:
                self._away_from(url)
            self._space()
        self._notify(done)

    # -- metadata --------------------------------------------------------------------

    async def topic(self, topic: str, within_s: float) -> TopicMeta:
        """The topic's partition count and compression (``GET /topics/{topic}``); an
        unknown topic is :data:`TopicMeta.UNKNOWN` (produce creates it when the brokers
        create topics on use). Retriable failures are retried for ``within_s``, moving
        on to the next broker, then the last is raised; others at once."""
        deadline = self._clock() + within_s
        attempt = 0
        while True:
            tried = self._config.url("/produce")
            try:
                return await self._topic_once(topic)
            except LlogError as exc:
                s = self._settings
                pause = min(s.backoff_max_s, s.backoff_s * 2 ** attempt)
                if not exc.retriable or self._clock() + pause >= deadline:
                    raise
            self._away_from(tried)
            await anyio.sleep(pause)
            attempt += 1

    async def _topic_once(self, topic: str) -> TopicMeta:
        path = "/topics/" + quote(topic, safe="")
        try:
            response = await self._http.get(self._config.url(path),
                                            timeout=self._config.timeout(_PRODUCE))
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.TransportError):
                raise broken_error(broken_of(exc)) from None
            raise broken_error(Broken(f"{type(exc).__name__}: {exc}", maybe_sent=False)
                               ) from None
        return TopicMeta.parse(reply_of(response), self._clock())
