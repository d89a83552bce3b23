"""The asyncio (and trio, through anyio) client: the same calls as
:class:`~app.client.sync.LlogClient`, awaited."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TypeVar

import anyio
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


class AsyncLlogClient:
    """See :class:`~app.client.sync.LlogClient`; every call is a coroutine, and
    ``iter_records`` / ``iter_batches`` are async iterators. Leaving an ``async for``
    early leaves its generator open until it is collected: wrap it in
    ``contextlib.aclosing`` to end its long-poll at once."""

    def __init__(self, brokers: str | Sequence[str] | None = None, *, timeout_s: float = 30.0,
                 retry: RetryPolicy | None = None, limits: ProduceLimits | None = None,
                 token: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._config = ClientConfig(broker_urls(brokers), timeout_s, retry or RetryPolicy(),
                                    limits or ProduceLimits())
        self._http = httpx.AsyncClient(headers=default_headers(token), transport=transport)

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
        try:
            response = await self._http.request(
                action.method, self._config.url(action.path), content=action.content,
                headers=self._config.headers(action), timeout=self._config.timeout(action))
        except httpx.TransportError as exc:
            return broken_of(exc)
        return reply_of(response)

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
        """See :meth:`LlogClient.produce <app.client.sync.LlogClient.produce>`."""
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
                           max_record_bytes: int | None = None) -> TopicInfo:
        config = topic_config(retention_ms, retention_bytes, max_record_bytes)
        return await self._run(ops.create_topic(topic, partitions, config, self._config.retry))

    async def list_topics(self) -> list[TopicInfo]:
        return await self._run(ops.list_topics(self._config.retry))

    async def describe_topic(self, topic: str) -> TopicDescription:
        return await self._run(ops.describe_topic(topic, self._config.retry))

    async def update_topic(self, topic: str, *, partitions: int | None = None,
                           retention_ms: int | None | object = UNSET,
                           retention_bytes: int | None | object = UNSET,
                           max_record_bytes: int | None | object = UNSET) -> TopicInfo:
        changes = topic_changes(partitions, retention_ms, retention_bytes, max_record_bytes)
        return await self._run(ops.update_topic(topic, changes, self._config.retry))

    async def delete_topic(self, topic: str) -> TopicInfo:
        return await self._run(ops.delete_topic(topic, self._config.retry))
