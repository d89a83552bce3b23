"""The blocking client."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from llog_client import _group_ops as group_ops
from llog_client import _ops as ops
from llog_client._batching import KeySource
from llog_client._compression import DEFAULT_COMPRESSION, Compression, checked
from llog_client._config import (
    MAP_SEND,
    NOT_SENT,
    ClientConfig,
    Routing,
    broken_of,
    broker_urls,
    default_headers,
    reply_of,
    routes_for,
)
from llog_client._errors import LlogError
from llog_client._models import (
    ConsumedRecord,
    Fetched,
    GroupDescription,
    GroupMembership,
    GroupPage,
    PartitionOffsets,
    Position,
    ProduceResult,
    RecordLike,
    Resume,
    Start,
    TopicDescription,
    TopicInfo,
    TopicPartitionKey,
)
from llog_client._params import (
    DEFAULT_FETCH_BYTES,
    DEFAULT_WAIT_MS,
    UNSET,
    as_records,
    as_topics,
    reset_entry,
    topic_changes,
    topic_config,
)
from llog_client._retry import ProduceLimits, RetryPolicy
from llog_client._wire import Outcome

if TYPE_CHECKING:  # the consumers read through this client: they import it
    from llog_client._consumer import Consumer, GroupConsumer

T = TypeVar("T")


class LlogClient:
    """A client of one or more leaderless-log brokers (any broker serves any
    partition). Thread-safe; close it (or use ``with``) to release its connections.
    Produce bodies are compressed with ``compression`` (zstd, gzip or none; bodies
    under 1 KiB go raw), and answers are accepted compressed with zstd or gzip. Without
    the ``zstd`` extra (zstandard) the default is gzip and answers come in gzip.

    ``route="preferred"`` sends each produce request that writes one partition straight
    to the broker that appends that partition (brokers with affinity on publish who that
    is at ``GET /cluster``); others, and any request when that broker does not answer, go
    to the brokers given. Use it when the client can reach every broker's advertised URL.

    >>> with LlogClient("http://127.0.0.1:8080") as llog:      # doctest: +SKIP
    ...     llog.produce("orders", ["alpha", b"\\x00\\x01"])
    ...     for record in llog.iter_records("orders", 0, start="earliest", follow=False):
    ...         print(record.offset, record.value)
    """

    def __init__(self, brokers: str | Sequence[str] | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, limits: ProduceLimits | None = None,
                 token: str | None = None, transport: httpx.BaseTransport | None = None,
                 compression: Compression = DEFAULT_COMPRESSION,
                 route: Routing = "any") -> None:
        self._config = ClientConfig(broker_urls(brokers), timeout_s, retry or RetryPolicy(),
                                    limits or ProduceLimits(), checked(compression),
                                    routes=routes_for(route))
        self._http = httpx.Client(headers=default_headers(token), transport=transport)
        self._transport_given = transport is not None  # the consumers' fast lane yields

    @property
    def compression(self) -> Compression:
        """How produce bodies are compressed: as given, else the default (zstd, or
        gzip when the ``zstd`` extra is not installed)."""
        return self._config.compression

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
        if self._config.needs_map(send):
            self._fetch_map()
        content, headers = self._config.request(send)
        outcome: Outcome = NOT_SENT
        for url in self._config.targets(send):
            try:
                response = self._http.request(send.method, url, content=content,
                                              headers=headers, timeout=self._config.timeout(send))
            except httpx.TransportError as exc:
                outcome = broken_of(exc)
                self._config.unanswered(send, url)
                if outcome.maybe_sent:  # it may have been written: the op decides
                    break
                continue  # nothing was sent: the next target at once
            self._config.answered(send, response)
            return reply_of(response)
        return outcome

    def _fetch_map(self) -> None:
        try:
            response: httpx.Response | None = self._http.get(
                self._config.url("/cluster"), timeout=self._config.timeout(MAP_SEND))
        except httpx.TransportError:
            response = None
        self._config.took_map(response)

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

        Raises a :class:`~llog_client.LlogError`; its ``produced`` lists the
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
                     retention_bytes: int | None = None, max_record_bytes: int | None = None,
                     compression: str | None = None, compression_level: int | None = None
                     ) -> TopicInfo:
        """A new topic; ``compression`` "none" or "zstd" (with ``compression_level``),
        None: the broker's default (LLOG_TOPIC_DEFAULT_COMPRESSION)."""
        config = topic_config(retention_ms, retention_bytes, max_record_bytes, compression,
                              compression_level)
        return self._run(ops.create_topic(topic, partitions, config, self._config.retry))

    def list_topics(self) -> list[TopicInfo]:
        return self._run(ops.list_topics(self._config.retry))

    def describe_topic(self, topic: str) -> TopicDescription:
        return self._run(ops.describe_topic(topic, self._config.retry))

    def update_topic(self, topic: str, *, partitions: int | None = None,
                     retention_ms: int | None | object = UNSET,
                     retention_bytes: int | None | object = UNSET,
                     max_record_bytes: int | None | object = UNSET,
                     compression: str | object = UNSET,
                     compression_level: int | None = None) -> TopicInfo:
        """Change only what is given; ``None`` clears a limit. Partitions only grow.
        ``compression`` sets the level too (``compression_level``; None: the default)."""
        changes = topic_changes(partitions, retention_ms, retention_bytes, max_record_bytes,
                                compression, compression_level)
        return self._run(ops.update_topic(topic, changes, self._config.retry))

    def delete_topic(self, topic: str) -> TopicInfo:
        return self._run(ops.delete_topic(topic, self._config.retry))

    # -- consumer groups -------------------------------------------------------------

    def join_group(self, group: str, topics: Iterable[str] | str, *,
                   client_id: str | None = None, session_timeout_ms: int | None = None
                   ) -> GroupMembership:
        """Join ``group`` to read ``topics``: a member id, the generation and this
        member's partitions. Heartbeat at least every ``heartbeat_interval_ms``."""
        return self._run(group_ops.join(group, as_topics(topics), client_id,
                                        session_timeout_ms, self._config.retry))

    def heartbeat(self, group: str, member_id: str) -> GroupMembership:
        """Keep the session; the current generation and this member's partitions.
        Raises ``UnknownMember`` when the session ended (join again)."""
        return self._run(group_ops.heartbeat(group, member_id, self._config.retry))

    def leave_group(self, group: str, member_id: str) -> bool:
        """Leave (its partitions move at once); False if it was no member any more."""
        return self._run(group_ops.leave(group, member_id, self._config.retry))

    def commit_offsets(self, group: str, offsets: Mapping[TopicPartitionKey, int], *,
                       member: GroupMembership | None = None) -> dict[TopicPartitionKey, int]:
        """Commit the last offset processed of each (topic, partition), as ``member``
        (it must own them in its generation), or without one for a group that has no
        live members."""
        return self._run(group_ops.commit(
            group, offsets, member.member_id if member else None,
            member.generation if member else None, self._config.retry))

    def fetch_many(self, positions: Mapping[TopicPartitionKey, Start], *,
                   max_wait_ms: int = 0, max_bytes: int = DEFAULT_FETCH_BYTES
                   ) -> list[Fetched | LlogError]:
        """One consume request over several partitions, each from its own offset: each
        partition's answer or its error, in the order given (the answer's byte budget
        goes to them in that order)."""
        return self._run(ops.fetch_many(positions, max_wait_ms=max_wait_ms,
                                           max_bytes=max_bytes, policy=self._config.retry))

    def fetch_group(self, group: str, positions: Mapping[TopicPartitionKey, Resume], *,
                    auto_offset_reset: Position = "earliest", max_wait_ms: int = 0,
                    max_bytes: int = DEFAULT_FETCH_BYTES) -> list[Fetched | LlogError]:
        """One consume request over several partitions; ``"committed"`` reads on from
        the group's committed offset. Each partition's answer or its error."""
        return self._run(group_ops.fetch(group, positions, reset=auto_offset_reset,
                                         max_wait_ms=max_wait_ms, max_bytes=max_bytes,
                                         policy=self._config.retry))

    def list_groups(self, *, after: str | None = None, limit: int = 100) -> GroupPage:
        return self._run(group_ops.page(after, limit, self._config.retry))

    def describe_group(self, group: str) -> GroupDescription:
        return self._run(group_ops.describe(group, self._config.retry))

    def reset_offsets(self, group: str, topic: str, *, partition: int | None = None,
                      to: Position | None = None, timestamp_ms: int | None = None,
                      offset: int | None = None) -> dict[TopicPartitionKey, int]:
        """Set the committed offsets of a group without live members, for one partition
        or (``partition`` None) every partition of ``topic``: to the ``earliest`` or
        ``latest``, to a time, or to ``offset`` (the last processed)."""
        entry = reset_entry(topic, partition, to, timestamp_ms, offset)
        return self._run(group_ops.reset(group, [entry], self._config.retry))

    def consumer(self, topics: Iterable[str] | str | None = None, **options: Any
                 ) -> Consumer:
        """A :class:`~llog_client.Consumer` reading through this client: ``topics``
        (with ``group=``, as a member of the group) or ``partitions=``."""
        from llog_client._consumer import Consumer

        return Consumer(self, topics, **options)

    def group_consumer(self, group: str, topics: Iterable[str] | str, **options: Any
                       ) -> GroupConsumer:
        """``consumer(topics, group=group)`` under its former name (its options too:
        ``auto_offset_reset`` is ``start``): see :class:`~llog_client.GroupConsumer`."""
        from llog_client._consumer import GroupConsumer

        return GroupConsumer(self, group, as_topics(topics), **options)
