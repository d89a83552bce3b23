"""Which partition a keyed record goes to: Kafka's default partitioner.

``partition = (murmur2(key) & 0x7fffffff) % partitions``, with murmur2 exactly as Kafka's
Java client computes it (seed ``0x9747b28c``), so a key lands on the same partition
number here as it would in a Kafka topic with the same partition count.
"""

from __future__ import annotations

_M, _R, _SEED = 0x5BD1E995, 24, 0x9747B28C
_U32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash."""
    length = len(data)
    h = (_SEED ^ length) & _U32
    for i in range(0, length - length % 4, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * _M) & _U32
        k ^= k >> _R
        h = ((h * _M) & _U32) ^ ((k * _M) & _U32)
    tail, rem = length & ~3, length % 4
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h = ((h ^ data[tail]) * _M) & _U32
    h ^= h >> 13
    h = (h * _M) & _U32
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions
