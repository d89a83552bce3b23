"""Every error the client raises, as one tree that mirrors the broker's ``error_type``
names (docs/http-api.md, Errors), plus two of its own for what never reached a broker's
answer.

Each error carries what a caller needs to act on it:

- ``error_type``: the broker's name for it (for a name this client does not know yet,
  the nearest class is raised and ``error_type`` keeps the broker's name);
- ``retriable``: sending the same request again may succeed (the client already did,
  up to its :class:`~llog_client.RetryPolicy`, before raising);
- ``maybe_written``: for a produce, the records may have been committed although that
  could not be confirmed;
- ``status``: the HTTP status of the answer, if there was one;
- ``topic``/``partition``: for a per-partition failure;
- ``produced``: for a produce, the batches acknowledged before the failure.

::

    LlogError
    ├── RequestError                 the request must change
    │   ├── InvalidRequest           400
    │   ├── PayloadTooLarge          413
    │   ├── OffsetOutOfRange         the fetch offset is outside log start .. hw + 1
    │   ├── UnknownTopic             404
    │   ├── UnknownPartition         404
    │   ├── TopicExists              409
    │   ├── PartitionsOnlyGrow       409  fewer partitions than the topic has
    │   ├── OffsetBeyondHighWatermark 409 commit an offset the log holds
    │   ├── UnknownGroup             404
    │   ├── GroupConflict            409: the member's view of its group is out of date
    │   │   ├── UnknownMember        join again
    │   │   ├── StaleGeneration      heartbeat for the current assignment
    │   │   ├── PartitionNotAssigned
    │   │   ├── GroupNotEmpty
    │   │   └── GroupFull
    │   ├── NotFound                 404 (unknown path)
    │   ├── MethodNotAllowed         405
    │   └── HTTPError                another 4xx
    ├── AccessError                  refused by the broker's access control
    │   ├── Unauthenticated          401  no token, or one that does not verify
    │   ├── Forbidden                403  the principal lacks the right
    │   └── QuotaExceeded            429  over the principal's quota; retriable
    ├── Unavailable                  refused before anything was written; retriable
    │   ├── BackPressureRejected
    │   ├── ShuttingDown
    │   ├── RoleDisabled
    │   └── ForwardExpired
    ├── StorageError
    │   ├── StorageUnavailable       retriable
    │   ├── CorruptData
    │   ├── ObjectMissing
    │   └── LogGap
    ├── AppendError                  one partition's append was not acknowledged
    │   ├── PartitionFenced
    │   ├── CommitConflict           retriable
    │   ├── CommitExpired            retriable
    │   ├── ProduceExpired           retriable
    │   └── CommitInDoubt            retriable, maybe written
    └── ClientError                  no usable answer from a broker
        ├── TransportError           connection refused, cut or timed out; retriable
        └── UnexpectedResponse       an answer outside the contract (e.g. a proxy's 502)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llog_client._models import ProducedBatch


class LlogError(Exception):
    """Base class of every error the client raises."""

    retriable: bool = False
    maybe_written: bool = False

    def __init__(self, message: str, *, error_type: str | None = None,
                 status: int | None = None, retriable: bool | None = None,
                 maybe_written: bool | None = None, retry_after_s: float | None = None,
                 topic: str | None = None, partition: int | None = None,
                 details: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type or type(self).__name__
        self.status = status
        # The broker's own flags win over the class defaults: it knows the case.
        if retriable is not None:
            self.retriable = retriable
        if maybe_written is not None:
            self.maybe_written = maybe_written
        self.retry_after_s = retry_after_s
        self.topic = topic
        self.partition = partition
        self.details = tuple(details)
        self.produced: tuple[ProducedBatch, ...] = ()

    def __str__(self) -> str:
        where = f"{self.topic}/{self.partition}: " if self.topic is not None else ""
        return f"{self.error_type}: {where}{self.message}"


class RequestError(LlogError):
    """The request must change; nothing was written."""


class InvalidRequest(RequestError):
    """Malformed or invalid input."""


class PayloadTooLarge(RequestError):
    """Over a size or count limit of the broker or the topic."""


class UnsupportedEncoding(RequestError):
    """The broker does not decode the body's Content-Encoding."""


class OffsetOutOfRange(RequestError):
    """The fetch offset is beyond the high watermark + 1 or below the log start;
    ``log_start_offset`` and ``high_watermark`` say where the log is."""

    log_start_offset: int | None = None
    high_watermark: int | None = None


class UnknownTopic(RequestError):
    """No such topic (and the broker does not create topics on use)."""


class UnknownPartition(RequestError):
    """The topic has no partition of that number."""


class TopicExists(RequestError):
    """A topic of that name exists already."""


class PartitionsOnlyGrow(RequestError):
    """The topic has more partitions than asked for: partitions only grow."""


class OffsetBeyondHighWatermark(RequestError):
    """An offset to commit or reset to is beyond the partition's high watermark."""


class UnknownGroup(RequestError):
    """No consumer group of that name."""


class GroupConflict(RequestError):
    """A consumer group refused: the caller's view of it is out of date."""


