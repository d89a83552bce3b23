"""The tail cache of a worker that shares a host with other workers.

Each worker keeps what it wrote and learned in memory (:class:`MemoryTailCache`), where
its own consumers find it at once, and *writes behind* into the directory shared with
the other workers (:class:`FileTailCache`), where their consumers find it. A produce
therefore never waits on a file: its records go to memory inline (as with the memory
cache alone), and the file writes happen later, on a worker thread, from a bounded
queue.

Why this is as safe as the file cache alone:

* The file cache's rules are unchanged (immutable, verified segments; a hw that only
  goes up in intent), and nothing reaches it but committed records and high watermarks
  read from the log.
* A read asks memory first. Records there are this worker's own, committed. When
  memory has no records at the offset, the directory is asked: another worker may have
  written them.
* "Known empty" (``offset == hw + 1``) is answered only if no layer has records there,
  and never from the directory for an offset this worker knows is committed (the write
  behind may not have reached the file's hw yet): that is a miss, and the caller reads
  the log.
* When the queue is full (the directory is slower than produce), the oldest pending
  writes are dropped and counted: the other workers' consumers then miss and read the
  log, which is always allowed. Memory is bounded by ``max_bytes`` of records in the
  memory layer plus ``max_pending_bytes`` queued for the files.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.abc

from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_size
from app.tailcache.base import CacheHit, Counters, TailCacheStats
from app.tailcache.files import FileTailCache, PendingPut
from app.tailcache.memory import MemoryTailCache

log = logging.getLogger(__name__)

# Queued file writes are bounded by bytes; at least this much may wait, so that a burst
# of one flush never drops for a small cache.
MIN_PENDING_BYTES = 4 * 1024 * 1024


@dataclass
class _Pending:
    """What waits for the directory: records per put, and hws learned."""

    puts: deque[PendingPut]
    notes: dict[TopicPartition, int]
    nbytes: int = 0


class SharedTailCache:
    """See the module docstring. Reads may block (files); writes never do."""

    reads_block = True
    writes_block = False

    def __init__(self, memory: MemoryTailCache, files: FileTailCache, *,
                 max_pending_bytes: int) -> None:
        self._memory = memory
        self._files = files
        self._max_pending = max(max_pending_bytes, MIN_PENDING_BYTES)
        self._lock = threading.Lock()  # the queue: puts on the loop, reads in threads
        self._pending = _Pending(deque(), {})
        self._wakeup = anyio.Event()
        self._counters = Counters()
        self.written = 0  # puts written to the directory
        self.dropped = 0  # puts dropped because the queue was full
        self._closed = False

    # -- writes: memory now, the directory behind -------------------------------------

    def put(self, tp: TopicPartition, start_offset: int, records: Sequence[Payload],
            append_time_ms: int = 0) -> None:
        if not records:
            return
        owned = _owned(records)
        self._memory.put(tp, start_offset, owned, append_time_ms)
        size = owned.size if isinstance(owned, RecordBatch) else sum(map(payload_size, owned))
        with self._lock:
            if self._closed:
                return
            pending = self._pending
            pending.puts.append(PendingPut(tp, start_offset, owned, append_time_ms, size))
            pending.nbytes += size
            while pending.nbytes > self._max_pending and len(pending.puts) > 1:
                old = pending.puts.popleft()
                pending.nbytes -= old.nbytes
                self.dropped += 1
        self._wakeup.set()

    def note_high_watermark(self, tp: TopicPartition, high_watermark: int) -> None:
        self._memory.note_high_watermark(tp, high_watermark)
        with self._lock:
            if self._closed:
                return
            notes = self._pending.notes
            if high_watermark > notes.get(tp, -1):
                notes[tp] = high_watermark
        self._wakeup.set()

    def note_log_start(self, tp: TopicPartition, log_start: int) -> None:
        # Kept by the memory layer, which holds every partition this worker has seen
        # (the directory's index is evicted and listed again): it decides for both.
        self._memory.note_log_start(tp, log_start)

    async def write_behind(self, *, task_status: anyio.abc.TaskStatus[None]
                           = anyio.TASK_STATUS_IGNORED) -> None:
        """Write what is queued to the directory until cancelled (the broker's task
        group runs it); at most one batch of file writes at a time."""
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = anyio.Event()
            batch = self._take()
            if batch.puts or batch.notes:
                await anyio.to_thread.run_sync(self._write, batch)

    def _take(self) -> _Pending:
        with self._lock:
            batch, self._pending = self._pending, _Pending(deque(), {})
            return batch

    def _write(self, batch: _Pending) -> None:
        self._files.put_many(list(batch.puts), batch.notes)
        self.written += len(batch.puts)

    def flush(self) -> None:
        """Write what is queued now, in the caller's thread (tests, shutdown)."""
        self._write(self._take())

    # -- reads: memory first, then the directory --------------------------------------

    def get(self, tp: TopicPartition, offset: int, max_records: int | None,
            max_bytes: int | None) -> CacheHit | None:
        # Read once: the start checked is the start answered (one noted meanwhile, on
        # the event loop, must not be said of records read below it).
        start = self._memory.log_start(tp)
        hit = self._lookup(tp, offset, max_records, max_bytes, start)
        if hit is not None and hit.log_start < start:  # the files' may be older
            hit = replace(hit, log_start=start)
        return self._counters.count(hit)

    def _lookup(self, tp: TopicPartition, offset: int, max_records: int | None,
                max_bytes: int | None, start: int) -> CacheHit | None:
        if offset < start:
            return None  # below what this worker read as the log start: nothing cached
        own = self._memory.get(tp, offset, max_records, max_bytes)
        if own is not None and own.records:
            return own
        shared = self._files.get(tp, offset, max_records, max_bytes)
        if shared is not None and shared.records:
            return shared  # another worker's records (or this one's, written behind)
        if own is not None:
            return own  # known empty, as far as this worker knows (as memory alone)
        if shared is not None:
            known = self._memory.high_watermark(tp)
            if known is not None and known >= offset:
                return None  # committed, and not written behind yet: read the log
        return shared

    def high_watermark(self, tp: TopicPartition) -> int | None:
        found = [hw for hw in (self._memory.high_watermark(tp),
                               self._files.high_watermark(tp)) if hw is not None]
        return max(found, default=None)

    # -- the rest of the contract -----------------------------------------------------

    def statistics(self) -> TailCacheStats:
        """The directory's view of what is cached (what every worker sees), this
        worker's answers, and its queue of writes behind."""
        files = self._files.statistics()
        with self._lock:
            pending = len(self._pending.puts)
        return replace(files, hits=self._counters.hits, misses=self._counters.misses,
                       pending_writes=pending, dropped_writes=self.dropped)

    def drop(self, tp: TopicPartition) -> None:
        with self._lock:
            pending = self._pending
            kept = deque(p for p in pending.puts if p.tp != tp)
            pending.nbytes = sum(p.nbytes for p in kept)
            pending.puts = kept
            pending.notes.pop(tp, None)
        self._memory.drop(tp)
        self._files.drop(tp)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pending = _Pending(deque(), {})
        self._memory.close()
        self._files.close()


def _owned(records: Sequence[Payload]) -> Sequence[Payload]:
    """Records holding their own bytes: they are kept after the request is gone."""
    if isinstance(records, RecordBatch):
        return records.detached()
    return [r if type(r) is bytes or isinstance(r, LogRecord) else bytes(r)
            for r in records]


def describe(cache: Any) -> str:
    """A short name of the cache's kind, for the startup log."""
    return {MemoryTailCache: "memory", FileTailCache: "files",
            SharedTailCache: "memory, written behind to a shared directory"}.get(
                type(cache), type(cache).__name__)
