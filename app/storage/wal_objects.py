"""Shared WAL objects read whole, once, for every partition that wants a slice of them.

A shared WAL object (one per broker flush) holds a slice of every partition of the
flush. Consumers catching up on data not compacted yet (one client reading several
partitions, or several consumers each on its own) want all of those slices, one partition
at a time: fetched slice by slice, each object was downloaded once per partition, one
ranged GET per slice (about thirty per 4 MiB answer). Read whole instead, an object costs
one GET; its bytes stay in the reader's object cache and the next read of any of its
slices (another partition, another consumer) takes them from memory.

Bounded: an object is read whole only when the slice wanted ends within ``max_bytes``
(objects are at most ``LLOG_BATCH_MAX_BYTES`` as written; one larger than the bound is
read in its first ``max_bytes``, which hold the slice), and only when the cache can keep
it. The bytes are kept as fetched; each slice is verified against its index entry's
``crc32c`` every time it is used, so a corrupt object is reported as before, never
served. Concurrent reads of one object share one GET. An object the cache has already
dropped once is not read whole again (its slices are fetched alone): a catch-up larger
than the cache would otherwise fetch whole objects only to drop them before their other
partitions are read (a scan through an LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

import anyio

MAX_DROPPED_REMEMBERED = 4096  # object keys the cache dropped, remembered (FIFO)


class ObjectBytes(Protocol):
    """What this needs of the reader's object cache."""

    @property
    def max_bytes(self) -> int: ...

    wal_objects_read: int
    wal_slices_served: int

    def get_object(self, key: str) -> bytes | bytearray | None: ...

    def put_object(self, key: str, data: bytes | bytearray) -> bool: ...

    def dropped(self, key: str) -> bool: ...


class Fetcher(Protocol):
    async def get_head_buffer(self, key: str, length: int) -> bytes | bytearray: ...


@dataclass(eq=False)
class _Flight:
    done: anyio.Event = field(default_factory=anyio.Event)
    data: bytes | bytearray | None = None


class WalObjects:
    def __init__(self, s3: Fetcher, cache: ObjectBytes, max_bytes: int) -> None:
        self._s3 = s3
        self._cache = cache
        self.max_bytes = max_bytes
        self._flights: dict[str, _Flight] = {}

    def serves(self, key: str, end: int) -> bool:
        """Whether slices of ``key`` ending at byte ``end`` are read from the whole
        object (else each with a ranged GET of its own)."""
        return (0 < end <= self.max_bytes <= self._cache.max_bytes // 2
                and not self._cache.dropped(key))

    async def read(self, key: str, slices: int) -> bytes | bytearray:
        """The object's bytes (its first ``max_bytes`` at most), for ``slices`` slices:
        kept, being fetched by another read (then its GET is shared), or fetched now."""
        data = self._cache.get_object(key)
        if data is None:
            flight = self._flights.get(key)
            if flight is not None:
                await flight.done.wait()
                data = flight.data  # None when that fetch failed: try once more here
            if data is None:
                data = await self._fetch(key)
        self._cache.wal_slices_served += slices
        return data

    async def _fetch(self, key: str) -> bytes | bytearray:
        flight = self._flights[key] = _Flight()
        try:
            # Not copied into bytes: kept and read, never changed.
            data = flight.data = await self._s3.get_head_buffer(key, self.max_bytes)
            self._cache.wal_objects_read += 1
            self._cache.put_object(key, data)
        finally:
            # Waiters wake however this ends (cancelled, failed): they fetch themselves.
            if self._flights.get(key) is flight:
                del self._flights[key]
            flight.done.set()
        return data


class DroppedKeys:
    """The keys of whole objects the cache dropped, the last ``limit`` of them."""

    def __init__(self, limit: int = MAX_DROPPED_REMEMBERED) -> None:
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, key: str) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self._limit:
            self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys
