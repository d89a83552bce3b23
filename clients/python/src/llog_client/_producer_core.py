"""What the sync and the async producer share: their settings, a record checked and
placed in its partition, and the future a caller holds for it."""

from __future__ import annotations

import contextlib
import operator
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, SupportsFloat

from llog_client._accumulator import RECORD_OVERHEAD, Accumulator, Batch, Route
from llog_client._batching import KeySource
from llog_client._compression import Compression, checked
from llog_client._config import ClientConfig, Routing, broker_urls, routes_for
from llog_client._errors import BufferFull, InvalidRequest, LlogError, PayloadTooLarge
from llog_client._http_post import PostPool
from llog_client._models import Bytesish, RecordMetadata
from llog_client._partitioner import partition_for_key
from llog_client._producer_metrics import ProducerMetrics
from llog_client._producer_settings import ProducerSettings
from llog_client._retry import ProduceLimits, RetryPolicy
from llog_client._sender import Sender
from llog_client._sequences import ProducerSequences
from llog_client._topic_meta import TopicMeta

_new_tuple = tuple.__new__  # a NamedTuple made without its Python-level __new__
# A header's name is 1 to 256 characters; a record has at most 64 (the broker's limits).
MAX_HEADER_NAME = 256
MAX_HEADERS = 64
MAX_TIMESTAMP_MS = 2 ** 63 - 1
MAX_PARTITION = 2 ** 31 - 1  # the wire's partition is a signed 32-bit number
# Kafka's rule for topic names, as the broker's (docs/http-api.md).
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
DeliveryCallback = Callable[[RecordMetadata | None, LlogError | None], None]
Headers = Sequence[tuple[str, Bytesish]] | None
# What this module's functions take from a user's call is typed Any where the public
# signature promises more than its annotation says (a bytearray key, headers as lists,
# numpy's integers): compiled (clients/python/setup.py), an annotation is checked at the
# call and would refuse what the interpreted module took. Each is checked here instead.


