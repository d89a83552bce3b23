"""Every error leaderless-log reports, as one documented tree.

Each class carries what a caller needs to act on it, so nothing above the engine has to
compare strings:

- ``error_type``: a stable name (the class name), listed in docs/http-api.md and in the
  OpenAPI document; clients may switch on it.
- ``retriable``: sending the same request again may succeed.
- ``maybe_written``: reported for a produce entry, the records may have been committed
  although the broker could not confirm it (retry with an idempotency key).
- ``http_status``: the status of a response whose *whole* request failed with this
  error. Per-entry errors travel inside a 200/409 body instead.

::

    LlogError
    ├── RequestError                 the request must change (4xx)
    │   ├── InvalidRequest           400  malformed or invalid input, nothing written
    │   ├── PayloadTooLarge          413  over a size or count limit, nothing written
    │   ├── UnsupportedEncoding      415  a Content-Encoding the broker does not decode
    │   ├── OffsetOutOfRange         400  fetch offset outside the log start .. hw + 1
    │   ├── UnknownTopic             404  no such topic (and auto-create is off)
    │   ├── UnknownPartition         404  the topic has no such partition
    │   ├── TopicExists              409  a topic of that name exists already
    │   ├── PartitionsOnlyGrow       409  fewer partitions than the topic has
    │   ├── OffsetBeyondHighWatermark 409 a committed offset the log does not hold yet
    │   ├── UnknownGroup             404  no such consumer group
    │   └── GroupConflict            409  the group refuses: the caller's view is out of date
    │       ├── UnknownMember             not a member (left, or its session expired)
    │       ├── StaleGeneration           the group has moved on to a newer generation
    │       ├── PartitionNotAssigned      the partition is not this member's
    │       ├── GroupNotEmpty             the operation needs a group without live members
    │       └── GroupFull                 the group is as large as it may be
    ├── AccessError                  refused by access control at the edge, nothing written
    │   ├── Unauthenticated          401  no credentials, or invalid ones
    │   ├── Forbidden                403  the principal lacks the right
    │   └── QuotaExceeded            429  over the principal's quota; retry after a pause
    ├── Unavailable                  503  refused before anything was written; retry
    │   ├── BackPressureRejected          the produce buffer is full
    │   ├── ShuttingDown                  this broker is draining; retry on another
    │   ├── RoleDisabled                  this process does not serve the operation
    │   └── ForwardExpired                forwarded records not taken by a flush in time
    ├── StorageError                 Oxia or S3 failed, or what they hold is wrong
    │   ├── StorageUnavailable       503  a request failed or timed out; retriable
    │   ├── CorruptData              500  stored bytes fail to decode or verify
    │   ├── ObjectMissing            500  an object an entry points at is gone
    │   └── LogGap                   500  no entry covers a committed offset
    └── AppendError                  one partition's append was not acknowledged
        ├── PartitionFenced          409  the partition refuses appends
        ├── CommitConflict           409  compare-and-set attempts exhausted; retriable
        ├── CommitExpired            409  the upload grew older than the retry horizon
        ├── ProduceExpired           409  not committed by the produce request's deadline
        └── CommitInDoubt            409  the outcome is unknown; maybe written

:class:`VersionMismatch` is not part of the tree: it is the engine's internal signal for
a failed compare-and-set and never leaves it.
"""

from __future__ import annotations

from typing import ClassVar


class LlogError(Exception):
    """Base class of every error leaderless-log reports."""

    retriable: ClassVar[bool] = False
    maybe_written: ClassVar[bool] = False
    http_status: ClassVar[int] = 500

    @property
    def error_type(self) -> str:
        return type(self).__name__


# -- the request ---------------------------------------------------------------------


class RequestError(LlogError):
    """The caller must change the request; nothing was written."""

    http_status = 400


class InvalidRequest(RequestError, ValueError):
    """A topic, partition, record or field the protocol does not allow."""


class PayloadTooLarge(RequestError):
    """The request exceeds a configured size or count limit."""

    http_status = 413

    @classmethod
    def unless_within(cls, count: int, limit: int, what: str = "partitions") -> None:
        """The check of ``LLOG_MAX_PARTITIONS_PER_REQUEST``, one definition for every
        way in (produce, consume, offsets, group commits and resets), each of which
        makes it once: raises when a request names more ``what`` than ``limit``."""
        if count > limit:
            raise cls(f"{count} {what} in one request; the limit is {limit}")


class UnsupportedEncoding(RequestError):
    """The body's Content-Encoding is not one the broker decodes (identity, gzip, zstd)."""

    http_status = 415


class OffsetOutOfRange(RequestError):
    """The requested offset lies beyond the high watermark + 1, or below the log start
    (retention removed what precedes it); says where the log starts and ends."""

    def __init__(self, message: str, *, log_start: int | None = None,
                 high_watermark: int | None = None) -> None:
        super().__init__(message)
        self.log_start = log_start
        self.high_watermark = high_watermark


class UnknownTopic(RequestError):
    """No topic of that name exists (and this broker does not create topics on use)."""

    http_status = 404


class UnknownPartition(RequestError):
    """The topic exists but has no partition of that number."""

    http_status = 404


class TopicExists(RequestError):
    """A topic of that name exists already."""

    http_status = 409


class PartitionsOnlyGrow(RequestError):
    """The topic has more partitions than the request asks for: a topic's partitions
    only grow. (A conflict with the topic as it stands, not a malformed request.)"""

    http_status = 409


class OffsetBeyondHighWatermark(RequestError):
    """An offset to commit (or to reset a group to) lies beyond the partition's high
    watermark: commit the last offset processed, which the log holds. (A conflict
    with the log as it stands, not a malformed request.)"""

    http_status = 409


class UnknownGroup(RequestError):
    """No consumer group of that name exists."""

    http_status = 404


class GroupConflict(RequestError):
    """A consumer group refuses the request as it stands; nothing was written."""

    http_status = 409


class UnknownMember(GroupConflict):
    """The member id is not in the group (it left, or its session expired and its
    partitions moved), or its session expired though the group still lists it: join
    again for a new member id."""


class StaleGeneration(GroupConflict):
    """The request names a generation the group has left behind (or an offset was
    committed by a newer one): heartbeat to learn the current assignment."""


class PartitionNotAssigned(GroupConflict):
    """The partition is not assigned to this member in this generation."""


class GroupNotEmpty(GroupConflict):
    """The operation (resetting offsets, committing without a member id) needs a group
    without live members."""


class GroupFull(GroupConflict):
    """The group has ``LLOG_GROUP_MAX_MEMBERS`` members already, or its topics with the
    joining member's would be more than ``LLOG_GROUP_MAX_PARTITIONS`` partitions."""


# -- access control ------------------------------------------------------------------


class AccessError(LlogError):
    """Refused by access control before any storage work; nothing was written."""

    http_status = 403


class Unauthenticated(AccessError):
    """No bearer token, or one that does not verify. ``code`` is RFC 6750's ``error``
    (``invalid_token``, ``invalid_request``), or None when no credentials were sent."""

    http_status = 401

    def __init__(self, message: str, *, code: str | None = "invalid_token") -> None:
        super().__init__(message)
        self.code = code


class Forbidden(AccessError):
    """The principal is authenticated but holds no right for the operation."""


class QuotaExceeded(AccessError):
    """The principal is over its request-rate or produce-bytes quota on this broker
    process: retry after ``retry_after_s``."""

    retriable = True
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# -- refused before writing ----------------------------------------------------------


class Unavailable(LlogError):
    """Refused before anything was written; the same request may be sent again."""

    retriable = True
    http_status = 503


class BackPressureRejected(Unavailable):
    """The produce buffer is full: retry after a short pause."""


class ShuttingDown(Unavailable):
    """The broker is draining: retry on another broker."""