class UnknownMember(GroupConflict):
    """Not a member (it left, or its session expired): join again."""


class StaleGeneration(GroupConflict):
    """The group moved on to a newer generation: heartbeat for the assignment."""


class PartitionNotAssigned(GroupConflict):
    """The partition is not this member's in this generation."""


class GroupNotEmpty(GroupConflict):
    """The operation needs a group without live members."""


class GroupFull(GroupConflict):
    """The group has as many members as the broker allows."""


class NotFound(RequestError):
    """Unknown path: the URL does not point at a leaderless-log broker (or its API)."""


class MethodNotAllowed(RequestError):
    """Wrong method for the path."""


class HTTPError(RequestError):
    """Another refusal by the broker's HTTP layer."""


class AccessError(LlogError):
    """Refused by the broker's access control; nothing was written."""


class Unauthenticated(AccessError):
    """No bearer token, or one the broker does not accept (``token=`` or LLOG_TOKEN)."""


class Forbidden(AccessError):
    """The principal holds no right for a topic or group the request names."""


class QuotaExceeded(AccessError):
    """Over the principal's request or produce-bytes quota on that broker; retried
    after ``retry_after_s``."""

    retriable = True


class Unavailable(LlogError):
    """Refused before anything was written; the same request may be sent again."""

    retriable = True


class BackPressureRejected(Unavailable):
    """The broker's produce buffer is full."""


class ShuttingDown(Unavailable):
    """The broker is draining; another broker will take the request."""


class RoleDisabled(Unavailable):
    """That broker process does not serve the operation."""


class ForwardExpired(Unavailable):
    """Records forwarded between brokers were not taken by a flush in time; nothing was
    written."""


class StorageError(LlogError):
    """Oxia or S3 failed, or what they hold does not verify."""


class StorageUnavailable(StorageError):
    """Oxia or S3 failed or timed out; for a produce, nothing was committed."""

    retriable = True


class CorruptData(StorageError):
    """Stored bytes fail to decode or verify."""


class ObjectMissing(StorageError):
    """An object an index entry points at is gone."""


class LogGap(StorageError):
    """No index entry covers a committed offset."""


class AppendError(LlogError):
    """One partition's append was not acknowledged."""


class PartitionFenced(AppendError):
    """An operator disabled appends to the partition."""


class CommitConflict(AppendError):
    """Other writers kept winning the compare-and-set; nothing was committed."""

    retriable = True


class CommitExpired(AppendError):
    """The records waited past the commit horizon; nothing was committed."""

    retriable = True


class ProduceExpired(AppendError):
    """The records were not committed within the produce request's deadline (the
    client's timeout less a margin, or the broker's shorter setting); nothing was
    written, and no late attempt can write them."""

    retriable = True


class CommitInDoubt(AppendError):
    """The broker could not settle whether the records were committed."""

    retriable = True
    maybe_written = True


class OutOfOrderSequence(AppendError):
    """The producer's batch is not the next of its sequence for the partition: an
    earlier one is not committed yet (nothing written)."""

    retriable = True


class UnknownProducer(AppendError):
    """The partition no longer remembers the producer and the batch's sequence is not 0
    (nothing written): the producer starts a new sequence."""


class DuplicateSequence(AppendError):
    """The producer's batch was committed before, too long ago for its offsets to be
    answered."""

    maybe_written = True


class ClientError(LlogError):
    """No usable answer came from a broker."""


class TransportError(ClientError):
    """The connection was refused, cut or timed out. ``maybe_written`` is set when the
    request may have reached the broker before that."""

    retriable = True


class UnexpectedResponse(ClientError):
    """An answer outside the contract: another status, or a body that is not the
    documented JSON (a proxy's error page, say). Retriable when the status is 5xx."""


class ProducerClosed(ClientError):
    """The producer was closed: it takes no more records, and records it had not
    delivered when it stopped fail with this."""


class BufferFull(ClientError):
    """A producer's buffer stayed full for ``max_block_ms``: the brokers take records
    more slowly than they are sent (nothing of this record was sent)."""

    retriable = True


class DeliveryTimeout(ClientError):
    """A producer's batch was not acknowledged within ``delivery_timeout_ms``.
    ``maybe_written`` when an attempt may have reached a broker; the last attempt's
    error is the ``__cause__``."""


def _leaves(cls: type[LlogError]) -> dict[str, type[LlogError]]:
    out: dict[str, type[LlogError]] = {}
    for sub in cls.__subclasses__():
        out[sub.__name__] = sub
        out.update(_leaves(sub))
    return out


# The broker's error_type names, and the client's own, to their classes.
ERROR_CLASSES: dict[str, type[LlogError]] = _leaves(LlogError)


def error_class(error_type: str | None, status: int | None) -> type[LlogError]:
    """The class for a broker's ``error_type``; for a name not known here, the nearest
    class by status (a later broker may add names)."""
    known = ERROR_CLASSES.get(error_type or "")
    if known is not None and not issubclass(known, ClientError):
        return known
    if status == 503:
        return Unavailable
    if status in (401, 403):
        return AccessError
    if status is not None and 400 <= status < 500:
        return RequestError
    return LlogError
