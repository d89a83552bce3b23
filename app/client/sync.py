"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import httpx

from app.client import ops
from app.client.batching import KeySource
from app.client.config import (
    ClientConfig,
    broken_of,
    broker_urls,
    default_headers,
    reply_of,
)
from app.client.models import (
    ConsumedRecord,
    Fetched,
    PartitionOffsets,
    ProduceResult,
    RecordLike,
    Start,
    TopicDescription,
    TopicInfo,
)
from app.client.params import (
    DEFAULT_FETCH_BYTES,
    DEFAULT_WAIT_MS,
    UNSET,
    as_records,
    topic_changes,
    topic_config,
)
from app.client.retry import ProduceLimits, RetryPolicy
from app.client.wire import Outcome

T = TypeVar("T")


class LlogClient:
    """A client of one or more leaderless-log brokers (any broker serves any
    partition). Thread-safe; close it (or use ``with``) to release its connections.

    >>> with LlogClient("http://127.0.0.1:8080") as llog:      # doctest: +SKIP
    ...     llog.produce("orders", ["alpha", b"\\x00\\x01"])
    ...     for record in llog.iter_records("orders", 0, start="earliest", follow=False):
    ...         print(record.offset, record.value)
    """

    def __init__(self, brokers: str | Sequence[str] | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, limits: ProduceLimits | None = None,
                 token: str | None = None, transport: httpx.BaseTransport | None = None) -> None:
        self._config = ClientConfig(broker_urls(brokers), timeout_s, retry or RetryPolicy(),
                                    limits or ProduceLimits())
        self._http = httpx.Client(headers=default_headers(token), transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LlogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driving operations ---------------------------------------------------------

    def _drive(self, op: ops.Follow) -> Iterator[Fetched]:
        answer: Outcome | None = None
        while True:
            try:
                action = op.send(answer)
            except StopIteration:
                return
            answer = None
            if isinstance(action, ops.Deliver):
                yield action.fetched
            elif isinstance(action, ops.Pause):
                time.sleep(action.delay_s)
                self._config.next_broker()
            else:
                answer = self._send(action)

    def _send(self, send: ops.Send) -> Outcome:
        try:
            response = self._http.request(
                send.method, self._config.url(send.path), content=send.content,
                headers=self._config.headers(send), timeout=self._config.timeout(send))
        except httpx.TransportError as exc:
            return broken_of(exc)
        return reply_of(response)

    def _run(self, op: ops.Op[T]) -> T:
        kept: list[T] = []
        for _ in self._drive(ops.keep_result(op, kept)):
            raise AssertionError("an operation delivered records to no reader")
        return kept[0]

    # -- produce ---------------------------------------------------------------------

    def produce(self, topic: str, records: Iterable[RecordLike] | RecordLike, *,
                partition: int | None = None, idempotency_key: str | None = None
                ) -> ProduceResult:
        """Append records, many per request, each batch with an idempotency key, retrying
        what may succeed without ever storing a record twice. Without ``partition``,
        records with a key go to the key's partition and the others to partition 0.

        Raises a :class:`~app.client.errors.LlogError`; its ``produced`` lists the
        batches acknowledged before the failure."""
        return self._run(ops.produce(topic, as_records(records), partition,
                                     self._config.limits, self._keys(idempotency_key),
                                     self._config.retry))

    def _keys(self, prefix: str | None) -> KeySource:
        return self._config.keys if prefix is None else KeySource(prefix)

    # -- consume ---------------------------------------------------------------------

    def fetch(self, topic: str, partition: int = 0, offset: Start = "earliest", *,
              max_wait_ms: int = 0, max_bytes: int = DEFAULT_FETCH_BYTES) -> Fetched:
        """One consume request: what is there from ``offset`` on, waiting up to
        ``max_wait_ms`` for something to arrive."""
        return self._run(ops.fetch(topic, partition, offset, max_wait_ms=max_wait_ms,
                                   max_bytes=max_bytes, policy=self._config.retry))

    def iter_batches(self, topic: str, partition: int = 0, start: Start = "earliest", *,
                     follow: bool = True, max_wait_ms: int = DEFAULT_WAIT_MS,
                     max_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[Fetched]:
        """Each non-empty answer from ``start`` on; with ``follow``, long-polls at the
        tail forever, otherwise stops at the end of the log."""
        op = ops.follow(topic, partition, start, forever=follow, max_wait_ms=max_wait_ms,
                        max_bytes=max_bytes, policy=self._config.retry)
        yield from self._drive(op)

    def iter_records(self, topic: str, partition: int = 0, start: Start = "earliest", *,
                     follow: bool = True, max_wait_ms: int = DEFAULT_WAIT_MS,
                     max_bytes: int = DEFAULT_FETCH_BYTES) -> Iterator[ConsumedRecord]:
        """The records from ``start`` (``"earliest"``, ``"latest"`` or an offset) on."""
        for fetched in self.iter_batches(topic, partition, start, follow=follow,
                                         max_wait_ms=max_wait_ms, max_bytes=max_bytes):
            yield from fetched.records

    # -- offsets and topics ----------------------------------------------------------

    def offsets(self, topic: str, partition: int = 0, *, timestamp_ms: int | None = None
                ) -> PartitionOffsets:
        """Log start and high watermark; with ``timestamp_ms`` also the first offset
        appended at or after that time."""
        return self._run(ops.offsets(topic, partition, timestamp_ms, self._config.retry))

    def create_topic(self, topic: str, partitions: int = 1, *, retention_ms: int | None = None,
                     retention_bytes: int | None = None, max_record_bytes: int | None = None
                     ) -> TopicInfo:
        config = topic_config(retention_ms, retention_bytes, max_record_bytes)
        return self._run(ops.create_topic(topic, partitions, config, self._config.retry))

    def list_topics(self) -> list[TopicInfo]:
        return self._run(ops.list_topics(self._config.retry))

    def describe_topic(self, topic: str) -> TopicDescription:
        return self._run(ops.describe_topic(topic, self._config.retry))

    def update_topic(self, topic: str, *, partitions: int | None = None,
                     retention_ms: int | None | object = UNSET,
                     retention_bytes: int | None | object = UNSET,
                     max_record_bytes: int | None | object = UNSET) -> TopicInfo:
        """Change only what is given; ``None`` clears a limit. Partitions only grow."""
        changes = topic_changes(partitions, retention_ms, retention_bytes, max_record_bytes)
        return self._run(ops.update_topic(topic, changes, self._config.retry))

    def delete_topic(self, topic: str) -> TopicInfo:
        return self._run(ops.delete_topic(topic, self._config.retry))
