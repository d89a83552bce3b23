"""Recent records per partition, served to consumers at the hot tail without Oxia/S3.

:func:`open_tail_cache` picks the implementation: in memory for a single process, or a
directory shared by the uvicorn workers of one host (``LLOG_TAIL_CACHE_DIR``), so that a
consumer served by one worker sees what another worker wrote. Each worker then still
answers from memory what it wrote itself and writes the directory behind, off the
produce path (:mod:`app.tailcache.shared`). The directory keeps the
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
from app.tailcache.shared import SharedTailCache

__all__ = [
    "CacheHit",
    "FileTailCache",
    "MemoryTailCache",
    "SharedTailCache",
    "TailCache",
    "TailCacheStats",
    "open_tail_cache",
    "run_cache_read",
    "run_cache_write",
    "store_id_of",
]

T = TypeVar("T")


def open_tail_cache(directory: Path | None, max_bytes: int, *, store_id: str,
                    max_partitions: int = 10_000) -> TailCache:
    """A :class:`MemoryTailCache` if ``directory`` is None (one process serves one
    store, so it needs no store id), else a :class:`SharedTailCache` over a
    :class:`FileTailCache` of store ``store_id`` in ``directory`` indexing at most
    ``max_partitions`` partitions."""
    memory = MemoryTailCache(max_bytes, store_id=store_id)
    if directory is None:
        return memory
    files = FileTailCache(directory, max_bytes, store_id=store_id,
                          max_partitions=max_partitions)
    return SharedTailCache(memory, files, max_pending_bytes=max_bytes // 4)


async def run_cache_read(cache: TailCache, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn(*args)``, a lookup, without blocking the event loop: a cache whose
    reads touch files runs it in a worker thread; the memory cache runs it inline."""
    if cache.reads_block:
        return await anyio.to_thread.run_sync(fn, *args)
    return fn(*args)


async def run_cache_write(cache: TailCache, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn(*args)``, puts or notes, without blocking the event loop (inline
    unless the cache writes files as it is called)."""
    if cache.writes_block:
        return await anyio.to_thread.run_sync(fn, *args)
    return fn(*args)