class RoleDisabled(Unavailable):
    """This broker process does not have the role the request needs."""


class ForwardExpired(Unavailable):
    """Records another broker forwarded here waited past their deadline before a flush
    took them: they were in no flush, so nothing was written (the forwarding broker
    appends them itself)."""


# -- storage ---------------------------------------------------------------------------


class StorageError(LlogError):
    """Oxia or S3 failed, or what they hold does not verify."""


class StorageUnavailable(StorageError):
    """Oxia or S3 failed or timed out; the operation may be retried.

    Reported for a produce entry it means the records were not committed (an outcome
    that cannot be settled is :class:`CommitInDoubt` instead).
    """

    retriable = True
    http_status = 503


class CorruptData(StorageError):
    """Stored bytes are truncated, oversized, inconsistent or fail their checksum."""


class ObjectMissing(StorageError):
    """An object that an index or pending entry references does not exist."""


class LogGap(StorageError):
    """An offset at or below the high watermark has no index entry: corruption or trim."""


# -- appends ---------------------------------------------------------------------------


class AppendError(LlogError):
    """One partition's append was not acknowledged."""

    http_status = 409


class PartitionFenced(AppendError):
    """The partition's ``log_state`` is FENCED: appends are refused, reads continue."""


class CommitConflict(AppendError):
    """Compare-and-set attempts were exhausted because other writers kept winning."""

    retriable = True


class CommitExpired(AppendError):
    """The uploaded blob became older than the safe share of the retry horizon before
    its commit: committing it now could race garbage collection, so it was not."""

    retriable = True


class ProduceExpired(AppendError):
    """The records were not committed within their produce request's commit deadline
    (``LLOG_PRODUCE_COMMIT_DEADLINE_MS``, or the shorter ``Llog-Commit-Deadline-Ms`` the
    client sent): nothing was written, and no late attempt can write them.

    Past that deadline no commit of theirs expects a control version read later, so a
    client that sends them again only after the deadline cannot meet a late first copy
    (docs/protocol.md, The produce commit deadline)."""

    retriable = True


class CommitInDoubt(AppendError):
    """The commit's outcome could not be settled: the records may have been written.

    A retry with the same idempotency key is answered without writing twice.
    """

    retriable = True
    maybe_written = True


class OutOfOrderSequence(AppendError):
    """The producer's group is not the next of its sequence for the partition: an
    earlier one is not committed yet (nothing was written; send the earlier groups
    first, then this one again)."""

    retriable = True


class UnknownProducer(AppendError):
    """The partition does not remember the producer, and the group's sequence is not 0:
    the producer was forgotten (many other producers appended since its last group), so
    a repeat cannot be told from a new group. Nothing was written; the producer starts
    a new sequence under a new producer id."""


class DuplicateSequence(AppendError):
    """The producer's group was committed before, longer ago than the partition
    remembers where: not written again, and its offsets cannot be answered."""

    maybe_written = True


# -- internal signals --------------------------------------------------------------------


class VersionMismatch(Exception):
    """A conditional put or delete found another version (internal to the engine)."""


# Classes that only group others: never raised, never named in a response.
_GROUPS: tuple[type[LlogError], ...] = (
    RequestError, GroupConflict, AccessError, StorageError, AppendError)


def error_types() -> list[type[LlogError]]:
    """Every class a response may name as its ``error_type``, in tree order (the
    documentation and the OpenAPI enum): all but the groups, so ``Unavailable``, which is
    raised itself as well as through its subclasses, is one of them. Private subclasses
    (``_Name``) are a module's own carriers, answered as their public base: no name."""
    out: list[type[LlogError]] = []

    def walk(cls: type[LlogError]) -> None:
        for sub in cls.__subclasses__():
            if not sub.__name__.startswith("_"):
                out.append(sub)
                walk(sub)

    walk(LlogError)
    return [c for c in out if c not in _GROUPS]
