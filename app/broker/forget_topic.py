"""Forgetting what this process caches of a topic that changed (created, updated or
deleted here, or by another broker whose deletion this one finished)."""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from app.broker.topic_view import TopicDirectory
from app.broker.watch import PartitionWatch
from app.storage.keys import TopicPartition
from app.tailcache import TailCache


@dataclass(frozen=True)
class ForgetTopic:
    topics: TopicDirectory
    cache: TailCache
    watch: PartitionWatch

    async def __call__(self, topic: str, partitions: int = 0) -> None:
        """Forget the topic's entry in the topic directory, and the tail cache of its
        first ``partitions`` partitions (a deleted topic's)."""
        self.topics.forget(topic)
        if not partitions:
            return
        # Dropping a partition may remove files (a shared cache): in a worker thread.
        await anyio.to_thread.run_sync(_drop_cached, self.cache, topic, partitions)
        # And nothing cached of them is trusted again before a read of the log.
        for p in range(partitions):
            self.watch.notify_remote(TopicPartition(topic, p))


def _drop_cached(cache: TailCache, topic: str, partitions: int) -> None:
    for p in range(partitions):
        cache.drop(TopicPartition(topic, p))
