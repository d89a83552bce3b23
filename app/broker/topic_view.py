"""The broker's view of the topic catalog: a bounded cache, auto-create, placement.

Produce and consume look topics up on every request, so the broker keeps what it read
for ``ttl_s`` (a topic created or grown elsewhere is seen within that time; a partition
beyond the cached count is looked up again before it is refused). With
``LLOG_AUTO_CREATE_TOPICS`` on, producing to an unknown topic creates it with
``LLOG_AUTO_CREATE_PARTITIONS`` partitions (or as many as the partition named needs), and
producing to a partition beyond the count grows the topic, to at most
``LLOG_MAX_TOPIC_PARTITIONS`` partitions (the limit ``POST /topics`` has: one produce
naming partition 57453 must not make a topic that every describe then reads whole); with
it off, both are refused (404) and nothing is written. A topic being deleted is refused
(404) either way, and is not created again until its deletion is done. While the catalog
cannot be read (its Oxia shard is electing a leader), a topic read in the last
``STALE_IF_UNREACHABLE_S`` is used as it was.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from app.errors import (
    InvalidRequest,
    LlogError,
    StorageUnavailable,
    UnknownPartition,
    UnknownTopic,
)
from app.storage.appends import AppendGroup
from app.storage.compression import Compression
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.storage.partitioner import partition_for_key
from app.storage.topic_catalog import MAX_PARTITIONS, Topic, TopicCatalog, TopicConfig
from app.storage.topic_compression import parse_compression

# How long a topic read before is used while the catalog cannot be read.
STALE_IF_UNREACHABLE_S = 60.0


@dataclass(frozen=True)
class Placement:
    """Where a produce entry goes, the topic's own record size limit, and how its
    appends are stored (from the cached catalog record: no Oxia read of its own)."""

    tp: TopicPartition
    max_record_bytes: int | None
    compression: Compression


def default_topic_config(compression: str) -> TopicConfig:
    """What a topic created without settings gets (``LLOG_TOPIC_DEFAULT_COMPRESSION``)."""
    name, level = parse_compression(compression)
    return TopicConfig(compression=name, compression_level=level).check()


class TopicDirectory:
    def __init__(self, catalog: TopicCatalog, *, auto_create: bool, auto_partitions: int,
                 ttl_s: float = 5.0, max_topics: int = 10_000,
                 max_partitions: int = MAX_PARTITIONS,
                 default_config: TopicConfig | None = None) -> None:
        self.catalog = catalog
        self.default_config = default_config or TopicConfig()
        self._max_partitions = min(max_partitions, MAX_PARTITIONS)
        self._auto_create = auto_create
        self._auto_partitions = auto_partitions
        self._ttl = ttl_s
        self._cache: LRUCache[str, tuple[Topic | None, float]] = LRUCache(max_topics)

    async def topic(self, name: str, *, fresh: bool = False) -> Topic | None:
        cached = self._cache.get(name)
        if cached is not None and not fresh and time.monotonic() - cached[1] < self._ttl:
            return cached[0]
        try:
            found = await self.catalog.get(name)
        except StorageUnavailable:
            # The catalog lives on one Oxia shard: while that shard elects a leader, a
            # topic read shortly before is still good (its partitions only grow), so
            # produce and consume to every topic do not stop with it.
            if (cached is None or cached[0] is None
                    or time.monotonic() - cached[1] > STALE_IF_UNREACHABLE_S):
                raise
            return cached[0]
        self._cache[name] = (found, time.monotonic())
        return found

    def forget(self, name: str) -> None:
        self._cache.pop(name, None)

    async def place(self, topic: str, partition: int | None, records: Sequence[Payload]
                    ) -> Placement:
        """The partition an entry goes to (by its records' key when it names none),
        creating or growing the topic when auto-create is on; refuses otherwise."""
        found = await self._existing(topic, partition)
        if partition is None:
            partition = partition_for_key(_one_key(topic, records), found.partitions)
        elif partition >= found.partitions:
            found = await self._grown(found, partition)
        return Placement(TopicPartition(topic, partition), found.config.max_record_bytes,
                         found.config.stored_as())

    async def stored_as(self, groups: Sequence[AppendGroup]) -> list[AppendGroup]:
        """``groups`` (placed by another broker) with their topics' compression, from
        the cached catalog records. A topic that cannot be looked up now is stored raw:
        compression saves bytes, it is never needed to read them."""
        out = []
        for group in groups:
            try:
                found = await self.topic(group.tp.topic)
            except LlogError:
                found = None
            out.append(group if found is None else
                       dataclasses.replace(group, compression=found.config.stored_as()))
        return out

    async def check_readable(self, tp: TopicPartition) -> None:
        """Refuse a partition of a topic being deleted, and one that does not exist
        unless auto-create makes every partition an (empty) log."""
        found = await self.topic(tp.topic)
        if found is not None and found.deleting is not None:
            raise _being_deleted(tp.topic)
        if self._auto_create:
            return
        if found is None:
            raise UnknownTopic(f"topic {tp.topic!r} does not exist")
        if tp.partition >= found.partitions:
            found = await self.topic(tp.topic, fresh=True) or found
            if tp.partition >= found.partitions:
                raise UnknownPartition(f"topic {tp.topic!r} has {found.partitions} "
                                       f"partitions; there is no partition {tp.partition}")

    async def _existing(self, topic: str, partition: int | None) -> Topic:
        found = await self.topic(topic)
        if found is not None and found.deleting is not None:
            raise _being_deleted(topic)
        if found is not None:
            return found
        if not self._auto_create:
            raise UnknownTopic(f"topic {topic!r} does not exist; create it first "
                               "(POST /topics)")
        wanted = max(self._auto_partitions, (partition or 0) + 1)
        if wanted > self._max_partitions:
            raise self._beyond(partition)
        created = await self.catalog.ensure(topic, wanted, self.default_config)
        self._cache[topic] = (created, time.monotonic())
        if created.deleting is not None:  # marked between the two reads
            raise _being_deleted(topic)
        return created

    async def _grown(self, found: Topic, partition: int) -> Topic:
        fresh = await self.topic(found.name, fresh=True) or found
        if partition < fresh.partitions:
            return fresh
        if not self._auto_create:
            raise UnknownPartition(f"topic {found.name!r} has {fresh.partitions} partitions; "
                                   f"there is no partition {partition}")
        if partition >= self._max_partitions:
            raise self._beyond(partition)
        grown = await self.catalog.grow(found.name, partition + 1)
        self._cache[found.name] = (grown, time.monotonic())
        return grown

    def _beyond(self, partition: int | None) -> InvalidRequest:
        return InvalidRequest(f"partition {partition} is beyond the {self._max_partitions} "
                              "partitions a topic may have (LLOG_MAX_TOPIC_PARTITIONS)")


def _being_deleted(topic: str) -> UnknownTopic:
    return UnknownTopic(f"topic {topic!r} is being deleted (GET /topics/{{topic}} answers "
                        "404 once it is gone)")


def _one_key(topic: str, records: Sequence[Payload]) -> bytes:
    keys = {r.key if isinstance(r, LogRecord) else None for r in records}
    if len(keys) != 1 or None in keys:
        raise InvalidRequest(f"an entry for topic {topic!r} without a partition needs one "
                             "key on every record (the partition is chosen by the key); "
                             "send records with other keys as other entries")
    (key,) = keys
    assert key is not None
    return key
