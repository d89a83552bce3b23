"""The wall clock of this process: what every decision that reads the time of day takes
(a blob's age against the retry horizon, leases and sessions written to Oxia, the fences
and deadlines one broker stamps and another judges, token expiry).

Monotonic clocks (timeouts, waits) are not here: they never cross a process.

``LLOG_TEST_CLOCK_OFFSET_MS`` shifts this clock by a fixed amount, read once when the
process starts. It is for tests only: the history checker starts brokers whose clocks
disagree, as a fleet's do when time synchronisation fails, and checks that no record is
lost or written twice for it (docs/testing.md). Production leaves it unset. S3 request
signatures and JWT validation (pyjwt) keep the system's clock.
"""

from __future__ import annotations

import os
import time

OFFSET_ENV = "LLOG_TEST_CLOCK_OFFSET_MS"


# The largest offset taken: S3 refuses requests signed 15 minutes off its clock, so no
# broker of a working cluster is further off than that (fences rely on it), and a test
# must not make one that is (requests are still signed with the system's clock).
MAX_OFFSET_MS = 15 * 60 * 1000


def _offset_ms() -> int:
    raw = os.environ.get(OFFSET_ENV, "").strip()
    if not raw:
        return 0
    try:
        offset = int(raw)
    except ValueError:
        raise ValueError(f"{OFFSET_ENV}={raw!r}: expected an integer of milliseconds") from None
    if abs(offset) > MAX_OFFSET_MS:
        raise ValueError(f"{OFFSET_ENV}={raw!r}: at most {MAX_OFFSET_MS} either way")
    return offset


_OFFSET_NS = _offset_ms() * 1_000_000


def offset_ms() -> int:
    """How far this process's wall clock is set from the system's (0 but in tests)."""
    return _OFFSET_NS // 1_000_000


def wall_ns() -> int:
    return time.time_ns() + _OFFSET_NS


def wall_ms() -> int:
    return wall_ns() // 1_000_000


def wall_s() -> float:
    return wall_ns() / 1e9