def as_bytes(value: Bytesish | bytearray | memoryview, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a record's {what} is bytes or str, not {type(value).__name__}")


def as_headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """(name, value) pairs, as tuples or lists; a name is a str, a value bytes or str."""
    if not headers:
        return ()
    out = tuple(as_header(pair) for pair in headers)
    if len(out) > MAX_HEADERS:
        raise ValueError(f"a record has at most {MAX_HEADERS} headers")
    for name, _ in out:
        if not 1 <= len(name) <= MAX_HEADER_NAME:
            raise ValueError(f"a header name is 1 to {MAX_HEADER_NAME} characters")
    return out


def as_header(pair: Any) -> tuple[str, bytes]:
    name, value = pair
    if not isinstance(name, str):
        raise TypeError(f"a header name is a str, not {type(name).__name__}")
    return name, as_bytes(value, "header value")


def as_partition(partition: Any) -> int | None:
    """A partition given as any integer (numpy's too): a plain int of the wire's range."""
    if partition is None:
        return None
    number = operator.index(partition)
    if not 0 <= number <= MAX_PARTITION:
        raise ValueError(f"a partition is 0 .. {MAX_PARTITION}, not {number}")
    return number


def as_topic(topic: Any) -> str:
    if not isinstance(topic, str):
        raise TypeError(f"a topic is a str, not {type(topic).__name__}")
    return topic


class ProducerCore:
    """The state both producers keep: the accumulator and its lock, what is known of
    each topic, the producer sequences and idempotency keys, and the counters."""

    def __init__(self, brokers: str | Sequence[str] | None, settings: ProducerSettings,
                 compression: Compression | None, route: Routing,
                 new_waiter: Callable[[], Any], future_type: type[_FutureBase]) -> None:
        self.settings = settings
        self.future_type = future_type
        self.compression = None if compression is None else checked(compression)
        self.config = ClientConfig(broker_urls(brokers), settings.request_timeout_s,
                                   RetryPolicy(), ProduceLimits(), routes=routes_for(route))
        self.lock = threading.Lock()
        self.acc = Accumulator(batch_bytes=settings.batch_bytes,
                               batch_records=settings.max_request_records,
                               linger_s=settings.linger_ms / 1000, ordered=settings.ordered,
                               new_waiter=new_waiter, clock=time.monotonic,
                               in_flight_per_partition=settings.in_flight_per_partition)
        self.topics: dict[str, TopicMeta] = {}
        self.keys = KeySource()
        self.sequences = ProducerSequences()
        self.metrics = ProducerMetrics()
        self.closed = False
        self.delivery_s = settings.delivery_timeout_ms / 1000
        self.max_record_size = min(settings.max_request_bytes, settings.buffer_bytes)
        self.buffer_bytes = settings.buffer_bytes

    def record(self, value: Any, key: Any, headers: Any, timestamp_ms: Any
               ) -> tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...], int, int | None]:
        """The record as bytes, its size against the limits (``buffer_bytes`` and
        ``max_request_bytes``: a record over them could never be sent), and its
        timestamp as a plain int. What the wire cannot carry is refused here, not in
        the sender with other records."""
        if timestamp_ms is not None:
            timestamp_ms = operator.index(timestamp_ms)
            if not 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
                raise ValueError(f"timestamp_ms is 0 .. {MAX_TIMESTAMP_MS}, "
                                 f"not {timestamp_ms}")
        if type(value) is bytes and key is None and not headers:  # the common case, fast
            size = len(value) + RECORD_OVERHEAD
            if size > self.max_record_size:
                raise self._too_large(size)
            return value, None, (), size, timestamp_ms
        raw = as_bytes(value, "value")
        raw_key = None if key is None else as_bytes(key, "key")
        raw_headers = as_headers(headers)
        size = len(raw) + RECORD_OVERHEAD + (0 if raw_key is None else len(raw_key))
        for name, header_value in raw_headers:
            size += len(name) + len(header_value) + 6
        if size > self.max_record_size:
            raise self._too_large(size)
        return raw, raw_key, raw_headers, size, timestamp_ms

    def _too_large(self, size: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"a record of {size} bytes is over the producer's max_request_bytes "
            f"({self.settings.max_request_bytes}) or buffer_bytes "
            f"({self.settings.buffer_bytes})")

    def unlooked(self, topic: str) -> TopicMeta:
        """What is known of a topic used only with partitions and a compression given
        (no lookup): its name is checked once, and it is looked up if a record ever
        needs it."""
        if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
            raise InvalidRequest(f"invalid topic {topic!r}: 1..249 characters of "
                                 "[A-Za-z0-9._-], not '.' or '..'")
        found = self.topics[topic] = TopicMeta(None, "none", 0.0)
        return found

    def needs_topic(self, partition: int | None) -> bool:
        """Whether a record needs what is known of its topic: to place it (no partition
        given) or to choose the compression of its request (none given)."""
        return partition is None or self.compression is None

    def place(self, meta: TopicMeta, topic: str, key: bytes | None, partition: int | None
              ) -> Route:
        """The partition given; else the key's, as the broker computes it; else the
        topic's sticky partition (it moves on once its batch is full or sent, so
        records without a key spread over the partitions a batch at a time)."""
        if partition is not None:
            if partition < 0:
                raise ValueError("a partition is 0 or more")
            return topic, partition, None
        count = meta.partitions
        if key is not None:
            # Not created yet: the broker places it by its key. Records by key already on
            # their way go first: the next goes the same way until they are settled.
            if count is None or self.acc.by_key_pending(topic):
                return topic, -1, key
            return topic, partition_for_key(key, count), None
        if count is None:
            return topic, 0, None
        return self.sticky_route(meta, topic)

    @staticmethod
    def sticky_route(meta: TopicMeta, topic: str) -> Route:
        """Where records without key or partition go: the topic's sticky partition,
        which moves on once the batch it fills is full or sent."""
        route, held = meta.sticky_route, meta.sticky_batch
        if route is not None and held is not None and not (held.sealed or held.full):
            return route
        assert meta.partitions is not None
        if held is not None:
            meta.sticky = (meta.sticky + 1) % meta.partitions
            meta.sticky_batch = None
        route = meta.sticky_route = (topic, meta.sticky % meta.partitions, None)
        return route

    def enqueue(self, meta: TopicMeta, topic: str, partition: int | None, value: bytes,
                key: bytes | None, headers: tuple[tuple[str, bytes], ...],
                timestamp_ms: int | None, size: int,
                wait_for_space: Callable[[int], None] | None) -> tuple[Batch, int, bool]:
        """Place the record and append it to its partition's batch (under the lock, after
        ``wait_for_space`` when the buffer is full): the batch, the record's index, and
        whether the sender should look now. Once per record: kept free of calls for the
        common case."""
        sticky = key is None and partition is None and meta.partitions is not None
        held = meta.sticky_batch
        if sticky and held is not None and not (held.sealed or held.full):
            route = meta.sticky_route or self.place(meta, topic, None, None)
        else:
            route = self.place(meta, topic, key, partition)
        acc = self.acc
        with self.lock:
            if wait_for_space is not None and acc.buffered + size > self.buffer_bytes:
                wait_for_space(size)
            batch, index, wake = acc.append(route, value, key, headers, timestamp_ms, size,
                                            self.delivery_s)
            if sticky:
                meta.sticky_batch = batch
        return batch, index, wake

    def express(self, topic: Any, value: bytes, partition: Any) -> Any:
        """A value alone appended in one step: its future, when its partition's open
        batch takes it without filling up and the buffer has room; None when anything
        else applies (the caller then takes the whole way, which decides the rest, a
        full batch's wake-up included). A batch is opened only the whole way, which
        reads the topic again when what is known of it is old, so an open batch stands
        for a fresh look. Runs once per record of most programs: lookups by topic then
        partition, the lock taken and released by hand (half the cost of ``with``
        here), no call but the future's."""
        if partition is None:
            meta = self.topics.get(topic)
            if meta is None or meta.sticky_route is None:  # read again: the whole way
                return None
            batch = meta.sticky_batch
        else:
            tails = self.acc.tails.get(topic)
            # Another kind of number (1.0 finds partition 1 too): the whole way checks it.
            batch = None if tails is None or type(partition) is not int else tails.get(partition)
        if batch is None:
            return None
        size = len(value) + RECORD_OVERHEAD
        acc = self.acc
        values = batch.values
        lock = self.lock
        lock.acquire()
        try:
            if (batch.sealed or batch.full or not batch.plain or acc.closed
                    or acc.buffered + size > self.buffer_bytes
                    or batch.size + size >= acc.batch_bytes
                    or len(values) + 1 >= acc.batch_records):
                return None
            values.append(value)
            batch.size += size
            acc.buffered += size
            return self.future_type(batch, len(values) - 1, lock)
        finally:
            lock.release()

    def lookup_failed(self, topic: str) -> BufferFull:
        return BufferFull(f"topic {topic!r} could not be looked up within max_block_ms "
                          f"({self.settings.max_block_ms:g} ms)")

    def buffer_full(self) -> BufferFull:
        return BufferFull(f"the producer's buffer ({self.settings.buffer_bytes} bytes) "
                          f"stayed full for {self.settings.max_block_ms:g} ms")

    def flush_started(self) -> list[Batch]:
        """Every batch not yet settled, each made ready at once until
        :meth:`flush_ended`: what a flush waits for."""
        with self.lock:
            self.acc.flushing += 1
            return list(self.acc.unfinished.values())

    def flush_ended(self) -> None:
        with self.lock:
            self.acc.flushing -= 1

    async def refresh(self, sender: Sender, topic: str) -> None:
        """Read ``topic`` again (in the background): on failure, what was known stays,
        and the next use after its age retries."""
        with contextlib.suppress(Exception):
            self.remember(topic, await sender.topic(topic, self.settings.max_block_ms / 1000))

    def remember(self, topic: str, found: TopicMeta) -> TopicMeta:
        """A topic read again keeps its sticky partition."""
        old = self.topics.get(topic)
        if old is not None:
            found.sticky, found.sticky_batch = old.sticky, old.sticky_batch
        self.topics[topic] = found
        return found

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            buffered = self.acc.buffered
        return self.metrics.snapshot(buffered)


