"""Which partition a keyed record goes to, computed as the broker computes it
(docs/http-api.md, Partitions by key): ``(murmur2(key) & 0x7fffffff) % partitions``,
murmur2 as Kafka's Java client has it (seed ``0x9747b28c``). The producer places keyed
records itself so that a batch names its partition: a batch holds many keys, and the
broker's by-key placement takes one key per entry. This is the one definition: the
broker places keyed entries with it too (app/storage/partitioner.py).
"""

from __future__ import annotations

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * _M) & _MASK
        k ^= k >> 24
        h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    left = length % 4
    if left == 3:
        h ^= data[whole + 2] << 16
    if left >= 2:
        h ^= data[whole + 1] << 8
    if left >= 1:
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions
