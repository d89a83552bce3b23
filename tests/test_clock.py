"""The process's wall clock (app/clock.py): the system's, or set off it for tests by
LLOG_TEST_CLOCK_OFFSET_MS, and what reads it follows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each read of the offset clock, less the offset, falls between two reads of the system's.
PROBE = """
import time
from app import clock
from app.storage.metadata import now_ms
before = time.time_ns() // 1_000_000
wall, records = clock.wall_ms(), now_ms()
after = time.time_ns() // 1_000_000
off = clock.offset_ms()
print(off, int(before <= wall - off <= after), int(before <= records - off <= after))
"""


def _probe(offset: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLOG_TEST_CLOCK_OFFSET_MS"}
    if offset is not None:
        env["LLOG_TEST_CLOCK_OFFSET_MS"] = offset
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_clock_is_the_systems_unless_set_off_it() -> None:
    for offset, expected in ((None, 0), ("-4000", -4000), ("90000", 90_000)):
        done = _probe(offset)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(expected), "1", "1"]


def test_an_offset_that_is_not_a_number_or_beyond_s3s_skew_is_refused() -> None:
    done = _probe("5s")
    assert done.returncode != 0
    assert "LLOG_TEST_CLOCK_OFFSET_MS='5s': expected an integer" in done.stderr
    done = _probe("-900001")
    assert done.returncode != 0
    assert "at most 900000 either way" in done.stderr
