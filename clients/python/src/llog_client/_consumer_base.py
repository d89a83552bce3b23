"""What :class:`~llog_client.Consumer` and :class:`~llog_client.AsyncConsumer` share:
their options, the client they read through, and the calls that neither wait nor do
I/O. Each adds its driver of the worker (:mod:`llog_client._core`): a thread or a task.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from llog_client._config import ClientConfig
from llog_client._core import (
    DEFAULT_COMMIT_INTERVAL_MS,
    DEFAULT_MAX_BYTES,
    DEFAULT_PREFETCH_BYTES,
    DEFAULT_WAIT_MS,
    Core,
    Delivery,
    Settings,
    keys_of,
)
from llog_client._models import GroupMembership, Start, TopicPartitionKey
from llog_client._params import as_topics
from llog_client._records import PartitionBatch, RecordView
from llog_client._retry import RetryPolicy


class _Client(Protocol):
    _config: ClientConfig


C = TypeVar("C", bound=_Client)  # LlogClient or AsyncLlogClient


class ConsumerBase(Generic[C]):
    """See :class:`~llog_client.Consumer`."""

    def __init__(self, client: C | str | Sequence[str] | None = None,
                 topics: Iterable[str] | str | None = None, *,
                 partitions: Iterable[TopicPartitionKey] | None = None,
                 group: str | None = None, start: Start = "earliest", follow: bool = True,
                 delivery: Delivery = "at-least-once", auto_commit: bool = True,
                 commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS,
                 max_bytes: int = DEFAULT_MAX_BYTES, max_wait_ms: int = DEFAULT_WAIT_MS,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES, compressed: bool = False,
                 client_id: str | None = None, session_timeout_ms: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        settings = Settings(
            topics=tuple(as_topics(topics)) if topics is not None else (),
            partitions=keys_of(None if partitions is None else list(partitions)),
            group=group, start=start, follow=follow, delivery=delivery,
            auto_commit=auto_commit, commit_interval_ms=commit_interval_ms,
            max_bytes=max_bytes, max_wait_ms=max_wait_ms, prefetch_bytes=prefetch_bytes,
            compressed=compressed, client_id=client_id, session_timeout_ms=session_timeout_ms)
        self._client, self._owns_client = self._connect(client)
        self._core = Core(settings, self._policy(), clock)
        # An iteration under way: its answer, the batch it is in, and how many of that
        # batch's records it handed out.
        self._at: list[Any] | None = None
        self._setup()

    # -- what each driver says --------------------------------------------------------

    def _connect(self, client: C | str | Sequence[str] | None) -> tuple[C, bool]:
        """The client to read through, and whether this consumer made it (and closes it)."""
        raise NotImplementedError

    def _policy(self) -> RetryPolicy:
        return self._client._config.retry

    def _setup(self) -> None:
        """The driver's own state."""

    def _guard(self) -> contextlib.AbstractContextManager[Any]:
        """What keeps the worker out while the program changes the consumer's state."""
        return contextlib.nullcontext()

    def _changed(self) -> None:
        """Tell the worker something changed."""

    def _started(self) -> None:
        """Its partitions are known (seeking needs them): start, or say how."""

    # -- calls that neither wait nor do I/O -------------------------------------------

    @property
    def group(self) -> str | None:
        return self._core.settings.group

    @property
    def membership(self) -> GroupMembership | None:
        """A group member's id, generation and partitions (None before it joined)."""
        return self._core.membership

    def assignment(self) -> list[TopicPartitionKey]:
        """The partitions this consumer reads now (a member: those the group gave it)."""
        with self._guard():
            return self._core.assigned()

    def seek(self, topic: str, partition: int, offset: Start) -> None:
        """Read ``topic``/``partition`` from ``offset`` on (or ``"earliest"``,
        ``"latest"``): what was fetched past it and not yet handed out is dropped, and
        an iteration moves there at its next record."""
        self._started()
        with self._guard():
            self._core.seek((topic, partition), offset)
            self._changed()

    def seek_to_beginning(self, partitions: Iterable[TopicPartitionKey] | None = None
                          ) -> None:
        """Read ``partitions`` (every one assigned: None) from the log start."""
        self._started()
        self._seek_all((key, "earliest") for key in self._keys(partitions))

    def seek_to_end(self, partitions: Iterable[TopicPartitionKey] | None = None) -> None:
        """Read only what comes next on ``partitions`` (every one assigned: None)."""
        self._started()
        self._seek_all((key, "latest") for key in self._keys(partitions))

    def _seek_all(self, positions: Iterable[tuple[TopicPartitionKey, Start]]) -> None:
        with self._guard():
            for key, position in positions:
                self._core.seek(key, position)
            self._changed()

    def _keys(self, partitions: Iterable[TopicPartitionKey] | None) -> list[TopicPartitionKey]:
        return self.assignment() if partitions is None else list(keys_of(list(partitions))
                                                                 or ())

    def _records(self, batches: list[PartitionBatch]) -> Iterator[RecordView]:
        """The records of an answer, each counted as processed when the next is asked
        for; a seek or a rebalance that drops a partition ends its batch at once, and
        skips the batches of it not begun. Where it is is kept on the consumer: an
        iteration left part way (``break``) is taken up by the next poll or iteration."""
        core = self._core
        progress = core.progress
        at = self._at = [batches, 0, 0]  # the batch, and how many of its records are out
        for i, batch in enumerate(batches):
            at[1], at[2] = i, 0
            with self._guard():
                if not core.prefetch.current(batch):
                    continue  # its partition was sought elsewhere or lost
            record = None
            epoch = core.epoch
            for record in batch:
                at[2] += 1
                progress.current = record
                yield record
                if self._at is not at:
                    return  # a newer iteration (or a poll) took over from here
                if core.epoch != epoch:  # something moved: is this batch still read?
                    if not core.prefetch.current(batch):
                        at[2] = len(batch)
                        break
                    epoch = core.epoch
            if record is not None:
                with self._guard():
                    progress.mark(batch, record.offset)
                    progress.current = None
        if self._at is at:
            self._at = None

    def _resume_after_handed(self, hand: bool) -> list[PartitionBatch] | None:
        """(guarded) A poll or iteration begins: the last poll's records count as
        processed, and what an iteration left part way comes first (``hand``: as the
        poll's records)."""
        progress = self._core.progress
        progress.mark_handed()
        resumed = self._resume()
        if resumed is not None:
            progress.handed = resumed if hand else []
        return resumed

    def _resume(self) -> list[PartitionBatch] | None:
        """(guarded) What an iteration left part way: the rest of its batch and those
        after it still current, taken over (that iteration yields no more)."""
        at, self._at = self._at, None
        if at is None:
            return None
        batches, i, out = at
        rest = batches[i + 1:]
        if out < len(batches[i]):
            rest.insert(0, batches[i].tail(out))
        return [b for b in rest if self._core.prefetch.current(b)] or None

    @property
    def finished(self) -> bool:
        """Not following: every partition was read to its end and handed out."""
        return self._core.ready and self._core.prefetch.finished

    def metrics(self) -> dict[str, Any]:
        """Fetches made; bytes of the answers waiting now and at most, the bound, and
        the largest answer (what waits never passes the bound plus one answer)."""
        with self._guard():
            return self._core.metrics()
