"""One ``POST /produce``, its entries parsed (app/routes/produce_body.py, app/wire/produce.py):
every limit checked first (before a topic is made), the entries placed in their
partitions, appended, and answered (app/broker/answers.py).

One small object per request, as :class:`~app.broker.consume_call.ConsumeCall` is for a
consume; it answers the body and the outcomes, and the route (app/routes/produce.py)
turns them into a status and a response.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from app.broker import answers, roles
from app.broker.metrics import ProduceMetrics
from app.broker.topic_view import TopicDirectory
from app.errors import InvalidRequest, LlogError, PayloadTooLarge, Unavailable
from app.settings import LimitSettings
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import payload_size
from app.wire.produce import Entry

# A client's own commit deadline, in ms, shorter than the broker's (never longer): its
# timeout less a margin, so that its resend comes after the deadline (docs/http-api.md).
COMMIT_DEADLINE_HEADER = "llog-commit-deadline-ms"
_MAX_DEADLINE_DIGITS = 10  # more than any setting allows, and no huge int parsed
# Appends a request's groups: one outcome per group, in order (app/broker/appends.py).
Append = Callable[[Sequence[AppendGroup]], Awaitable[list[AppendOutcome]]]


@dataclass(frozen=True)
class Producing:
    """What a produce request uses of the broker; without the write role, ``topics``
    and ``append`` are stand-ins that refuse (app/broker/roles.py)."""

    limits: LimitSettings
    topics: TopicDirectory  # where entries are placed
    append: Append
    metrics: ProduceMetrics


@dataclass(frozen=True)
class ProduceAnswer:
    body: bytes
    errors: int  # entries that failed
    unavailable: bool  # every entry failed as unavailable: nothing was written, retry
    produced: int  # the record bytes newly written, for the caller's account


class ProduceCall:
    def __init__(self, broker: Producing, entries: list[Entry], *,
                 charge: Callable[[int], None], located: Callable[[str], bool],
                 started: float, deadline_ms: int) -> None:
        self.broker = broker
        self.entries = entries
        self.charge = charge  # the bytes to the caller's quota, once within the limits
        self.located = located  # whether the caller is told where an entry of a topic lives
        self.started = started  # time.monotonic() when the request came in
        # No commit of the entries expects a control version read after this
        # (AppendGroup.commit_by): counted from the request's arrival, not from when a
        # flush takes it, since the client's timeout runs from before it sent.
        self.commit_by = started + deadline_ms / 1000

    async def answer(self) -> ProduceAnswer:
        """The answer's body and outcomes: each entry written, or why not (the request
        as a whole refused with 400, 404 or 413 before anything is written)."""
        entries, s = self.entries, self.broker.limits
        outcomes: list[AppendOutcome]
        refused = roles.refusal_of(self.broker.topics)
        if refused is not None:  # every entry answers the refusal
            outcomes = [refused] * len(entries)
            groups = [AppendGroup(TopicPartition(e.topic, e.partition or 0), e.records)
                      for e in entries]
        else:
            _check_limits(entries, s)  # every limit first: before a topic is made
            self.charge(sum(e.records.size for e in entries))
            groups = await _place(entries, s, self.broker.topics, self.commit_by)
            try:
                outcomes = await self.broker.append(groups)
            except LlogError as exc:  # refused as a whole: nothing was written
                outcomes = [exc] * len(groups)
        results = [answers.produce_result(group, outcome, self.located)
                   for group, outcome in zip(groups, outcomes, strict=True)]
        self._count(groups, outcomes)
        written = [(g, o) for g, o in zip(groups, outcomes, strict=True)
                   if isinstance(o, AppendResult) and not o.duplicate]
        errors = sum(not r["ok"] for r in results)
        return ProduceAnswer(answers.produce_answer(results), errors,
                             errors > 0 and all(isinstance(o, Unavailable) for o in outcomes),
                             sum(g.size for g, _ in written))

    def done(self, status: int) -> None:
        """Count the request, answered with ``status``."""
        metrics = self.broker.metrics
        metrics.requests.labels(str(status)).inc()
        metrics.latency.observe(time.monotonic() - self.started)

    def _count(self, groups: list[AppendGroup], outcomes: list[AppendOutcome]) -> None:
        # Summed first: a counter's inc takes its lock, once per request, not per entry.
        metrics = self.broker.metrics
        records = size = 0
        for group, outcome in zip(groups, outcomes, strict=True):
            if not isinstance(outcome, AppendResult):
                metrics.failed_entries.labels(outcome.error_type).inc()
            elif not outcome.duplicate:
                records += outcome.count
                size += group.size
        if records:
            metrics.records.inc(records)
            metrics.bytes.inc(size)


def _check_limits(entries: list[Entry], s: LimitSettings) -> None:
    """The request within the configured limits (413 otherwise); its count of entries
    was checked where its body was parsed (app/routes/produce.py)."""
    total = sum(e.records.n_records for e in entries)
    if total > s.max_records_per_request:
        raise PayloadTooLarge(
            f"{total} records in one request; the limit is {s.max_records_per_request}")
    for entry in entries:
        _check_records(entry.topic, entry.records, s, s.max_record_bytes)


def commit_deadline_ms(header: str | None, s: LimitSettings) -> int:
    """The request's commit deadline: ``LLOG_PRODUCE_COMMIT_DEADLINE_MS``, or the
    client's :data:`COMMIT_DEADLINE_HEADER` when that is shorter; a header that is not a
    whole number of milliseconds, at least 1, is refused (400) before anything is read."""
    ceiling = s.produce_commit_deadline_ms
    if header is None:
        return ceiling
    text = header.strip()
    if not (text.isascii() and text.isdigit()) or int(text[:_MAX_DEADLINE_DIGITS] or 0) < 1:
        raise InvalidRequest(f"{COMMIT_DEADLINE_HEADER} must be a whole number of "
                             f"milliseconds, at least 1; got {header[:40]!r}")
    if len(text) > _MAX_DEADLINE_DIGITS:  # longer than any setting: the setting
        return ceiling
    return min(int(text), ceiling)


async def _place(entries: list[Entry], s: LimitSettings, topics: TopicDirectory,
                 commit_by: float) -> list[AppendGroup]:
    """The entries as append groups in their partitions, due by ``commit_by``, or
    refused as a whole (unknown topic or partition: 404; a topic's own record limit:
    413)."""
    groups: list[AppendGroup] = []
    for entry in entries:
        where = await topics.place(entry.topic, entry.partition, entry.records)
        if where.max_record_bytes is not None:
            _check_records(entry.topic, entry.records, s, where.max_record_bytes)
        groups.append(AppendGroup(where.tp, entry.records, entry.idempotency_key,
                                  where.compression, commit_by=commit_by,
                                  producer=entry.producer))
    return groups


def _check_records(tp: str, records: RecordBatch, s: LimitSettings, max_record_bytes: int
                   ) -> None:
    """Each record within the size limits: by columns for a bytes-batch-v3 body (no
    step per record), record by record otherwise."""
    columns = records.columns
    if columns is not None:
        largest = max(columns.record_sizes())
        if largest > max_record_bytes:
            raise PayloadTooLarge(f"a record of {largest} bytes for {tp} exceeds the limit "
                                  f"of {max_record_bytes} bytes")
        if columns.key_lengths is not None and max(columns.key_lengths) > s.max_key_bytes:
            raise PayloadTooLarge(f"a key of {max(columns.key_lengths)} bytes for {tp} "
                                  f"exceeds the limit of {s.max_key_bytes} bytes")
        return
    for payload in records:
        size = payload_size(payload)
        if size > max_record_bytes:
            raise PayloadTooLarge(f"a record of {size} bytes for {tp} exceeds the limit of "
                                  f"{max_record_bytes} bytes")
        if isinstance(payload, bytes):
            continue
        if payload.key is not None and len(payload.key) > s.max_key_bytes:
            raise PayloadTooLarge(f"a key of {len(payload.key)} bytes for {tp} exceeds the "
                                  f"limit of {s.max_key_bytes} bytes")
        if len(payload.headers) > s.max_headers:
            raise PayloadTooLarge(f"{len(payload.headers)} headers on a record for {tp}; "
                                  f"the limit is {s.max_headers}")
        header_bytes = sum(len(n.encode()) + len(v) for n, v in payload.headers)
        if header_bytes > s.max_header_bytes:
            raise PayloadTooLarge(f"headers of {header_bytes} bytes on a record for {tp} "
                                  f"exceed the limit of {s.max_header_bytes} bytes")
