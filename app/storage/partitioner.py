"""Which partition a keyed record goes to: Kafka's default partitioner.

``partition = (murmur2(key) & 0x7fffffff) % partitions``, with murmur2 exactly as Kafka's
Java client computes it (seed ``0x9747b28c``), so a key lands on the same partition
number here as it would in a Kafka topic with the same partition count.

The definition lives in the client package (``llog_client._partitioner``), which the
broker depends on: the client's producer places keyed records itself, and one definition
for both sides means they cannot drift apart.
"""

from __future__ import annotations

from llog_client._partitioner import murmur2, partition_for_key

__all__ = ["murmur2", "partition_for_key"]
