"""The producers' options, checked and made plain ints, floats and a bool once, when a
producer is made: the compiled modules that use them (clients/python/setup.py) accept
exactly those types. Kept interpreted, so the class copies, pickles and subclasses as
any dataclass does."""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields

from llog_client._compression import Compression
from llog_client._retry_rules import SenderSettings

MiB = 1024 * 1024
# A partition remembers where a producer's last 5 batches went (docs/http-api.md,
# Idempotent producers): a resend of the oldest of that many in flight is still known.
MAX_IN_FLIGHT_PER_PARTITION = 5


@dataclass(frozen=True)
class ProducerSettings:
    """See :class:`~llog_client.Producer`. The defaults were chosen by measurement
    (docs/client.md, Producer): a batch of 1 MiB per partition and requests of 4 MiB
    keep the broker's per-request costs small at full speed, and 5 ms of linger (what
    Kafka's clients wait by default) costs a lone record little latency."""

    linger_ms: float = 5.0
    batch_bytes: int = 1 * MiB
    max_request_bytes: int = 4 * MiB
    max_request_records: int = 100_000
    max_request_entries: int = 1_000
    max_in_flight: int = 8
    buffer_bytes: int = 64 * MiB
    max_block_ms: float = 60_000.0
    delivery_timeout_ms: float = 120_000.0
    request_timeout_s: float = 30.0
    retry_backoff_ms: float = 100.0
    retry_backoff_max_ms: float = 1_000.0
    ordered: bool = True
    # Ordered: a partition's batches in flight at once, kept in order by its producer
    # sequence (at most what a partition remembers of a producer: 5).
    in_flight_per_partition: int = 5

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == "int":
                value = _whole(field.name, value)
            elif field.type == "float":
                value = _number(field.name, value)
            else:
                value = bool(value)
            object.__setattr__(self, field.name, value)
        for name in ("batch_bytes", "max_request_bytes", "max_request_records",
                     "max_request_entries", "max_in_flight", "buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 1 <= self.in_flight_per_partition <= MAX_IN_FLIGHT_PER_PARTITION:
            raise ValueError("in_flight_per_partition must be 1 to "
                             f"{MAX_IN_FLIGHT_PER_PARTITION}")
        if self.batch_bytes > self.max_request_bytes:
            raise ValueError("batch_bytes must be at most max_request_bytes")
        if self.linger_ms < 0 or self.max_block_ms < 0:
            raise ValueError("linger_ms and max_block_ms must not be negative")
        if not self.request_timeout_s > 0:
            raise ValueError("request_timeout_s must be positive")
        if self.delivery_timeout_ms < self.request_timeout_s * 1000:
            raise ValueError("delivery_timeout_ms must be at least the request timeout")

    def sender(self, compression: Compression | None) -> SenderSettings:
        return SenderSettings(
            max_in_flight=self.max_in_flight, max_request_bytes=self.max_request_bytes,
            max_request_records=self.max_request_records,
            max_request_entries=self.max_request_entries,
            delivery_timeout_s=self.delivery_timeout_ms / 1000,
            backoff_s=self.retry_backoff_ms / 1000,
            backoff_max_s=self.retry_backoff_max_ms / 1000, compression=compression)


def _whole(name: str, value: object) -> int:
    """An int option given as any integer (numpy's too) or a float with no fraction
    (``64e6``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} is a whole number, not {value!r}") from None


def _number(name: str, value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{name} is a number, not {value!r}") from None
