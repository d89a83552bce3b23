"""The async consumer (asyncio, or trio through anyio): :class:`~llog_client.Consumer`'s
calls, awaited, with the worker of :mod:`llog_client._core` as a task.

    async with AsyncConsumer(llog, "orders", group="billing") as consumer:
        async for record in consumer:
            await handle(record)

The task lives in a task group the ``async with`` opens and closes, so use the consumer
as a context manager (in the task that opened it). Answers are read on a worker thread
through :mod:`llog_client._fastlane` (the event loop only waits for them), unless the
client was given a transport of its own or a proxy applies (then through its httpx).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Iterable, Sequence

import anyio
from anyio.abc import TaskGroup

from llog_client._aio import AsyncLlogClient
from llog_client._consumer_base import ConsumerBase
from llog_client._errors import LlogError
from llog_client._fetcher import Answer, FetchSend, Sender, Wait, apost, offsets_at
from llog_client._models import TopicPartitionKey
from llog_client._ops import Action, Pause
from llog_client._records import PartitionBatch, RecordView

_LEAVE_S = 5.0  # how long a cancelled consumer may take to leave its group


class AsyncConsumer(ConsumerBase[AsyncLlogClient]):
    """See :class:`~llog_client.Consumer`: the same options, through an
    :class:`~llog_client.AsyncLlogClient` (or broker URLs for a client of its own)."""

    # Made by start: an event needs the event loop.
    _event: anyio.Event  # set (and made anew) whenever something changed
    _closing: anyio.Event
    _stopped: anyio.Event  # the worker is done

    def _connect(self, client: AsyncLlogClient | str | Sequence[str] | None
                 ) -> tuple[AsyncLlogClient, bool]:
        if isinstance(client, AsyncLlogClient):
            return client, False
        return AsyncLlogClient(client), True

    def _setup(self) -> None:
        client = self._client
        self._sender = Sender(None, client._http.headers, client._config,
                              lane_allowed=not client._transport_given)
        self._tasks: TaskGroup | None = None
        self._closed = False

    def _changed(self) -> None:
        self._event.set()
        self._event = anyio.Event()

    def _started(self) -> None:
        if self._tasks is None:
            raise RuntimeError("use the consumer in 'async with' (it starts it)")

    async def __aenter__(self) -> AsyncConsumer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose(processed=exc[0] is None)

    # -- the worker's task ------------------------------------------------------------

    async def start(self) -> AsyncConsumer:
        """Find the partitions (join the group) and start fetching. Raises what
        stopped it (the group refused the join, a topic is unknown)."""
        core = self._core
        if self._tasks is None:
            if self._closed:
                raise RuntimeError("the consumer is closed")
            self._event, self._closing, self._stopped = anyio.Event(), anyio.Event(), \
                anyio.Event()
            self._tasks = anyio.create_task_group()
            await self._tasks.__aenter__()
            self._tasks.start_soon(self._work)
        while not (core.ready or core.stopped):
            await self._event.wait()
        if core.fatal is not None:
            await self.aclose()
            core.check()
        return self

    async def _work(self) -> None:
        op = self._core.run()
        answer: Answer = None
        try:
            while True:
                action = op.send(answer)
                self._changed()
                answer = None
                if isinstance(action, Wait):
                    with anyio.move_on_after(math.inf if action.timeout_s is None
                                             else action.timeout_s):
                        await self._event.wait()
                    continue
                answer = await self._act(action)
        except StopIteration:
            pass
        except Exception as exc:  # the program sees it at its next call
            self._core.fatal = exc
        finally:
            self._core.stopped = True
            self._changed()
            self._stopped.set()

    async def _act(self, action: Action | FetchSend) -> Answer:
        client = self._client
        if isinstance(action, Pause):
            with anyio.move_on_after(action.delay_s):  # close cuts a backoff short
                await self._closing.wait()
            client._config.next_broker()
            return None
        if isinstance(action, FetchSend):
            if self._sender.uses_lane(action):  # read on a worker thread: see the module
                return await anyio.to_thread.run_sync(self._sender.post, action,
                                                      abandon_on_cancel=True)
            return await apost(client._http, client._config, action)
        return await client._act(action)

    # -- taking records ---------------------------------------------------------------

    async def poll_batch(self, timeout_s: float | None = None) -> list[PartitionBatch]:
        """See :meth:`Consumer.poll_batch <llog_client.Consumer.poll_batch>`."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if timeout_s is None:
            timeout_s = self._core.settings.max_wait_ms / 1000
        return await self._take(anyio.current_time() + timeout_s, hand=True) or []

    async def poll(self, timeout_s: float | None = None) -> list[RecordView]:
        return [record for batch in await self.poll_batch(timeout_s) for record in batch]

    async def _take(self, deadline: float | None, *, hand: bool
                    ) -> list[PartitionBatch] | None:
        core = self._core
        self._started()
        resumed = self._resume_after_handed(hand)
        if resumed is not None:
            return resumed
        while (got := core.prefetch.take()) is None:
            core.check()
            if core.prefetch.finished or core.closing or core.stopped:
                return None
            with anyio.move_on_after(math.inf if deadline is None
                                     else deadline - anyio.current_time()) as scope:
                await self._event.wait()
            if scope.cancelled_caught:
                return None
        self._changed()  # room for the worker
        # Let the worker's task run (an answer it fetched, the next request) before
        # the program goes through this one without waiting for anything.
        await anyio.lowlevel.checkpoint()
        if isinstance(got, LlogError):
            raise got
        core.progress.handed = got if hand else []
        return got

    async def __aiter__(self) -> AsyncIterator[RecordView]:
        """See :meth:`Consumer.__iter__ <llog_client.Consumer.__iter__>`; for many
        records a second, ``poll_batch`` costs less per record."""
        while (batches := await self._take(None, hand=False)) is not None:
            for record in self._records(batches):
                yield record

    # -- positions and commits --------------------------------------------------------

    async def seek_to_time(self, timestamp_ms: int,
                           partitions: Iterable[TopicPartitionKey] | None = None
                           ) -> dict[TopicPartitionKey, int]:
        """See :meth:`Consumer.seek_to_time <llog_client.Consumer.seek_to_time>`."""
        self._started()
        keys = self._keys(partitions)
        offsets = await self._client._run(offsets_at(keys, timestamp_ms, self._policy()))
        self._seek_all(offsets.items())
        return offsets

    async def commit(self) -> dict[TopicPartitionKey, int]:
        """See :meth:`Consumer.commit <llog_client.Consumer.commit>`."""
        core = self._core
        core.progress.mark_handed()
        if not core.settings.commits or self._tasks is None:
            return {}
        core.commit_asked += 1
        asked = core.commit_asked
        self._changed()
        while core.commit_done < asked and not core.stopped:
            await self._event.wait()
        core.check()
        if isinstance(core.commit_result, LlogError):
            raise core.commit_result
        return core.commit_result

    async def aclose(self, *, processed: bool = True) -> None:
        """Commit what was processed, leave the group, end the task (a fetch in flight
        is cut short); raises a failed final commit. Cancelled, it ends the task at once
        and leaves, committing nothing more. ``processed``: the last poll's records
        count as processed (``async with`` left by an exception: they do not)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._tasks is not None:
                if processed:
                    self._core.progress.mark_handed()
                self._core.closing = True
                self._changed()
                self._closing.set()
                self._sender.interrupt()  # a fetch under way is cut short
                try:
                    await self._stopped.wait()
                except BaseException:  # cancelled: end the worker now
                    self._tasks.cancel_scope.cancel()
                    raise
                finally:
                    await self._tasks.__aexit__(None, None, None)
                    # A worker cancelled (with its caller) before it left: leave now.
                    await self._leave_at_once()
                if self._core.close_error is not None:
                    raise self._core.close_error
        finally:
            self._sender.close()
            if self._owns_client:
                await self._client.aclose()

    async def _leave_at_once(self) -> None:
        """Leave the group within a few seconds, though the caller was cancelled (else
        the partitions wait for the session to end)."""
        member, self._core.membership = self._core.membership, None
        if member is None:
            return
        # Failing that, the session ends it.
        with anyio.CancelScope(shield=True), anyio.move_on_after(_LEAVE_S), \
                contextlib.suppress(LlogError):
            await self._client.leave_group(member.group, member.member_id)
