"""Recent records per partition, served to consumers at the hot tail without Oxia/S3.

:func:`open_tail_cache` picks the implementation: in memory for a single process, or a
directory shared by the uvicorn workers of one host (``LLOG_TAIL_CACHE_DIR``), so that a
consumer served by one worker sees what another worker wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from app.tailcache.base import CacheHit, TailCache, TailCacheStats
from app.tailcache.files import FileTailCache
from app.tailcache.memory import MemoryTailCache

__all__ = [
    "CacheHit",
    "FileTailCache",
    "MemoryTailCache",
    "TailCache",
    "TailCacheStats",
    "open_tail_cache",
    "run_cache_io",
]

T = TypeVar("T")


def open_tail_cache(directory: Path | None, max_bytes: int) -> TailCache:
    """A :class:`FileTailCache` in ``directory``, or a :class:`MemoryTailCache` if None."""
    if directory is None:
        return MemoryTailCache(max_bytes)
    return FileTailCache(directory, max_bytes)


async def run_cache_io(cache: TailCache, fn: Callable[..., T], *args: object) -> T:
    """Call ``fn(*args)`` on the cache without blocking the event loop: the file-backed
    cache does file I/O, so it runs in a worker thread; the memory cache runs inline."""
    if isinstance(cache, FileTailCache):
        return await anyio.to_thread.run_sync(fn, *args)
    return fn(*args)
