"""The blocking consumer: records of topics or partitions, alone or as a member of a
consumer group, fetched ahead by a thread of its own.

    with Consumer(llog, "orders", group="billing") as consumer:
        for record in consumer:
            handle(record)          # processed once the loop asks for the next record

The thread runs the worker of :mod:`llog_client._core` holding the consumer's lock,
and lets go of it for each request and wait, so the program's calls never wait for a
fetch in flight. Errors the worker meets wait in the queue and are raised by the next
poll. ``close()`` (or leaving the ``with``) commits what was processed, leaves the
group and ends the thread; it may wait for one long-poll (``max_wait_ms``).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from llog_client._consumer_base import ConsumerBase
from llog_client._core import DEFAULT_WAIT_MS, Core
from llog_client._errors import LlogError
from llog_client._fetcher import Answer, FetchSend, Sender, Wait, offsets_at
from llog_client._models import Position, TopicPartitionKey
from llog_client._ops import Action, Pause
from llog_client._params import DEFAULT_FETCH_BYTES
from llog_client._records import PartitionBatch, RecordView
from llog_client._sync import LlogClient


class Consumer(ConsumerBase[LlogClient]):
    """Reads ``topics`` (every partition; with ``group``, those the group assigns this
    member) or ``partitions`` ((topic, partition) pairs), through ``client`` (an
    :class:`~llog_client.LlogClient`, or broker URLs for a client of its own).

    - ``start``: where a partition starts, ``"earliest"``, ``"latest"`` or an offset;
      with a group, where a partition the group never committed starts.
    - ``follow``: long-poll at the end for more (``max_wait_ms`` at a time); False: the
      iteration ends once every partition was read to its end (no group).
    - ``group``: commit what was processed, every ``commit_interval_ms`` and on close
      (``auto_commit``; else only ``commit()``): at-least-once. ``delivery=
      "at-most-once"`` has the broker commit each answer before it is sent instead.
      With ``partitions``, the group's committed offsets are read and written for
      partitions this consumer chose (a group with no live member).
    - ``max_bytes``: an answer's budget (one request covers every partition);
      ``prefetch_bytes``: fetching ahead stops while this much waits to be handed out.
    - ``compressed``: ask for zstd answers (for a slow network; raw by default).
    """

    def _connect(self, client: LlogClient | str | Sequence[str] | None
                 ) -> tuple[LlogClient, bool]:
        if isinstance(client, LlogClient):
            return client, False
        return LlogClient(client), True

    def _setup(self) -> None:
        self._cond = threading.Condition()
        self._worker: _Worker | None = None
        self._closed = False

    def _guard(self) -> AbstractContextManager[Any]:
        return self._cond

    def _changed(self) -> None:
        self._cond.notify_all()

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        # Left by an exception: the last poll's records were not all processed.
        self.close(processed=exc[0] is None)

    def start(self) -> Consumer:
        """Find the partitions (join the group) and start fetching; polls start it
        too. Raises what stopped it (the group refused the join, a topic is unknown)."""
        if self._worker is None:
            if self._closed:
                raise RuntimeError("the consumer is closed")
            self._worker = _Worker(self._core, self._cond, self._client)
            # Dropped without close(), the consumer still ends its thread.
            weakref.finalize(self, self._worker.stop).atexit = False
            self._worker.thread.start()
        core = self._core
        with self._cond:
            self._cond.wait_for(lambda: core.ready or core.stopped)
        core.check()
        return self

    # -- taking records ---------------------------------------------------------------

    def poll_batch(self, timeout_s: float | None = None) -> list[PartitionBatch]:
        """The next answer, one :class:`PartitionBatch` per partition with records
        (their columns: ``values``, ``offsets``, ``keys``...); [] when nothing came
        within ``timeout_s`` (None: one long-poll, ``max_wait_ms``). The batches of the
        previous poll count as processed."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if timeout_s is None:
            timeout_s = self._core.settings.max_wait_ms / 1000
        return self._take(time.monotonic() + timeout_s, hand=True) or []

    def poll(self, timeout_s: float | None = None) -> list[RecordView]:
        """The records of :meth:`poll_batch`, one after the other."""
        return [record for batch in self.poll_batch(timeout_s) for record in batch]

    def _take(self, deadline: float | None, *, hand: bool) -> list[PartitionBatch] | None:
        """The next answer still current, or None: at the deadline, once every
        partition was read (follow off), or closed. ``hand``: its batches count as
        processed at the next poll (an iteration marks them record by record)."""
        core = self._core
        self.start()
        with self._cond:
            resumed = self._resume_after_handed(hand)
            if resumed is not None:
                return resumed
            while (got := core.prefetch.take()) is None:
                core.check()
                if core.prefetch.finished or core.closing or core.stopped:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)
            self._cond.notify_all()  # room for the worker
            if isinstance(got, LlogError):
                raise got
            core.progress.handed = got if hand else []
            return got

    def __iter__(self) -> Iterator[RecordView]:
        """Every record, waiting for more at the end (``follow``): a record counts as
        processed when the loop asks for the next one."""
        while (batches := self._take(None, hand=False)) is not None:
            yield from self._records(batches)

    # -- positions and commits --------------------------------------------------------

    def seek_to_time(self, timestamp_ms: int,
                     partitions: Iterable[TopicPartitionKey] | None = None
                     ) -> dict[TopicPartitionKey, int]:
        """Read each partition (all assigned: None) from its first record appended at
        or after ``timestamp_ms`` (past the end if none is: what comes next)."""
        self._started()
        keys = self._keys(partitions)
        offsets = self._client._run(offsets_at(keys, timestamp_ms, self._policy()))
        self._seek_all(offsets.items())
        return offsets

    def _started(self) -> None:
        self.start()

    def commit(self) -> dict[TopicPartitionKey, int]:
        """Commit what was processed (the last poll's records too) and not yet
        committed: the offsets committed. Nothing without a group, or at-most-once."""
        core = self._core
        with self._cond:
            core.progress.mark_handed()
            if not core.settings.commits or self._worker is None:
                return {}
            core.commit_asked += 1
            asked = core.commit_asked
            self._cond.notify_all()
            self._cond.wait_for(lambda: core.commit_done >= asked or core.stopped)
            core.check()
            result = core.commit_result
        if isinstance(result, LlogError):
            raise result
        return result

    def close(self, *, processed: bool = True) -> None:
        """Commit what was processed, leave the group, end the thread (a fetch in flight
        is cut short); raises a failed final commit. ``processed``: the last poll's
        records count as processed (``with`` left by an exception: they do not)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._worker is not None:
                with self._cond:
                    if processed:
                        self._core.progress.mark_handed()
                self._worker.stop()
                self._worker.thread.join()
                if self._core.close_error is not None:
                    raise self._core.close_error
        finally:
            if self._owns_client:
                self._client.close()


class _Worker:
    """The consumer's thread: it runs the core's work holding the consumer's lock and
    lets go of it for each request or wait. It holds nothing of the consumer itself, so
    a consumer dropped without ``close()`` is collected, and its finalizer stops this."""

    def __init__(self, core: Core, cond: threading.Condition, client: LlogClient) -> None:
        self.core = core
        self.cond = cond
        self.client = client
        self.sender = Sender(client._http, client._http.headers, client._config,
                             lane_allowed=not client._transport_given)
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._run, name="llog-consumer", daemon=True)

    def stop(self) -> None:
        """Commit what was processed, leave, and end (the thread does it): a fetch under
        way is cut short, not waited for."""
        with self.cond:
            self.core.closing = True
            self.cond.notify_all()
        self.closing.set()
        self.sender.interrupt()

    def _run(self) -> None:
        op = self.core.run()
        answer: Answer = None
        cond = self.cond
        with cond:
            try:
                while True:
                    action = op.send(answer)
                    cond.notify_all()
                    answer = None
                    if isinstance(action, Wait):
                        cond.wait(action.timeout_s)
                        continue
                    cond.release()
                    try:
                        answer = self._act(action)
                    finally:
                        cond.acquire()
            except StopIteration:
                pass
            except BaseException as exc:  # the program sees it at its next call
                self.core.fatal = exc
            finally:
                self.core.stopped = True
                cond.notify_all()
                self.sender.close()

    def _act(self, action: Action | FetchSend) -> Answer:
        if isinstance(action, Pause):
            self.closing.wait(action.delay_s)  # close cuts a backoff short
            self.client._config.next_broker()
            return None
        if isinstance(action, FetchSend):
            return self.sender.post(action)
        return self.client._send(action)


class GroupConsumer(Consumer):
    """A member of ``group`` reading ``topics``: :class:`Consumer` with a group, under
    the name and arguments it had before the consumer read without a group (it stays
    for the programs that use it; ``LlogClient.group_consumer`` makes one)."""

    def __init__(self, client: LlogClient, group: str, topics: Sequence[str] | str, *,
                 client_id: str | None = None, session_timeout_ms: int | None = None,
                 auto_offset_reset: Position = "earliest",
                 max_wait_ms: int = DEFAULT_WAIT_MS, max_bytes: int = DEFAULT_FETCH_BYTES,
                 clock: Callable[[], float] = time.monotonic, **options: Any) -> None:
        super().__init__(client, topics, group=group, start=auto_offset_reset,
                         client_id=client_id, session_timeout_ms=session_timeout_ms,
                         max_wait_ms=max_wait_ms, max_bytes=max_bytes, clock=clock, **options)

    def __enter__(self) -> GroupConsumer:
        self.start()
        return self
