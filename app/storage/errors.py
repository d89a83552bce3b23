"""The log engine's error hierarchy.

Every failure the engine reports is a :class:`LogError`. The HTTP layer maps these to
status codes and ``error_type`` strings (the class name) at the edge; nothing below it
knows about HTTP.

- :class:`InvalidInput`: a topic, partition or record the caller must fix.
- :class:`CorruptData`: stored bytes that fail to decode or verify.
- :class:`StorageUnavailable`: Oxia or S3 did not answer in time or failed.
- :class:`PartitionFenced`: the partition refuses appends.
- :class:`CommitConflict`: CAS retries exhausted under contention.
- :class:`OffsetOutOfRange`: a fetch beyond the high watermark + 1.
- :class:`LogGap`: no index entry covers a committed offset.
- :class:`ObjectMissing`: an object an index entry points at is gone.
"""

from __future__ import annotations


class LogError(Exception):
    """Base class of every error the log engine raises."""

    @property
    def error_type(self) -> str:
        return type(self).__name__


class InvalidInput(LogError, ValueError):
    """The caller passed something the protocol does not allow."""


class CorruptData(LogError):
    """Stored bytes are truncated, oversized, inconsistent or fail their checksum."""


class StorageUnavailable(LogError):
    """Oxia or S3 failed or timed out; the operation may be retried."""


class PartitionFenced(LogError):
    """The partition's ``log_state`` is FENCED: appends are refused, reads continue."""


class CommitConflict(LogError):
    """Compare-and-set retries were exhausted because other writers kept winning."""


class OffsetOutOfRange(LogError):
    """The requested offset lies beyond the high watermark + 1."""


class LogGap(LogError):
    """An offset at or below the high watermark has no index entry: corruption or trim."""


class ObjectMissing(LogError):
    """An object that an index or pending entry references does not exist."""
