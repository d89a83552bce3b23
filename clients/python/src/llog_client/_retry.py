"""How the client retries, and how large the produce requests it builds may grow."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter.

    ``max_attempts`` counts every send of a request, the first included. The pause
    before retry ``n`` (0-based) is ``initial_backoff_s * multiplier**n``, capped at
    ``max_backoff_s``, times a random factor in [0.5, 1) so clients that failed together
    do not retry together; it is never shorter than the broker's ``Retry-After`` (which
    is honoured up to ``max_retry_after_s``, so a misconfigured proxy cannot park the
    client for an hour).
    """

    max_attempts: int = 8
    initial_backoff_s: float = 0.1
    multiplier: float = 2.0
    max_backoff_s: float = 5.0
    max_retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay_s(self, retry: int, retry_after_s: float | None = None) -> float:
        backoff = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** retry)
        backoff *= 0.5 + random.random() / 2
        if retry_after_s is not None:
            backoff = max(backoff, min(retry_after_s, self.max_retry_after_s))
        return backoff


NO_RETRIES = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class ProduceLimits:
    """How the client cuts records into requests. Keep these at or below the broker's
    ``LLOG_MAX_REQUEST_BYTES``, ``LLOG_MAX_RECORDS_PER_REQUEST`` and
    ``LLOG_MAX_PARTITIONS_PER_REQUEST`` (defaults 16 MiB, 100000 and 1000): a request
    over them is refused whole with ``PayloadTooLarge``. ``max_request_bytes`` counts
    the JSON body; one record larger than that is still sent, alone."""

    max_request_bytes: int = 4 * 1024 * 1024
    max_records_per_request: int = 10_000
    max_entries_per_request: int = 100

    def __post_init__(self) -> None:
        if min(self.max_request_bytes, self.max_records_per_request,
               self.max_entries_per_request) < 1:
            raise ValueError("produce limits must be positive")
