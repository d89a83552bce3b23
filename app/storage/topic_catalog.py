"""The topic catalog: which topics exist, with how many partitions and what retention.

One Oxia record per topic, ``{root}/_topics/{topic}`` (partition key ``_topics``, so the
whole catalog lives on one shard and lists with one range scan), changed only by
compare-and-set. A topic's partitions are ``0 … partitions-1``; the count only grows.

Deleting a topic first marks its record ``deleting`` (from then on it is produced to and
read by no broker, and its name cannot be taken again), then moves the log start of each
of its partitions past its high watermark (retention to infinity: compaction and vacuum
then free its data), and last removes the record (app/storage/topic_deletion.py). Offsets
are never reused: a topic created again under the same name continues where the old one
stopped.
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from dataclasses import dataclass
from typing import Any

import anyio
from cachetools import LRUCache

from app.errors import CorruptData, InvalidRequest, TopicExists, UnknownTopic, VersionMismatch
from app.storage.cas import Done, Retry, cas_loop
from app.storage.compression import Compression
from app.storage.keys import KeyLayout, validate_topic
from app.storage.metadata import now_ms
from app.storage.topic_compression import topic_compression
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

PARTITION_KEY = "_topics"
MAX_PARTITIONS = 100_000  # per topic
# The most partitions one describe reads (under a second on the measured machine:
# bench/topic_limits.py).
DESCRIBE_PAGE_MAX = 1_000
_ATTEMPTS = 16


@dataclass(frozen=True)
class TopicConfig:
    """What an operator sets: None means unlimited (no retention, the broker's limit).
    ``compression``/``compression_level``: how new appends' bodies are stored
    (app/storage/topic_compression.py; absent from a record: none)."""

    retention_ms: int | None = None
    retention_bytes: int | None = None
    max_record_bytes: int | None = None
    compression: str = "none"
    compression_level: int | None = None

    def check(self) -> TopicConfig:
        for name in ("retention_ms", "retention_bytes", "max_record_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 1):
                raise InvalidRequest(f"{name} must be a positive integer or null")
        self.stored_as()
        return self

    def stored_as(self) -> Compression:
        """The compression new appends of the topic are stored with."""
        return topic_compression(self.compression, self.compression_level)


@dataclass(frozen=True)
class Deletion:
    """A topic's deletion under way: who empties its partitions, until when that
    process holds the work (a lease it renews; past it, any broker takes the work
    over), and how far it got (partitions ``0 … emptied-1`` are empty)."""

    started_ms: int
    by: str
    lease_until_ms: int
    emptied: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Deletion:
        return cls(int(data["started_ms"]), str(data["by"]), int(data["lease_until_ms"]),
                   int(data.get("emptied", 0)))


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    config: TopicConfig
    created_at_ms: int
    version: int = -1  # the catalog record's Oxia version
    deleting: Deletion | None = None  # set once a delete has started

    def to_json(self) -> bytes:
        deleting = {} if self.deleting is None else {
            "deleting": dataclasses.asdict(self.deleting)}
        return json.dumps({"topic": self.name, "partitions": self.partitions,
                           "created_at_ms": self.created_at_ms,
                           **dataclasses.asdict(self.config), **deleting}).encode()

    @classmethod
    def from_json(cls, raw: bytes, version: int) -> Topic:
        try:
            data: dict[str, Any] = json.loads(raw)
            topic = cls(str(data["topic"]), int(data["partitions"]), TopicConfig(
                retention_ms=data.get("retention_ms"),
                retention_bytes=data.get("retention_bytes"),
                max_record_bytes=data.get("max_record_bytes"),
                compression=data.get("compression") or "none",
                compression_level=data.get("compression_level")).check(),
                int(data.get("created_at_ms", 0)), version,
                None if data.get("deleting") is None else Deletion.from_json(data["deleting"]))
        except (ValueError, KeyError, TypeError, InvalidRequest) as exc:
            raise CorruptData(f"a topic catalog record does not parse: {exc}") from None
        if topic.partitions < 1:
            raise CorruptData(f"topic {topic.name!r} has {topic.partitions} partitions")
        return topic


def check_partitions(partitions: object) -> int:
    if (not isinstance(partitions, int) or isinstance(partitions, bool)
            or not 1 <= partitions <= MAX_PARTITIONS):
        raise InvalidRequest(f"partitions must be an integer in 1..{MAX_PARTITIONS}")
    return partitions


class TopicCatalog:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout, *,
                 max_growing: int = 10_000) -> None:
        self._oxia = oxia
        self._layout = layout
        # Growth of a topic's partition count, one compare-and-set at a time per topic
        # (see grow): the locks, and the most partitions any waiter wants.
        self._grow_locks: weakref.WeakValueDictionary[str, anyio.Lock] = (
            weakref.WeakValueDictionary())
        self._wanted: LRUCache[str, int] = LRUCache(max_growing)

    def _key(self, topic: str) -> str:
        return self._layout.topic_record(validate_topic(topic))

    async def get(self, topic: str) -> Topic | None:
        found = await self._oxia.get(self._key(topic), PARTITION_KEY)
        return None if found is None else Topic.from_json(found.value, found.version_id)

    async def list(self) -> list[Topic]:
        prefix = self._layout.topic_record("")
        records = await self._oxia.range_scan(prefix, prefix + "~", PARTITION_KEY)
        return [Topic.from_json(r.value, r.version_id) for r in records
                if r.key.startswith(prefix)]

    async def create(self, topic: str, partitions: int, config: TopicConfig | None = None
                     ) -> Topic:
        """Create ``topic``; :class:`TopicExists` if it does."""
        made = Topic(validate_topic(topic), check_partitions(partitions),
                     (config or TopicConfig()).check(), now_ms())
        try:
            version = await self._oxia.put(self._key(topic), made.to_json(), PARTITION_KEY,
                                           expected_version=EXPECT_NOT_EXISTS)
        except VersionMismatch:
            found = await self.get(topic)
            if found is not None and found.deleting is not None:
                raise TopicExists(f"topic {topic!r} is being deleted; its name is free "
                                  "once GET /topics/{topic} answers 404") from None
            raise TopicExists(f"topic {topic!r} exists already") from None
        return dataclasses.replace(made, version=version)

    async def ensure(self, topic: str, partitions: int, config: TopicConfig | None = None
                     ) -> Topic:
        """The topic, created with ``partitions`` (and ``config``) if it does not exist
        (auto-create)."""
        found = await self.get(topic)
        if found is not None:
            return found
        try:
            return await self.create(topic, partitions, config)
        except TopicExists:
            again = await self.get(topic)
            if again is None:
                raise UnknownTopic(f"topic {topic!r} was deleted while it was created"
                                   ) from None
            return again

    async def register(self, topic: str, partition: int) -> Topic:
        """Make sure the catalog knows ``topic`` with at least ``partition + 1``
        partitions (every path that writes a partition calls this once per process)."""
        found = await self.ensure(topic, partition + 1)
        if found.deleting is not None:  # no writer brings a topic back while it goes
            raise UnknownTopic(f"topic {topic!r} is being deleted")
        if partition < found.partitions:
            return found
        return await self.grow(topic, partition + 1)

    async def grow(self, topic: str, min_partitions: int) -> Topic:
        """The topic with at least ``min_partitions`` partitions.

        Writers to many new partitions of one topic all want its one record changed: at
        once, their compare-and-sets would mostly fail and retry against each other. In
        this process they take turns instead, and a turn grows the topic to the most any
        waiter wants, so a burst costs one write, and the waiters after it one read."""
        check_partitions(min_partitions)
        self._wanted[topic] = max(self._wanted.get(topic, 0), min_partitions)
        lock = self._grow_locks.get(topic)
        if lock is None:
            lock = self._grow_locks[topic] = anyio.Lock()
        async with lock:
            target = max(self._wanted.pop(topic, 0), min_partitions)
            return await self.update(topic, min_partitions=target)

    async def update(self, topic: str, *, partitions: int | None = None,
                     min_partitions: int | None = None,
                     config: dict[str, Any] | None = None) -> Topic:
        """Grow the partition count (to ``partitions``, or to at least
        ``min_partitions``) and/or change the configuration (by CAS)."""

        async def attempt(_: int) -> Done[Topic] | Retry:
            current = await self.get(topic)
            if current is None:
                raise UnknownTopic(f"topic {topic!r} does not exist")
            if current.deleting is not None:
                raise UnknownTopic(f"topic {topic!r} is being deleted")
            count = max(current.partitions, check_partitions(min_partitions or 1))
            if partitions is None and config is None and count == current.partitions:
                return Done(current)  # as large as wanted already: nothing to write
            if partitions is not None:
                if check_partitions(partitions) < current.partitions:
                    raise InvalidRequest(f"topic {topic!r} has {current.partitions} "
                                         "partitions; a topic's partitions only grow")
                count = partitions
            settings = dataclasses.replace(current.config, **(config or {})).check()
            updated = dataclasses.replace(current, partitions=count, config=settings)
            try:
                version = await self._oxia.put(self._key(topic), updated.to_json(),
                                               PARTITION_KEY, expected_version=current.version)
            except VersionMismatch:
                return Retry("conflict")
            return Done(dataclasses.replace(updated, version=version))

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"topic {topic}: update")

    async def mark_deleting(self, topic: str, by: str, now: int, lease_ms: int) -> Topic:
        """The topic marked ``deleting`` at ``now`` (epoch ms; held by ``by`` for
        ``lease_ms``), or as it is if a delete has started already: deleting twice is
        deleting once."""

        async def attempt(_: int) -> Done[Topic] | Retry:
            current = await self.get(topic)
            if current is None:
                raise UnknownTopic(f"topic {topic!r} does not exist")
            if current.deleting is not None:
                return Done(current)
            try:
                return Done(await self._put_deletion(current, Deletion(now, by, now + lease_ms)))
            except VersionMismatch:
                return Retry("conflict")

        return await cas_loop(attempt, attempts=_ATTEMPTS, what=f"topic {topic}: delete")

    async def hold_deletion(self, topic: Topic, by: str, lease_until_ms: int, emptied: int
                            ) -> Topic:
        """Renew (or take over) the lease of ``topic``'s deletion, recording how far
        it got; :class:`VersionMismatch` if the record changed since ``topic`` was read
        (another process took the work over, or removed it)."""
        assert topic.deleting is not None
        return await self._put_deletion(topic, dataclasses.replace(
            topic.deleting, by=by, lease_until_ms=lease_until_ms, emptied=emptied))

    async def _put_deletion(self, topic: Topic, deletion: Deletion) -> Topic:
        marked = dataclasses.replace(topic, deleting=deletion)
        version = await self._oxia.put(self._key(topic.name), marked.to_json(), PARTITION_KEY,
                                       expected_version=topic.version)
        return dataclasses.replace(marked, version=version)

    async def remove(self, topic: Topic) -> None:
        """Drop the catalog record (the caller has trimmed the partitions)."""
        try:
            await self._oxia.delete(self._key(topic.name), PARTITION_KEY,
                                    expected_version=topic.version)
        except VersionMismatch:
            raise UnknownTopic(f"topic {topic.name!r} changed while it was deleted; "
                               "try again") from None
