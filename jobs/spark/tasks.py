"""What code running inside a Spark task needs: an event loop, an identity, a logger.

Tasks are synchronous Python functions; the store clients are async. A task either runs
its work under ``anyio.run`` (:func:`run_async`) or, when it streams rows back to
Spark, runs the event loop in a helper thread and hands batches over a bounded queue
(:func:`stream_from_async`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import anyio

T = TypeVar("T")


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    """``anyio.run(fn)``, or in a thread of its own when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, fn).result()


def task_identity(job: str) -> str:
    """An Oxia client identity for the current Spark task (or the driver)."""
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is always there in a task
        ctx = None
    if ctx is None:
        return f"spark-{job}-driver-{os.getpid()}"
    return f"spark-{job}-s{ctx.stageId()}-p{ctx.partitionId()}-a{ctx.attemptNumber()}"


def task_attempt_id() -> int:
    """Spark's id of this task attempt, unique within the application (a retry or a
    speculative copy of the same task has another); outside a task, this process's."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return os.getpid() if ctx is None else int(ctx.taskAttemptId())


def task_logger(job: str) -> logging.Logger:
    """A logger for executor code: stderr of the Python worker (the executor's log)."""
    logger = logging.getLogger(f"llog.spark.{job}.task")
    if not logging.getLogger().handlers and not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def partition_slices(items: int, tasks: int, per_task: int = 2) -> int:
    """How many Spark partitions to cut ``items`` units into."""
    return max(1, min(items, max(1, tasks) * per_task))


class _ConsumerGone(Exception):
    """The Spark task stopped reading before the producer finished."""


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_DONE = object()


def stream_from_async(
    produce: Callable[[Callable[[list[T]], Awaitable[None]]], Awaitable[None]],
    *, max_batches: int = 4,
) -> Iterator[T]:
    """Run ``produce(emit)`` under ``anyio.run`` in a helper thread and yield what it emits.

    ``emit`` takes a batch (list) and blocks while ``max_batches`` are waiting, so a
    task streams its rows to Spark with bounded memory. Errors re-raise in the consumer;
    a consumer that stops early makes the next ``emit`` fail, which ends the producer.
    """
    q: queue.Queue[object] = queue.Queue(max_batches)
    closed = threading.Event()

    def put(item: object) -> None:
        while not closed.is_set():
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                continue
        raise _ConsumerGone()

    async def emit(batch: list[T]) -> None:
        if batch:
            await anyio.to_thread.run_sync(put, batch)

    async def main() -> None:
        try:
            await produce(emit)
        except BaseException as exc:
            if not closed.is_set():
                await anyio.to_thread.run_sync(put, _Failure(exc))
            return
        await anyio.to_thread.run_sync(put, _DONE)

    thread = threading.Thread(target=anyio.run, args=(main,), daemon=True,
                              name="llog-task-loop")
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.exc
            assert isinstance(item, list)
            yield from item
    finally:
        closed.set()
        thread.join(timeout=60)