class _FutureBase:
    """The future of one record: its batch and its place in it (no object per record
    is made until a caller asks for the result). Two futures of one record are equal:
    a done-callback is given a future of its record made when the batch finished, equal
    to (not the same object as) the one it was added to."""

    __slots__ = ("_batch", "_index", "_lock")

    def __init__(self, batch: Batch, index: int, lock: threading.Lock) -> None:
        self._batch, self._index, self._lock = batch, index, lock

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _FutureBase):
            return NotImplemented
        return self._batch is other._batch and self._index == other._index

    def __hash__(self) -> int:
        return hash((id(self._batch), self._index))

    def done(self) -> bool:
        return self._batch.finished

    @property
    def error(self) -> LlogError | None:
        """The record's error once settled (None: acknowledged, or not settled yet);
        reading it counts as seeing it."""
        batch = self._batch
        if batch.error is not None:
            batch.observed = True
        return batch.error

    @property
    def left_in_batch(self) -> int:
        """How many records of its batch, itself included, were sent after it."""
        return len(self._batch) - self._index

    def _outcome(self) -> RecordMetadata:
        batch = self._batch
        batch.observed = True
        if batch.error is not None:
            raise batch.error
        route = batch.route
        return _new_tuple(RecordMetadata, (route[0], route[1], batch.base_offset + self._index,
                                           batch.duplicate))

    def add_done_callback(self, fn: Callable[[Any], object]) -> None:
        """``fn(future)`` once the record is acknowledged or failed (at once if it
        is): on the sender's thread (sync) or loop (async)."""
        batch = self._batch
        lock = self._lock
        lock.acquire()
        try:
            if not batch.finished:
                callbacks = batch.callbacks
                if callbacks is None:
                    callbacks = batch.callbacks = DoneCallbacks(type(self), lock)
                # The function and the record's place, not this future: a program
                # that drops its futures frees them at once, and a future kept until
                # its batch is answered would outlive Python's young collections (at
                # 126,000 records a second, a full collection every 200 ms walking
                # every object of the program: docs/client.md, Futures and callbacks).
                callbacks.calls.append(fn)
                callbacks.calls.append(self._index)
                return
        finally:
            lock.release()
        fn(self)


