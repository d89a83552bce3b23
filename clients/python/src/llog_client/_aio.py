"""The asyncio (and trio, through anyio) client: the same calls as
:class:`~llog_client.LlogClient`, awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
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

if TYPE_CHECKING:  # the consumer reads through this client: it imports it
    from llog_client._aconsumer import AsyncConsumer

T = TypeVar("T")


class AsyncLlogClient:
    """See :class:`~llog_client.LlogClient`; every call is a coroutine, and
    ``iter_records`` / ``iter_batches`` are async iterators. Leaving an ``async for``
    early leaves its generator open until it is collected: wrap it in
    ``contextlib.aclosing`` to end its long-poll at once."""

    def __init__(self, brokers: str | Sequence[str] | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, limits: ProduceLimits | None = None,
                 token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 compression: Compression = DEFAULT_COMPRESSION,
                 route: Routing = "any") -> None:
        self._config = ClientConfig(broker_urls(brokers), timeout_s, retry or RetryPolicy(),
                                    limits or ProduceLimits(), checked(compression),
                                    routes=routes_for(route))
        self._http = httpx.AsyncClient(headers=default_headers(token), transport=transport)
        self._transport_given = transport is not None  # the consumers' fast lane yields

    @property
    def compression(self) -> Compression:
        """How produce bodies are compressed: as given, else the default (zstd, or
        gzip when the ``zstd`` extra is not installed)."""
        return self._config.compression

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLlogClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- driving operations ---------------------------------------------------------

    async def _act(self, action: ops.Action) -> Outcome | None:
        if isinstance(action, ops.Pause):
            await anyio.sleep(action.delay_s)
            self._config.next_broker()
            return None
        if self._config.needs_map(action):
            await self._fetch_map()
        if self._config.compresses_off_thread(action):
            content, headers = await anyio.to_thread.run_sync(self._config.request, action)
        else:
            content, headers = self._config.request(action)
        outcome: Outcome = NOT_SENT
        for url in self._config.targets(action):
            try:
                response = await self._http.request(action.method, url, content=content,
                                                    headers=headers,
                                                    timeout=self._config.timeout(action))
            except httpx.TransportError as exc:
                outcome = broken_of(exc)
                self._config.unanswered(action, url)
                if outcome.maybe_sent:  # it may have been written: the op decides
                    break
                continue  # nothing was sent: the next target at once
            self._config.answered(action, response)
            return reply_of(response)
        return outcome

    async def _fetch_map(self) -> None:
        try:
            response: httpx.Response | None = await self._http.get(
                self._config.url("/cluster"), timeout=self._config.timeout(MAP_SEND))
        except httpx.TransportError:
            response = None
        self._config.took_map(response)

    async def _drive(self, op: ops.Follow) -> AsyncIterator[Fetched]:
        answer: Outcome | None = None
        while True:
            try:
                action = op.send(answer)
            except StopIteration:
                return
            answer = None
            if isinstance(action, ops.Deliver):
                yield action.fetched
            else:
                answer = await self._act(action)

    async def _run(self, op: ops.Op[T]) -> T:
        kept: list[T] = []
        async for _ in self._drive(ops.keep_result(op, kept)):
            raise AssertionError("an operation delivered records to no reader")
        return kept[0]

    # -- produce ---------------------------------------------------------------------

    async def produce(self, topic: str, records: Iterable[RecordLike] | RecordLike, *,
                      partition: int | None = None, idempotency_key: str | None = None
                      ) -> ProduceResult:
        """See :meth:`LlogClient.produce <llog_client.LlogClient.produce>`."""
        keys = self._config.keys if idempotency_key is None else KeySource(idempotency_key)
        return await self._run(ops.produce(topic, as_records(records), partition,
                                           self._config.limits, keys, self._config.retry))

    # -- consume ---------------------------------------------------------------------

    async def fetch(self, topic: str, partition: int = 0, offset: Start = "earliest", *,
                    max_wait_ms: int = 0, max_bytes: int = DEFAULT_FETCH_BYTES) -> Fetched:
        return await self._run(ops.fetch(topic, partition, offset, max_wait_ms=max_wait_ms,
                                         max_bytes=max_bytes, policy=self._config.retry))

    async def iter_batches(self, topic: str, partition: int = 0, start: Start = "earliest", *,
                           follow: bool = True, max_wait_ms: int = DEFAULT_WAIT_MS,
                           max_bytes: int = DEFAULT_FETCH_BYTES) -> AsyncIterator[Fetched]:
        op = ops.follow(topic, partition, start, forever=follow, max_wait_ms=max_wait_ms,
                        max_bytes=max_bytes, policy=self._config.retry)
        async for fetched in self._drive(op):
            yield fetched

    async def iter_records(self, topic: str, partition: int = 0, start: Start = "earliest", *,
                           follow: bool = True, max_wait_ms: int = DEFAULT_WAIT_MS,
                           max_bytes: int = DEFAULT_FETCH_BYTES
                           ) -> AsyncIterator[ConsumedRecord]:
        async for fetched in self.iter_batches(topic, partition, start, follow=follow,
                                               max_wait_ms=max_wait_ms, max_bytes=max_bytes):
            for record in fetched.records:
                yield record

    # -- offsets and topics ----------------------------------------------------------

    async def offsets(self, topic: str, partition: int = 0, *,
                      timestamp_ms: int | None = None) -> PartitionOffsets:
        return await self._run(ops.offsets(topic, partition, timestamp_ms, self._config.retry))

    async def create_topic(self, topic: str, partitions: int = 1, *,
                           retention_ms: int | None = None, retention_bytes: int | None = None,
                           max_record_bytes: int | None = None, compression: str | None = None,
                           compression_level: int | None = None) -> TopicInfo:
        config = topic_config(retention_ms, retention_bytes, max_record_bytes, compression,
                              compression_level)
        return await self._run(ops.create_topic(topic, partitions, config, self._config.retry))

    async def list_topics(self) -> list[TopicInfo]:
        return await self._run(ops.list_topics(self._config.retry))

    async def describe_topic(self, topic: str) -> TopicDescription:
        return await self._run(ops.describe_topic(topic, self._config.retry))

    async def update_topic(self, topic: str, *, partitions: int | None = None,
                           retention_ms: int | None | object = UNSET,
                           retention_bytes: int | None | object = UNSET,
                           max_record_bytes: int | None | object = UNSET,
                           compression: str | object = UNSET,
                           compression_level: int | None = None) -> TopicInfo:
        changes = topic_changes(partitions, retention_ms, retention_bytes, max_record_bytes,
                                compression, compression_level)
        return await self._run(ops.update_topic(topic, changes, self._config.retry))

    async def delete_topic(self, topic: str) -> TopicInfo:
        return await self._run(ops.delete_topic(topic, self._config.retry))

    # -- consumer groups: the calls of LlogClient (_sync.py), awaited -------

    async def join_group(self, group: str, topics: Iterable[str] | str, *,
                         client_id: str | None = None, session_timeout_ms: int | None = None
                         ) -> GroupMembership:
        return await self._run(group_ops.join(group, as_topics(topics), client_id,
                                              session_timeout_ms, self._config.retry))

    async def heartbeat(self, group: str, member_id: str) -> GroupMembership:
        return await self._run(group_ops.heartbeat(group, member_id, self._config.retry))

    async def leave_group(self, group: str, member_id: str) -> bool:
        return await self._run(group_ops.leave(group, member_id, self._config.retry))

    async def commit_offsets(self, group: str, offsets: Mapping[TopicPartitionKey, int], *,
                             member: GroupMembership | None = None
                             ) -> dict[TopicPartitionKey, int]:
        return await self._run(group_ops.commit(
            group, offsets, member.member_id if member else None,
            member.generation if member else None, self._config.retry))

    async def fetch_many(self, positions: Mapping[TopicPartitionKey, Start], *,
                   max_wait_ms: int = 0, max_bytes: int = DEFAULT_FETCH_BYTES
                   ) -> list[Fetched | LlogError]:
        """One consume request over several partitions, each from its own offset: each
        partition's answer or its error, in the order given (the answer's byte budget
        goes to them in that order)."""
        return await self._run(ops.fetch_many(positions, max_wait_ms=max_wait_ms,
                                           max_bytes=max_bytes, policy=self._config.retry))

    async def fetch_group(self, group: str, positions: Mapping[TopicPartitionKey, Resume],
                          *, auto_offset_reset: Position = "earliest", max_wait_ms: int = 0,
                          max_bytes: int = DEFAULT_FETCH_BYTES) -> list[Fetched | LlogError]:
        return await self._run(group_ops.fetch(
            group, positions, reset=auto_offset_reset, max_wait_ms=max_wait_ms,
            max_bytes=max_bytes, policy=self._config.retry))

    async def list_groups(self, *, after: str | None = None, limit: int = 100) -> GroupPage:
        return await self._run(group_ops.page(after, limit, self._config.retry))

    async def describe_group(self, group: str) -> GroupDescription:
        return await self._run(group_ops.describe(group, self._config.retry))

    async def reset_offsets(self, group: str, topic: str, *, partition: int | None = None,
                            to: Position | None = None, timestamp_ms: int | None = None,
                            offset: int | None = None) -> dict[TopicPartitionKey, int]:
        entry = reset_entry(topic, partition, to, timestamp_ms, offset)
        return await self._run(group_ops.reset(group, [entry], self._config.retry))

    def consumer(self, topics: Iterable[str] | str | None = None, **options: Any
                 ) -> AsyncConsumer:
        """An :class:`~llog_client.AsyncConsumer` reading through this client (use it
        in ``async with``): ``topics`` (with ``group=``, as a member) or
        ``partitions=``."""
        from llog_client._aconsumer import AsyncConsumer

        return AsyncConsumer(self, topics, **options)
