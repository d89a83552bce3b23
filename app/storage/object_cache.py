"""The reader's cache of immutable objects: verified, decoded whole objects and
compacted chunks, and the bytes of shared WAL objects read whole; bounded by bytes,
least recently used out first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cachetools import LRUCache

from app.storage.batch import RecordBatch, records_size
from app.storage.log_record import Payload
from app.storage.wal_objects import DroppedKeys

Records = Sequence[Payload]


@dataclass(frozen=True)
class ObjectCacheStats:
    items: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    wal_objects_read: int = 0
    wal_slices_served: int = 0


_WAL_OBJECT = -2  # the part under which a shared WAL object's bytes are kept


class ObjectCache:
    """Verified, decoded whole objects and compacted chunks, and the bytes of shared WAL
    objects read whole (app/storage/wal_objects.py: each slice is verified when used),
    kept across reads (least recently used out first, bounded by bytes). Objects are
    immutable, so a cached copy is never stale; without it, consumers catching up on the
    same data would download, check and decode it again for every fetch."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._items = _CountingLRU(max(max_bytes, 1), getsizeof=lambda item: item[1])
        self.hits = 0
        self.misses = 0
        self.wal_objects_read = 0
        self.wal_slices_served = 0

    @property
    def max_bytes(self) -> int:
        return self._max

    def get(self, key: str, part: int = -1) -> Records | None:
        item = self._items.get((key, part))
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        assert not isinstance(item[0], bytes | bytearray)
        return item[0]

    def get_object(self, key: str) -> bytes | bytearray | None:
        """A shared WAL object's bytes, as kept by :meth:`put_object`."""
        item = self._items.get((key, _WAL_OBJECT))
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        assert isinstance(item[0], bytes | bytearray)
        return item[0]

    def put_object(self, key: str, data: bytes | bytearray) -> bool:
        """Keep a shared WAL object's bytes (not verified: its slices are, when used);
        whether they were kept.

        Kept as stored, compressed slices and all, and counted at that size (what the
        cache holds). Decoded copies would be the bigger cost: JSON logs decode to about
        twelve times their stored bytes, so the same bound would keep a twelfth of the
        objects, and a catch-up over many partitions would fetch each object again.
        Decompressing a slice again when it is used costs about 1 ms per MiB of records
        (zstd, one core; measured 0.3 to 1.1 GB/s on a loaded 2-core machine), in a
        worker thread for large slices (app/storage/slices.py), beside the CRC32C check
        every use makes anyway."""
        if len(data) > self._max // 2:
            return False
        self._items[(key, _WAL_OBJECT)] = (data, len(data))
        return True

    def holds_object(self, key: str) -> bool:
        """Whether the WAL object ``key`` is kept (not counted as a lookup)."""
        return (key, _WAL_OBJECT) in self._items

    def dropped(self, key: str) -> bool:
        """Whether the cache kept the WAL object ``key`` once and dropped it since."""
        return key in self._items.dropped

    def put(self, key: str, records: Records, part: int = -1) -> None:
        # Decoded records cost their bytes and an object each; a body kept in its
        # columns costs its bytes, and as much again once someone decodes it.
        size = records_size(records) + 64 * len(records)
        if isinstance(records, RecordBatch):
            size += len(records.body)
        if size <= self._max // 2:
            self._items[(key, part)] = (records, size)

    def holds(self, key: str, part: int = -1) -> bool:
        """Whether the cache has it (not counted as a lookup)."""
        return (key, part) in self._items

    def statistics(self) -> ObjectCacheStats:
        items = self._items
        evictions = items.evictions if isinstance(items, _CountingLRU) else 0
        return ObjectCacheStats(len(items), int(items.currsize), self._max, self.hits,
                                self.misses, evictions, self.wal_objects_read,
                                self.wal_slices_served)


# A WAL object's bytes may be the buffer they were read into: kept, never changed.
_Cached = tuple[Records | bytes | bytearray, int]


class _CountingLRU(LRUCache[tuple[str, int], _Cached]):
    evictions = 0

    def __init__(self, maxsize: int, getsizeof: Callable[[_Cached], int]) -> None:
        super().__init__(maxsize, getsizeof=getsizeof)
        self.dropped = DroppedKeys()

    def popitem(self) -> tuple[tuple[str, int], _Cached]:
        self.evictions += 1
        item = super().popitem()
        if item[0][1] == _WAL_OBJECT:
            self.dropped.add(item[0][0])
        return item
