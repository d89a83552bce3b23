"""The produce batcher: coalesces concurrent requests into shared-blob flushes.

Requests from many handlers are buffered until ``max_bytes`` are waiting or ``max_delay``
has passed since the first buffered record (``time.monotonic()`` windows); one flush is
one ``append_shared`` with one aggregated group per topic-partition, and each request's
future gets its own slice of the partition results back. The buffer is bounded: when
full, new work is refused with :class:`BackPressureRejected` instead of queueing without
limit. If the flusher dies, every waiter is failed rather than left hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.abc

from app.batching.metrics import BatcherMetrics
from app.errors import BackPressureRejected, LlogError, ShuttingDown, StorageUnavailable
from app.storage.keys import TopicPartition
from app.storage.writer import AppendGroup, AppendResult

AppendFn = Callable[[Sequence[AppendGroup]], Awaitable[list[AppendResult | LlogError]]]
Outcome = AppendResult | LlogError


@dataclass
class _Waiter:
    groups: Sequence[AppendGroup]
    size: int
    future: asyncio.Future[list[Outcome]]


@dataclass
class _Batch:
    waiters: list[_Waiter] = field(default_factory=list)
    size: int = 0
    started: float = 0.0  # monotonic time of the first buffered record


@dataclass(frozen=True)
class BatcherStats:
    buffered_bytes: int
    buffered_waiters: int
    inflight_bytes: int
    inflight_flushes: int


def _group_bytes(groups: Sequence[AppendGroup]) -> int:
    return sum(len(r) for g in groups for r in g.records)


class Batcher:
    def __init__(
        self,
        append: AppendFn,
        *,
        max_bytes: int,
        max_delay_s: float,
        buffer_max_bytes: int,
        max_inflight_flushes: int = 4,
        metrics: BatcherMetrics | None = None,
        on_committed: Callable[[list[tuple[AppendGroup, AppendResult]]], Awaitable[None]]
        | None = None,
    ) -> None:
        self._append = append
        self._max_bytes = max_bytes
        self._max_delay = max_delay_s
        self._buffer_max = buffer_max_bytes
        self._metrics = metrics
        self._on_committed = on_committed
        self._batch = _Batch()
        self._inflight_bytes = 0
        self._inflight = 0
        self._flush_slots = anyio.Semaphore(max_inflight_flushes)
        self._wakeup = anyio.Event()
        self._closing = False
        self._closed = False
        self._failure: BaseException | None = None

    # -- producer side ---------------------------------------------------------------

    def statistics(self) -> BatcherStats:
        return BatcherStats(self._batch.size, len(self._batch.waiters),
                            self._inflight_bytes, self._inflight)

    async def submit(self, groups: Sequence[AppendGroup]) -> list[Outcome]:
        """Buffer ``groups`` for the next flush and wait for their results (in order)."""
        if self._failure is not None:
            raise StorageUnavailable(f"the batcher stopped: {self._failure!r}")
        if self._closing:
            raise ShuttingDown("the broker is shutting down; retry on another broker")
        size = _group_bytes(groups)
        if self._batch.size + self._inflight_bytes + size > self._buffer_max and (
            self._batch.size or self._inflight_bytes
        ):
            if self._metrics is not None:
                self._metrics.rejected.inc()
            raise BackPressureRejected(
                f"produce buffer full ({self._batch.size + self._inflight_bytes} of "
                f"{self._buffer_max} bytes in use); retry shortly"
            )
        future: asyncio.Future[list[Outcome]] = asyncio.get_running_loop().create_future()
        if not self._batch.waiters:
            self._batch.started = time.monotonic()
        self._batch.waiters.append(_Waiter(groups, size, future))
        self._batch.size += size
        self._wakeup.set()
        # Shielded: once buffered, the records will be committed whether or not this
        # caller is still waiting (a disconnect must not tear a flush apart).
        return await asyncio.shield(future)

    # -- flusher side ----------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """The flusher loop; returns after :meth:`close` once everything is answered."""
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    batch = await self._next_batch()
                    if batch is None:
                        break
                    await self._flush_slots.acquire()
                    self._inflight += 1
                    self._inflight_bytes += batch.size
                    tg.start_soon(self._flush, batch)
        except BaseException as exc:
            self._fail_all(exc)
            raise
        finally:
            self._closed = True

    async def _next_batch(self) -> _Batch | None:
        while not self._batch.waiters:
            if self._closing:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        # Wait out the window unless the size threshold or shutdown says flush now.
        while self._batch.size < self._max_bytes and not self._closing:
            remaining = self._batch.started + self._max_delay - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup = anyio.Event()
            with anyio.move_on_after(remaining):
                await self._wakeup.wait()
        batch, self._batch = self._batch, _Batch()
        return batch

    async def _flush(self, batch: _Batch) -> None:
        started = time.monotonic()
        try:
            groups, slices = _aggregate(batch.waiters)
            try:
                results = await self._append(groups)
            except LlogError as exc:
                results = [exc] * len(groups)
            committed = [(g, r) for g, r in zip(groups, results, strict=True)
                         if isinstance(r, AppendResult)]
            if committed and self._on_committed is not None:
                # Before the waiters hear back, so a consumer they wake finds the records.
                await self._on_committed(committed)
            for waiter, waiter_slices in zip(batch.waiters, slices, strict=True):
                if not waiter.future.done():
                    waiter.future.set_result(
                        [_slice_result(results[gi], lo, n) for gi, lo, n in waiter_slices]
                    )
            if self._metrics is not None:
                self._metrics.observe_flush(
                    batch.size, len(batch.waiters), len(groups), time.monotonic() - started
                )
        except BaseException as exc:
            for waiter in batch.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        StorageUnavailable(f"flush failed unexpectedly: {exc!r}")
                    )
            raise
        finally:
            self._inflight -= 1
            self._inflight_bytes -= batch.size
            self._flush_slots.release()

    def close(self) -> None:
        """Refuse new work, flush what is buffered now, and let :meth:`run` finish."""
        self._closing = True
        self._wakeup.set()

    def _fail_all(self, exc: BaseException) -> None:
        self._failure = exc
        error = StorageUnavailable(f"the batcher stopped: {exc!r}")
        for waiter in self._batch.waiters:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        self._batch = _Batch()


def _aggregate(
    waiters: Sequence[_Waiter],
) -> tuple[list[AppendGroup], list[list[tuple[int, int, int]]]]:
    """One group per topic-partition, records in arrival order; for each waiter, where
    its entries landed: (group index, first record index in the group, record count)."""
    index: dict[TopicPartition, int] = {}
    records: list[list[bytes]] = []
    tps: list[TopicPartition] = []
    slices: list[list[tuple[int, int, int]]] = []
    for waiter in waiters:
        mine = []
        for group in waiter.groups:
            gi = index.get(group.tp)
            if gi is None:
                gi = index[group.tp] = len(tps)
                tps.append(group.tp)
                records.append([])
            mine.append((gi, len(records[gi]), len(group.records)))
            records[gi].extend(group.records)
        slices.append(mine)
    return [AppendGroup(tp, recs) for tp, recs in zip(tps, records, strict=True)], slices


def _slice_result(result: Outcome, first: int, count: int) -> Outcome:
    if not isinstance(result, AppendResult):
        return result
    start = result.start_offset + first
    return AppendResult(
        tp=result.tp,
        start_offset=start,
        end_offset=start + count - 1,
        count=count,
        index_key=result.index_key,
        wal_uri=result.wal_uri,
    )
