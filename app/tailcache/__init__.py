"""Recent records per partition, served to consumers at the hot tail without Oxia/S3.

:func:`open_tail_cache` picks the implementation: in memory for a single process, or a
directory shared by the uvicorn workers of one host (``LLOG_TAIL_CACHE_DIR``), so that a
consumer served by one worker sees what another worker wrote. The directory keeps the
records of each store apart by a store id (see :mod:`app.tailcache.files`), so that it
never serves records of a store that was reset or of another deployment on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from app.tailcache.base import CacheHit, TailCache, TailCacheStats
from app.tailcache.files import FileTailCache, store_id_of
from app.tailcache.memory import MemoryTailCache

__all__ = [
    "CacheHit",
    "FileTailCache",
    "MemoryTailCache",
    "TailCache",
    "TailCacheStats",
    "open_tail_cache",
    "run_cache_io",
    "store_id_of",
]

T = TypeVar("T")


def open_tail_cache(directory: Path | None, max_bytes: int, *, store_id: str,
                    max_partitions: int = 10_000) -> TailCache:
    """A :class:`FileTailCache` of store ``store_id`` in ``directory``, indexing at most
    ``max_partitions`` partitions, or a :class:`MemoryTailCache` if ``directory`` is None
    (one process serves one store, so it needs neither)."""
    if directory is None:
        return MemoryTailCache(max_bytes, store_id=store_id)
    return FileTailCache(directory, max_bytes, store_id=store_id,
                         max_partitions=max_partitions)


async def run_cache_io(cache: TailCache, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn(*args)`` on the cache without blocking the event loop: the file-backed
    cache does file I/O, so it runs in a worker thread; the memory cache runs inline."""
    if isinstance(cache, FileTailCache):
        return await anyio.to_thread.run_sync(fn, *args)
    return fn(*args)
