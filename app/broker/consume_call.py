"""One ``POST /consume``, served the same whichever way it came in (the FastAPI route or
the hot lane, app/routes/consume.py).

One small object per request, holding what the request needs (what it uses of the
broker, :class:`Consuming`; the parsed request; its share of the answer budget), its
steps in order: the request within the limits, its partitions' positions resolved
("earliest"/"latest" from the log, "committed" from the group), a committing member
checked, unknown partitions refused, the read (a long-poll), what was delivered
committed, the outcomes counted, and the answer's bytes, JSON or binary
(app/broker/answers.py), compressed for the caller. It answers bytes and what they
hold, not HTTP: the route adds only the response around them.

The answer holds its share of the answer budget (app/broker/answering.py) from its first
read until it has been sent (:attr:`ConsumeAnswer.release`); on any failure before the
answer is ready, the share is given back here; once it is, by whoever holds the
answer (the route, if building the response around it fails).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.broker import answers, roles
from app.broker.answer_compression import compress_answer
from app.broker.answering import BINARY_FACTOR, JSON_FACTOR, AnswerHold
from app.broker.consume import ConsumeService, Fetch
from app.broker.metrics import ConsumeMetrics
from app.broker.positions import NAMED, Positions, named_offset
from app.broker.topic_view import TopicDirectory
from app.errors import InvalidRequest, LlogError, PayloadTooLarge
from app.groups.committed_offsets import Reset
from app.groups.service import GroupService
from app.settings import LimitSettings
from app.storage.keys import TopicPartition
from app.storage.log_positions import PartitionOffsets
from app.storage.reader import ReadOutcome, ReadResult
from app.wire import records as wire

Outcomes = list[ReadOutcome]
# Runs the read, or answers None when the caller went away first (the read cancelled).
Until = Callable[[Callable[[], Awaitable[Outcomes]]], Awaitable[tuple[Outcomes] | None]]


class FetchAsk(Protocol):
    """One partition of a consume request (app/routes/models.py's ConsumeTopicPartition)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def fetch_offset(self) -> int | str: ...
    @property
    def partition_max_bytes(self) -> int | None: ...


class ConsumeAsk(Protocol):
    """A consume request, parsed (app/routes/models.py's ConsumeRequest)."""

    @property
    def topic_partitions(self) -> Sequence[FetchAsk]: ...
    @property
    def max_wait_ms(self) -> int: ...
    @property
    def min_bytes(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def encoding(self) -> str: ...
    @property
    def group(self) -> str | None: ...
    @property
    def member_id(self) -> str | None: ...
    @property
    def generation(self) -> int | None: ...
    @property
    def auto_offset_reset(self) -> Reset: ...
    @property
    def commit(self) -> bool: ...


@dataclass(frozen=True)
class Consuming:
    """What a consume request uses of the broker; without the read role, ``consume``
    and ``groups`` are stand-ins that refuse (app/broker/roles.py)."""

    limits: LimitSettings
    answer_encodings: tuple[str, ...]  # LLOG_ANSWER_ENCODINGS, the server's
    consume: ConsumeService
    positions: Positions  # "earliest" and "latest"
    groups: GroupService  # "committed", and commits
    topics: TopicDirectory  # unknown partitions are refused, not read
    metrics: ConsumeMetrics


@dataclass(frozen=True)
class ConsumeAnswer:
    """The answer's bytes, as sent (compressed with ``content_encoding``, if named)."""

    parts: Sequence[bytes | memoryview]
    media_type: str
    content_encoding: str | None
    consumed: int  # the record bytes handed over, for the caller's account
    # Gives the answer's share of the budget back: call it once the answer was sent.
    release: Callable[[], None] | None


def group_of(ask: ConsumeAsk) -> str:
    assert ask.group is not None  # the model requires it with committed and commit
    return ask.group


def needs_group(ask: ConsumeAsk) -> bool:
    """Whether the request reads or writes its group's offsets."""
    return ask.commit or any(e.fetch_offset == "committed" for e in ask.topic_partitions)


class ConsumeCall:
    def __init__(self, broker: Consuming, ask: ConsumeAsk, *, binary: bool,
                 accept_encoding: str | None, until: Until,
                 started: float | None = None) -> None:
        self.broker = broker
        self.ask = ask
        self.binary = binary
        self.accept_encoding = accept_encoding
        self.until = until
        # When the request arrived (time.monotonic()), for the latency metric.
        self.started = time.monotonic() if started is None else started
        self.fetches: list[Fetch] = []
        # The fetches that are answered with an error without being read, by index.
        self.refused: dict[int, LlogError] = {}

    async def answer(self) -> ConsumeAnswer | None:
        """The answer; None when the caller went away while the read waited."""
        service = self.broker.consume
        refused = roles.refusal_of(service)
        if refused is not None:  # every partition answers the refusal
            await self._positions()
            return await self._answered([refused] * len(self.fetches), None)
        hold = service.answer(BINARY_FACTOR if self.binary else JSON_FACTOR)
        try:
            await self._positions()
            outcomes = await self._read(service, hold)
            if outcomes is None:  # the client went away; nobody reads this answer
                hold.release()
                return None
            return await self._answered(outcomes, hold)
        except BaseException:
            hold.release()
            raise

    async def _positions(self) -> None:
        """The request as fetches within the limits, each at the offset it names."""
        self.fetches = self._checked()
        await self._resolve_named()
        await self._resolve_committed()

    async def _answered(self, outcomes: Outcomes, hold: AnswerHold | None) -> ConsumeAnswer:
        """What was delivered committed (when asked), the outcomes counted, the answer
        encoded."""
        committed = await self._commit_delivered(outcomes) if self.ask.commit else {}
        outcomes = [_unless_refused(o, committed.get(i)) for i, o in enumerate(outcomes)]
        self._count(outcomes)
        return await self._encoded(outcomes, committed, hold)

    def _checked(self) -> list[Fetch]:
        """The request as fetches, within the configured limits (400/413 otherwise)."""
        ask, s = self.ask, self.broker.limits
        if ask.max_wait_ms > s.max_wait_ms_ceiling:
            raise InvalidRequest(f"max_wait_ms {ask.max_wait_ms} exceeds the ceiling of "
                                 f"{s.max_wait_ms_ceiling}")
        PayloadTooLarge.unless_within(len(ask.topic_partitions), s.max_partitions_per_request)
        if ask.max_bytes > s.max_fetch_bytes:
            raise InvalidRequest(f"max_bytes {ask.max_bytes} exceeds the limit of "
                                 f"{s.max_fetch_bytes}")
        fetches: list[Fetch] = []
        seen: set[TopicPartition] = set()
        for entry in ask.topic_partitions:
            tp = TopicPartition(entry.topic, entry.partition)
            if tp in seen:
                raise InvalidRequest(f"a partition appears more than once ({tp}); name "
                                     "each partition once")
            seen.add(tp)
            most = entry.partition_max_bytes
            if most is not None and most > s.max_fetch_bytes:
                raise InvalidRequest(f"partition_max_bytes {most} for {tp} exceeds the "
                                     f"limit of {s.max_fetch_bytes}")
            # "earliest" is read as 0: the read takes the log start from the control
            # record it reads the records by (app/storage/reader.py), so a start moved
            # meanwhile is never refused as out of range. The others are resolved below
            # (0 until then: the log start, were the lookup to fail).
            offset = entry.fetch_offset if isinstance(entry.fetch_offset, int) else 0
            fetches.append(Fetch(tp, offset, most))
        return fetches

    async def _resolve_named(self) -> None:
        """"latest" as an offset, and the log start its lookup read; a partition whose
        offsets could not be looked up reads from the log start, and its read answers
        why. ("earliest" is read as 0: :meth:`_checked`.)"""
        named = [(i, e.fetch_offset) for i, e in enumerate(self.ask.topic_partitions)
                 if e.fetch_offset in NAMED and e.fetch_offset != "earliest"]
        if not named:
            return
        found = await self.broker.positions.lookup_all(
            [(self.fetches[i].tp, None) for i, _ in named])
        for (i, name), where in zip(named, found, strict=True):
            if isinstance(where, PartitionOffsets):
                self.fetches[i] = dataclasses.replace(
                    self.fetches[i], offset=named_offset(where, name),
                    log_start=where.log_start)

    async def _resolve_committed(self) -> None:
        """"committed" as one past the group's committed offset (or by
        auto_offset_reset); a partition without one is refused, not read."""
        at = [i for i, e in enumerate(self.ask.topic_partitions) if e.fetch_offset == "committed"]
        if not at:
            return
        positions = await self.broker.groups.offsets.positions(
            group_of(self.ask), [self.fetches[i].tp for i in at], self.ask.auto_offset_reset)
        for i, position in zip(at, positions, strict=True):
            if isinstance(position, LlogError):
                self.refused[i] = position
            else:
                self.fetches[i] = dataclasses.replace(self.fetches[i], offset=position)

    async def _read(self, service: ConsumeService, hold: AnswerHold
                    ) -> Outcomes | None:
        """Each fetch's outcome: read (a long-poll), or why it was refused; None when
        the caller went away first."""
        ask = self.ask
        if ask.commit:  # a member that may not commit is refused before any wait
            await self.broker.groups.offsets.authorise(
                group_of(ask), ask.member_id, ask.generation, [f.tp for f in self.fetches])
        self.refused.update(await self._unknown())
        readable = [f for i, f in enumerate(self.fetches) if i not in self.refused]
        answered = await self.until(lambda: service.consume(
            readable, max_wait_s=ask.max_wait_ms / 1000, min_bytes=ask.min_bytes,
            max_bytes=ask.max_bytes, hold=hold)) if readable else ([],)
        if answered is None:
            return None
        read = iter(answered[0])
        return [self.refused[i] if i in self.refused else next(read)
                for i in range(len(self.fetches))]

    async def _unknown(self) -> dict[int, LlogError]:
        """The fetches of partitions that do not exist (when topics are not auto-created),
        by index, with their error (those refused already are not looked at)."""
        out: dict[int, LlogError] = {}
        for i, fetch in enumerate(self.fetches):
            if i in self.refused:
                continue
            try:
                await self.broker.topics.check_readable(fetch.tp)
            except LlogError as exc:
                out[i] = exc
        return out

    async def _commit_delivered(self, outcomes: Outcomes) -> dict[int, int | LlogError]:
        """Commit the last record delivered of each partition that delivered any, before
        the answer leaves (at-most-once); by index, the offset committed or why not."""
        delivered = [(i, fetch.tp, outcome.next_offset - 1) for i, (fetch, outcome)
                     in enumerate(zip(self.fetches, outcomes, strict=True))
                     if isinstance(outcome, ReadResult) and outcome.records]
        if not delivered:
            return {}
        ask = self.ask
        done: list[int | LlogError]
        try:
            done = await self.broker.groups.offsets.commit(
                group_of(ask), ask.member_id, ask.generation,
                [(tp, offset) for _, tp, offset in delivered], check_bounds=False)
        except LlogError as exc:  # the group changed while the request waited
            done = [exc] * len(delivered)
        return {i: outcome for (i, _, _), outcome in zip(delivered, done, strict=True)}

    def _count(self, outcomes: Outcomes) -> None:
        metrics = self.broker.metrics
        for outcome in outcomes:
            if isinstance(outcome, ReadResult):
                metrics.records.inc(len(outcome.records))
                metrics.bytes.inc(outcome.size)
            else:
                metrics.failed_entries.labels(outcome.error_type).inc()

    async def _encoded(self, outcomes: Outcomes, committed: dict[int, int | LlogError],
                       hold: AnswerHold | None) -> ConsumeAnswer:
        parts: Sequence[bytes | memoryview]
        if self.binary:
            parts = wire.build_parts([answers.consume_binary(f.tp, o)
                                      for f, o in zip(self.fetches, outcomes, strict=True)])
        else:
            parts = [answers.consume_answer([
                answers.consume_result(fetch.tp, outcome, self.ask.encoding, committed.get(i))
                for i, (fetch, outcome) in enumerate(zip(self.fetches, outcomes,
                                                         strict=True))])]
        if hold is not None:  # from here the answer holds what it sends, until it is sent
            # (the raw size: compressed, the answer is smaller, and both exist meanwhile)
            hold.hold(sum(len(p) for p in parts))
        parts, encoding = await compress_answer(parts, self.accept_encoding,
                                                self.broker.answer_encodings)
        self.broker.metrics.requests.inc()
        self.broker.metrics.latency.observe(time.monotonic() - self.started)
        return ConsumeAnswer(parts, wire.CONTENT_TYPE if self.binary else "application/json",
                             encoding,
                             sum(o.size for o in outcomes if isinstance(o, ReadResult)),
                             None if hold is None else hold.release)


def _unless_refused(outcome: ReadOutcome, commit: int | LlogError | None) -> ReadOutcome:
    """A partition whose commit failed answers the error, not records it did not commit."""
    return commit if isinstance(commit, LlogError) else outcome
