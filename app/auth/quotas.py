"""Per-principal quotas: token buckets for requests and produced bytes, per process.

Each bucket holds up to ``rate * burst_s`` tokens and refills at ``rate`` per second. A
request takes its cost when the bucket holds at least that much, or, for a cost larger
than the whole bucket, when the bucket is full; the bucket may then go into debt, which
the refill pays off before the next grant. So any single request can pass, and over time
no principal gets more than its rate, whatever the size of its requests.

The buckets live in one broker process: N brokers (or workers) admit up to N times the
configured rate in total.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import LRUCache

from app.errors import QuotaExceeded


@dataclass(frozen=True)
class Quota:
    """None: unlimited."""

    requests_per_s: float | None = None
    produce_bytes_per_s: float | None = None
    burst_s: float = 1.0


class TokenBucket:
    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.level = capacity
        self._at = now

    def level_at(self, now: float) -> float:
        """The tokens held at ``now`` (refilled since the last look, up to the capacity;
        negative while in debt)."""
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now
        return self.level

    def charge(self, cost: float, now: float) -> None:
        """Take ``cost`` unconditionally, going into debt if need be (work paid for
        after it is done)."""
        self.level = self.level_at(now) - cost

    def take(self, cost: float, now: float) -> float:
        """0.0 if ``cost`` was granted (and taken), else the seconds until it would be."""
        self.level_at(now)
        need = min(cost, self.capacity)
        if self.level >= need:
            self.level -= cost
            return 0.0
        return (need - self.level) / self.rate


class _Buckets:
    def __init__(self, quota: Quota, now: float) -> None:
        self.quota = quota
        self.requests = self._bucket(quota.requests_per_s, 1.0, now)
        self.bytes = self._bucket(quota.produce_bytes_per_s, 0.0, now)

    def _bucket(self, rate: float | None, at_least: float, now: float) -> TokenBucket | None:
        if rate is None:
            return None
        return TokenBucket(rate, max(at_least, rate * self.quota.burst_s), now)


def _refuse(what: str, principal: str, wait_s: float) -> QuotaExceeded:
    retry_after = max(1, math.ceil(wait_s))
    return QuotaExceeded(f"{principal} is over its {what} quota on this broker; retry in "
                         f"{retry_after} s", retry_after_s=retry_after)


class QuotaBook:
    """The buckets of the principals seen lately (at most ``max_principals``: the least
    recently seen is forgotten, and starts full when it comes back)."""

    def __init__(self, max_principals: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._buckets: LRUCache[str, _Buckets] = LRUCache(maxsize=max_principals)
        self._clock = clock

    def _of(self, principal: str, quota: Quota, now: float) -> _Buckets:
        buckets = self._buckets.get(principal)
        if buckets is None or buckets.quota != quota:  # new, or its quota was changed
            buckets = self._buckets[principal] = _Buckets(quota, now)
        return buckets

    def charge_request(self, principal: str, quota: Quota | None) -> None:
        """Take one request from the principal's bucket, or raise QuotaExceeded."""
        if quota is None or quota.requests_per_s is None:
            return
        now = self._clock()
        bucket = self._of(principal, quota, now).requests
        assert bucket is not None
        wait = bucket.take(1.0, now)
        if wait:
            raise _refuse("request-rate", principal, wait)

    def charge_bytes(self, principal: str, quota: Quota | None, size: int) -> None:
        """Take ``size`` produced bytes from the principal's bucket, or raise."""
        if quota is None or quota.produce_bytes_per_s is None:
            return
        now = self._clock()
        bucket = self._of(principal, quota, now).bytes
        assert bucket is not None
        wait = bucket.take(float(size), now)
        if wait:
            raise _refuse("produce-bytes", principal, wait)
