"""What the producer does with each batch of an answered (or broken) request: free of
I/O, called with the producer's lock held.

- Acknowledged: settled, with the partition the broker placed it in.
- Refused whole for what the request held (400, 403, 404, 413), with other batches: sent
  again alone, so only the batch at fault fails.
- Retriable: sent again after a backoff (exponential, at least the broker's
  ``Retry-After`` up to :data:`MAX_RETRY_AFTER_S`), on the next broker when the broker
  answered, until the batch's delivery deadline; then ``DeliveryTimeout``.
- Otherwise failed with the error, ``maybe_written`` when any attempt may have been.
- ``UnknownProducer`` (the partition forgot the producer's sequence): retried as the
  first of a new sequence, unless an attempt may have been written (then failed).
- ``OutOfOrderSequence`` (or ``UnknownProducer``) while a batch before it in its sequence
  is still to be answered: sent again as soon as that one is. A batch that fails for
  good breaks its partition's sequence (:meth:`Accumulator.sequence_broken`); one sent
  before that and not written takes a place in the new sequence.

A batch that fails for good after an attempt that may still commit holds its partition
back until that attempt's commit deadline has passed (the broker refuses to commit it
after that, docs/http-api.md, Commit deadline): a later batch of the partition is never
stored before an earlier one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

from llog_client._accumulator import Accumulator, Batch
from llog_client._compression import Compression
from llog_client._config import MAX_COMMIT_DEADLINE_MS, ClientConfig
from llog_client._errors import (
    DeliveryTimeout,
    LlogError,
    OutOfOrderSequence,
    UnknownProducer,
)
from llog_client._producer_metrics import ProducerMetrics
from llog_client._sequences import ProducerSequences
from llog_client._wire import Broken, Outcome

# How long a broker's Retry-After is honoured at most (the blocking client's ceiling).
MAX_RETRY_AFTER_S = 30.0
# Statuses that refuse a request whole for what one of its entries holds.
_REFUSED_WHOLE = (400, 403, 404, 413)


@dataclass(frozen=True)
class SenderSettings:
    max_in_flight: int
    max_request_bytes: int
    max_request_records: int
    max_request_entries: int
    delivery_timeout_s: float
    backoff_s: float
    backoff_max_s: float
    compression: Compression | None  # None: as the topics store their records


class RetryRules:
    """See the module."""

    def __init__(self, settings: SenderSettings, acc: Accumulator, metrics: ProducerMetrics,
                 config: ClientConfig, sequences: ProducerSequences | None = None) -> None:
        self._settings, self._acc, self._metrics, self._config = settings, acc, metrics, config
        self._sequences = sequences

    def settle(self, batches: Sequence[Batch], settled: Sequence[tuple[int, bool] | LlogError],
               placed: Sequence[int], outcome: Outcome, started: float, now: float
               ) -> tuple[list[Batch], bool]:
        """Each batch acknowledged, requeued or failed: those finished, and whether the
        broker answered a refusal worth retrying elsewhere (the next broker may take
        it)."""
        self._metrics.request(now - started, failed=all(
            isinstance(s, LlogError) for s in settled))
        split = len(batches) > 1 and not isinstance(outcome, Broken) and (
            outcome.status in _REFUSED_WHOLE)
        moved = False
        done: list[Batch] = []
        for batch, result, partition in zip(batches, settled, placed, strict=True):
            if not isinstance(result, LlogError):
                self._acc.settled(batch)
                batch.route = (batch.topic, partition, batch.route[2])
                batch.finish(*result)
                self._metrics.delivered(batch)
                done.append(batch)
                continue
            error = self._noted(batch, copy.copy(result), now)
            if split:
                batch.alone = True  # refused whole with others: try it by itself
                self._acc.requeue(batch, now)
                continue
            if self._sequences is not None and batch.producer_id:
                placed_error = self._in_sequence(batch, error)
                if placed_error is None:
                    # Read before the batch ahead of it in its sequence was committed (a
                    # new producer's 1 before its 0 is "unknown"): it goes again as soon
                    # as that one is answered (its queue holds it back until then).
                    self._metrics.retries += 1
                    self._acc.requeue(batch, now)
                    continue
                error = placed_error
            final = self._retry_or_final(batch, error, now)
            if final is None:
                moved = moved or not isinstance(outcome, Broken)
                continue
            self._acc.settled(batch, self._hold_until(batch))
            self.fail(batch, final)
            done.append(batch)
        return done, moved

    def _in_sequence(self, batch: Batch, error: LlogError) -> LlogError | None:
        """What a refusal means for a batch of a producer sequence: None to send it again
        as soon as the batches before it are answered; else the error to go on with
        (the batch may have been given a place in a new sequence)."""
        assert self._sequences is not None
        if self._sequences.left(batch):
            # Its sequence was left (a batch before it failed for good) while it was out.
            never = batch.behind_certain or (
                isinstance(error, OutOfOrderSequence)
                and not self._acc.predecessor_pending(batch))
            if not never:
                batch.stale = True  # it may yet be written under the old one: alone
                return error
            # Never written: the batch its sequence broke at was not (nothing after it
            # can be), or the partition says it is not the next while nothing before it
            # is still to come. It takes a place in the new sequence.
            _reset(batch)
            batch.maybe_written = False
            error = copy.copy(error)
            error.maybe_written, error.retriable = False, True
            return error
        if (isinstance(error, OutOfOrderSequence | UnknownProducer)
                and self._acc.predecessor_pending(batch)):
            return None
        if isinstance(error, UnknownProducer) and not batch.maybe_written:
            # Forgotten by the partition, and no attempt of it may have been written: the
            # partition starts a new sequence, this batch first.
            self._break(batch)
            _reset(batch)
            error.retriable = True
        return error

    def _noted(self, batch: Batch, error: LlogError, ended: float) -> LlogError:
        """Remember the attempt's error; one that may have written marks the batch,
        with when the attempt ended: the broker counts its commit deadline from the
        request's arrival, which comes after the request started, not before the
        client saw it fail."""
        batch.last_error = error
        if error.maybe_written:
            batch.maybe_written = True
            batch.maybe_ended_at = ended
        return self.carried(batch, error)

    def carried(self, batch: Batch, error: LlogError) -> LlogError:
        """``error``, saying ``maybe_written`` when an earlier attempt may have written."""
        if batch.maybe_written and not error.maybe_written:
            error = copy.copy(error)
            error.maybe_written = True
            error.__cause__ = error.__cause__ or batch.last_error
        return error

    def _retry_or_final(self, batch: Batch, error: LlogError, now: float) -> LlogError | None:
        """Requeue ``batch`` if an attempt may succeed before its deadline (None); else
        the error to fail it with."""
        if not error.retriable:
            return error
        s = self._settings
        backoff = min(s.backoff_max_s, s.backoff_s * 2 ** (batch.attempts - 1))
        if error.retry_after_s is not None:
            backoff = max(backoff, min(error.retry_after_s, MAX_RETRY_AFTER_S))
        if now + backoff >= batch.deadline:
            return self.timed_out(batch, error)
        self._metrics.retries += 1
        self._acc.requeue(batch, now + backoff)
        return None

    def _hold_until(self, batch: Batch) -> float | None:
        """When the last attempt that may have written can no longer commit: its end,
        plus the commit deadline it carried (the broker counts it from the request's
        arrival, before the end the client saw), plus the deadline's margin, for bytes
        of the request still on their way when the client gave up on it."""
        if not (self._acc.ordered and batch.maybe_written):
            return None
        deadline_ms = self._config.commit_deadline_ms() or MAX_COMMIT_DEADLINE_MS
        return batch.maybe_ended_at + deadline_ms / 1000 + self._config.deadline_margin_s()

    def expire(self, batch: Batch) -> None:
        """A queued batch past its delivery deadline (taken out of its queue): failed,
        its lane held if an earlier attempt may still commit."""
        until = self._hold_until(batch)
        if until is not None:
            self._acc.hold(batch.route, until)
        self.fail(batch, self.timed_out(batch, None))

    def timed_out(self, batch: Batch, cause: LlogError | None) -> LlogError:
        cause = cause or batch.last_error
        error = DeliveryTimeout(
            f"{len(batch)} records not acknowledged within the delivery timeout "
            f"({self._settings.delivery_timeout_s:g} s, {batch.attempts} attempts"
            + (f"; last: {cause}" if cause is not None else "") + ")",
            maybe_written=batch.maybe_written, topic=batch.topic, partition=batch.partition)
        error.__cause__ = cause
        return error

    def fail(self, batch: Batch, error: LlogError) -> None:
        """(lock held; notify it after) A batch of a producer sequence that fails breaks
        it: the partition goes on under a new one."""
        if self._sequences is not None:
            self._break(batch)
        self._metrics.failed(batch)
        batch.fail(error)

    def _break(self, batch: Batch) -> None:
        """``batch``'s partition goes on under a new sequence (unless it left this one
        already)."""
        assert self._sequences is not None
        if self._sequences.broken(batch):
            self._acc.sequence_broken(batch)


def _reset(batch: Batch) -> None:
    """``batch`` holds no place in any sequence: it takes one when sent again."""
    batch.producer_id, batch.sequence = "", -1
    batch.stale = batch.behind_certain = False