class DoneCallbacks:
    """The done-callbacks of one batch's records, flat in one list: a function, the
    index of its record, the next function... (one object per batch, none per
    callback). Each is given a future of its record made when it runs."""

    __slots__ = ("calls", "future_type", "lock")

    def __init__(self, future_type: type[_FutureBase], lock: threading.Lock) -> None:
        self.future_type, self.lock = future_type, lock
        self.calls: list[Any] = []

    def each(self, batch: Batch) -> Iterator[tuple[Callable[[Any], object], _FutureBase]]:
        """Every (function, future) to call, in the order they were added."""
        make, lock, calls = self.future_type, self.lock, self.calls
        for at in range(0, len(calls), 2):
            yield calls[at], make(batch, calls[at + 1], lock)


class RecordFuture(_FutureBase):
    """:meth:`result` blocks until the record is acknowledged (its
    :class:`~llog_client.RecordMetadata`) or raises its error."""

    __slots__ = ()

    def result(self, timeout: SupportsFloat | None = None) -> RecordMetadata:
        # _outcome written out: result() runs once per record in most callbacks.
        batch = self._batch
        if not batch.finished and not batch.waiter.wait(timeout):
            raise TimeoutError("the record is not settled yet")
        batch.observed = True
        if batch.error is not None:
            raise batch.error
        route = batch.route
        return _new_tuple(RecordMetadata, (route[0], route[1], batch.base_offset + self._index,
                                           batch.duplicate))

    def exception(self, timeout: SupportsFloat | None = None) -> LlogError | None:
        try:
            self.result(timeout)
        except LlogError as exc:
            return exc
        return None


class AsyncRecordFuture(_FutureBase):
    """``await`` it for the record's :class:`~llog_client.RecordMetadata` (or its
    error)."""

    __slots__ = ()

    def result(self) -> RecordMetadata:
        """The outcome of a settled record (``InvalidStateError``-like RuntimeError
        before)."""
        if not self._batch.finished:
            raise RuntimeError("the record is not settled yet: await it")
        return self._outcome()

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self._batch.finished:
            yield from self._batch.waiter.wait().__await__()
        return self._outcome()


def delivery_hook(callback: DeliveryCallback | None) -> Callable[[Batch], None]:
    """What runs for each finished batch: the caller's callback once per record."""
    if callback is None:
        return lambda batch: None

    def deliver(batch: Batch) -> None:
        batch.observed = True
        error = batch.error
        topic, partition, _ = batch.route
        for index in range(len(batch)):
            if error is not None:
                callback(None, error)
            else:
                callback(RecordMetadata(topic, partition, batch.base_offset + index,
                                        batch.duplicate), None)

    return deliver


def posts_for(client_args: dict[str, Any]) -> PostPool | None:
    """The producer's own connections for its requests to plain-HTTP brokers, unless a
    transport was given (tests put a fake broker there: every request goes to it)."""
    if client_args.get("transport") is not None:
        return None
    return PostPool(client_args.get("headers") or {})


def unobserved_error(batches: Sequence[Batch]) -> LlogError | None:
    """The first failure among ``batches`` that no caller has seen, marked seen: flush
    raises it, so no failure goes unnoticed."""
    for batch in batches:
        if batch.error is not None and not batch.observed:
            for other in batches:
                if other.error is not None:
                    other.observed = True
            return batch.error
    return None
