"""What a consumer's worker does, free of I/O like :mod:`llog_client._ops`, so the sync
consumer (a thread) and the async one (a task) share it.

:meth:`Core.run` is the worker: it finds its partitions (the topics' partitions, or
joins the group), then fetches ahead while the queue has room, heartbeats and commits
when due, and on close commits what was processed and leaves. It yields what the driver
does: a :class:`~llog_client._ops.Send` (JSON), a :class:`~llog_client._fetcher.FetchSend`
(the binary consume), a :class:`~llog_client._ops.Pause` (a retry's backoff) or a
:class:`~llog_client._fetcher.Wait` (nothing to do until something changes). The sync
driver holds its lock while the generator runs and releases it for each action.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llog_client import _group_ops as group_ops
from llog_client import _ops as ops
from llog_client._errors import (
    GroupConflict,
    LlogError,
    PartitionNotAssigned,
    StaleGeneration,
    UnknownMember,
)
from llog_client._fetcher import Action, Answer, FetchSend, Wait, consume_body, fetch
from llog_client._models import GroupMembership, Position, Start, TopicPartitionKey
from llog_client._ops import Pause
from llog_client._prefetch import Plan, Prefetch
from llog_client._progress import Progress
from llog_client._records import PartitionBatch
from llog_client._retry import RetryPolicy

Key = TopicPartitionKey
Delivery = Literal["at-least-once", "at-most-once"]
Work = Generator[Action, Answer, Any]
DEFAULT_WAIT_MS = 500  # a consumer's long-poll: also how long close may wait for one
# An answer's budget, and how much may wait fetched ahead. Measured (docs/client.md):
# catching up on 4 partitions of 1 KiB records, answers of 16 MiB came a quarter faster
# than answers of 4 MiB (what the broker and the client pay per request, and the
# handovers between the consumer's threads, come a quarter as often). Kafka's consumers
# fetch up to 50 MiB at a time.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_PREFETCH_BYTES = 32 * 1024 * 1024
DEFAULT_COMMIT_INTERVAL_MS = 1000
_ERROR_PAUSE_S = 1.0  # before a heartbeat or commit that failed is tried again


@dataclass(frozen=True)
class Settings:
    """A consumer's options (see :class:`~llog_client.Consumer`)."""

    topics: tuple[str, ...] = ()
    partitions: tuple[Key, ...] | None = None
    group: str | None = None
    start: Start = "earliest"
    follow: bool = True
    delivery: Delivery = "at-least-once"
    auto_commit: bool = True
    commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_wait_ms: int = DEFAULT_WAIT_MS
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    compressed: bool = False
    client_id: str | None = None
    session_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.partitions is None) == (not self.topics):
            raise ValueError("give topics or partitions (one of them)")
        if self.group is not None and self.start not in ("earliest", "latest"):
            raise ValueError("a group's start (auto_offset_reset) is 'earliest' or 'latest'")
        if self.group is not None and not self.follow:
            raise ValueError("a group consumer follows its partitions (follow=False is for "
                             "a consumer without a group)")
        if self.delivery not in ("at-least-once", "at-most-once"):
            raise ValueError(f"delivery is 'at-least-once' or 'at-most-once', "
                             f"not {self.delivery!r}")
        if self.delivery == "at-most-once" and not self.member:
            raise ValueError("at-most-once delivery is a group member's (topics and group)")
        if min(self.max_bytes, self.prefetch_bytes, self.commit_interval_ms) < 1 or \
                self.max_wait_ms < 0:
            raise ValueError("byte budgets and the commit interval are positive")

    @property
    def member(self) -> bool:
        """A member of a group, which assigns it partitions of the topics."""
        return self.group is not None and self.partitions is None

    @property
    def commits(self) -> bool:
        """The consumer commits what the program processed."""
        return self.group is not None and self.delivery == "at-least-once"


class Core:
    def __init__(self, settings: Settings, policy: RetryPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = s = settings
        self.policy = policy
        self.clock = clock
        reset: Position = s.start if s.start in ("earliest", "latest") else "earliest"
        self.prefetch = Prefetch(prefetch_bytes=s.prefetch_bytes, follow=s.follow,
                                 reset="committed" if s.group is not None else reset,
                                 attempts=policy.max_attempts)
        self.progress = Progress(self.prefetch)
        self.membership: GroupMembership | None = None
        self.ready = False  # its partitions are known (joined)
        self.closing = False
        self.stopped = False  # the worker is done
        self.fatal: BaseException | None = None  # what ended the worker early
        self.close_error: LlogError | None = None
        self.epoch = 0  # moves on with every seek and assignment: the iteration looks
        self.commit_asked = self.commit_done = 0
        self.commit_result: dict[Key, int] | LlogError = {}
        self.next_heartbeat = self.next_commit = math.inf

    # -- the worker -------------------------------------------------------------------

    def run(self) -> Work:
        yield from self._begin()
        self.ready = True
        while not self.closing:
            yield from self._tend()
            if self.closing:
                break
            plan = self.prefetch.plan()
            if plan is None:
                yield Wait(self._until_due())
            else:
                yield from self._fetch(plan)
        yield from self._finish()

    def _begin(self) -> Work:
        s = self.settings
        if s.commits and s.auto_commit:
            self.next_commit = self.clock() + s.commit_interval_ms / 1000
        if s.member:
            yield from self._join()
            return
        keys = s.partitions
        if keys is None:
            keys = ()
            for topic in s.topics:
                info = yield from ops.describe_topic(topic, self.policy)
                keys += tuple((topic, p) for p in range(info.partitions))
        self.prefetch.assign(keys, "committed" if s.group is not None else s.start)

    def _tend(self) -> Work:
        """Heartbeat, and commit what is asked for or due. An error of either is the
        program's to see (on its next poll); the worker tries again a little later."""
        s, now = self.settings, self.clock()
        try:
            if s.member and self.membership is None:
                yield from self._join()
            elif s.member and now >= self.next_heartbeat:
                yield from self._heartbeat()
        except LlogError as exc:
            self.next_heartbeat = now + _ERROR_PAUSE_S
            self.prefetch.failed(exc)
        if self.commit_asked > self.commit_done:
            asked = self.commit_asked
            try:
                self.commit_result = yield from self._commit()
            except LlogError as exc:
                self.commit_result = exc
            self.commit_done = asked
        elif now >= self.next_commit:
            self.next_commit = now + s.commit_interval_ms / 1000
            try:
                yield from self._commit()
            except LlogError as exc:
                self.prefetch.failed(exc)

    def _until_due(self) -> float | None:
        due = min(self.next_heartbeat, self.next_commit)
        return None if due == math.inf else max(0.0, due - self.clock())

    def _fetch(self, plan: Plan) -> Work:
        s = self.settings
        wait_ms = s.max_wait_ms
        if s.member:  # a long-poll never outlasts the next heartbeat
            wait_ms = max(0, min(wait_ms, int((self.next_heartbeat - self.clock()) * 1000)))
        member = self.membership
        commit_as = (member.member_id, member.generation) if (
            member is not None and s.delivery == "at-most-once") else None
        send = FetchSend(consume_body(plan.positions, max_wait_ms=wait_ms,
                                      max_bytes=s.max_bytes, group=s.group,
                                      reset=str(s.start), commit_as=commit_as),
                         wait_ms / 1000, s.compressed)
        try:
            results = yield from fetch(send, self.policy, lambda: self.closing)
        except GroupConflict:  # at-most-once: the member's view is out of date
            try:
                yield from self._rejoin_or_heartbeat()
            except LlogError as exc:
                self.prefetch.failed(exc)
            return
        except LlogError as exc:
            self.prefetch.failed(exc)
            return
        nbytes = next((len(r.buffer) for r in results if isinstance(r, PartitionBatch)), 0)
        try:
            failed = self.prefetch.answered(plan, results, nbytes)
        except LlogError as exc:  # an answer that does not match its request
            self.prefetch.failed(exc)
            return
        if failed:  # only errors a retry may get past came: back off before it
            yield Pause(self.policy.delay_s(failed - 1))

    def _finish(self) -> Work:
        """Commit what was processed (unless only ``commit()`` commits), then leave the
        group."""
        try:
            if self.settings.commits and self.settings.auto_commit:
                yield from self._commit()
        except LlogError as exc:
            self.close_error = exc
        member = self.membership
        if member is not None:
            try:
                yield from group_ops.leave(member.group, member.member_id, self.policy)
            except LlogError as exc:
                self.close_error = self.close_error or exc
            # Only now: a worker stopped in the middle (cancelled) leaves it to its driver.
            self.membership = None

    # -- the group --------------------------------------------------------------------

    def _join(self) -> Work:
        """Join (again): a new member id; every partition resumes from the committed
        offsets."""
        s = self.settings
        assert s.group is not None
        self.membership = None
        self.prefetch.clear()
        self.progress.forget()
        self._moved()
        membership = yield from group_ops.join(s.group, list(s.topics), s.client_id,
                                               s.session_timeout_ms, self.policy)
        self._adopt(membership)

    def _heartbeat(self) -> Work:
        """Learn the current assignment; True when the generation moved."""
        member = self.membership
        assert member is not None
        try:
            membership = yield from group_ops.heartbeat(member.group, member.member_id,
                                                        self.policy)
        except UnknownMember:
            yield from self._join()
            return True
        self._adopt(membership)
        return membership.generation != member.generation

    def _rejoin_or_heartbeat(self) -> Work:
        if self.membership is None:
            yield from self._join()
        else:
            yield from self._heartbeat()

    def _adopt(self, membership: GroupMembership) -> None:
        """Follow the assignment: drop lost partitions (and what was fetched for
        them), read gained ones from the committed offsets, keep the others' positions."""
        owned = set(membership.assignment)
        lost = set(self.prefetch.at) - owned
        if lost or owned - set(self.prefetch.at):
            self.prefetch.assign(membership.assignment, "committed")
            self.progress.forget(lost)
            self._moved()
        self.membership = membership
        self.next_heartbeat = self.clock() + membership.heartbeat_interval_ms / 1000

    def _commit(self) -> Work:
        """Commit what was processed and not yet committed, in this generation; after a
        rebalance, only what this member still owns."""
        s = self.settings
        due = self.progress.due()
        member = self.membership
        if not due or not s.commits or (s.member and member is None):
            return {}
        assert s.group is not None
        member_id = member.member_id if member is not None else None
        generation = member.generation if member is not None else None
        try:
            yield from group_ops.commit(s.group, due, member_id, generation, self.policy)
        except (StaleGeneration, PartitionNotAssigned):
            if not member or not (yield from self._heartbeat()):
                raise
            return (yield from self._commit())  # what is still ours
        except UnknownMember:
            yield from self._join()
            return {}
        self.progress.committed.update(due)
        return due

    # -- what the program does ----------------------------------------------------------

    def _moved(self) -> None:
        self.epoch += 1

    def seek(self, key: Key, position: Start) -> None:
        if key not in self.prefetch.at:
            raise ValueError(f"{key[0]}/{key[1]} is not assigned to this consumer")
        self.prefetch.seek(key, position)
        self.progress.forget({key})
        self._moved()

    def assigned(self) -> list[Key]:
        return list(self.prefetch.at)

    def check(self) -> None:
        """Raise what ended the worker."""
        if self.fatal is not None:
            raise self.fatal

    def metrics(self) -> dict[str, Any]:
        p = self.prefetch
        return {"fetches": p.fetches, "buffered_bytes": p.buffered,
                "max_buffered_bytes": p.max_buffered, "prefetch_bytes": p.prefetch_bytes,
                "max_answer_bytes": p.max_answer,
                "waiting_answers": len(p.queue), "partitions": len(p.at)}


def keys_of(partitions: Sequence[Key] | None) -> tuple[Key, ...] | None:
    return None if partitions is None else tuple((str(t), int(p)) for t, p in partitions)
