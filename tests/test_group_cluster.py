"""Consumer groups across broker processes: members that each talk to another broker
share the partitions of a topic; one member is killed (SIGKILL: it simply stops
heartbeating) while records keep coming. Every record is processed at least once, none
is skipped, and after a clean shutdown the committed offsets equal the high
watermarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from llog_client import GroupDescription, LlogClient, RetryPolicy, UnknownGroup
from tests.helpers.stack import BrokerFactory

pytestmark = pytest.mark.slow  # chaos: a member killed mid-stream

WORKER = Path(__file__).parent / "helpers" / "group_worker.py"
GROUP_SETTINGS = {"group_min_session_timeout_ms": "500", "group_session_timeout_ms": "2000"}
PARTITIONS, ROUNDS, PER_ROUND = 6, 10, 20
# Only the member that is killed has a short session (its expiry is waited for); the
# others' outlives any stall of a loaded machine, so none of them is expired by chance
# (and they heartbeat, at a third of it, often enough to see the rebalance promptly).
SHORT_SESSION_MS, LONG_SESSION_MS = 2000, 30_000


def _worker(urls: list[str], group: str, topic: str, out: Path, session_ms: int
            ) -> subprocess.Popen[str]:
    with open(out.with_suffix(".log"), "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(WORKER), "--brokers", ",".join(urls), "--group", group,
             "--topic", topic, "--out", str(out), "--session-ms", str(session_ms)],
            stdout=log, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))


def _until(what: str, check: Callable[[], bool], timeout_s: float = 90) -> None:
    """Wait for other processes to get somewhere (polled: they tell us nothing)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.2)


def _processed(out: Path) -> set[tuple[int, int]]:
    if not out.exists():
        return set()
    lines = out.read_text().splitlines()
    return {(int(p), int(o)) for p, o, _ in (line.split(" ", 2) for line in lines)}


def _members(llog: LlogClient, group: str) -> int:
    try:
        return len(llog.describe_group(group).members)
    except UnknownGroup:  # until the first member's join
        return 0


def _settled(d: GroupDescription, members: int) -> bool:
    return len(d.members) == members and len(d.partitions) == PARTITIONS and all(
        p.committed_offset == p.high_watermark for p in d.partitions)


def test_every_record_is_processed_when_a_member_is_killed_mid_stream(
        brokers: BrokerFactory, topic: str, tmp_path: Path) -> None:
    urls = [brokers.start(**GROUP_SETTINGS).url for _ in range(3)]
    group = f"g-{uuid.uuid4().hex[:12]}"
    outs = [tmp_path / f"member-{i}.txt" for i in range(3)]
    retry = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5)
    with LlogClient(urls, retry=retry) as llog:
        llog.create_topic(topic, PARTITIONS)
        # Each member joins, heartbeats and commits through a broker of its own.
        workers = [_worker(urls[i:] + urls[:i], group, topic, out,
                           SHORT_SESSION_MS if i == 0 else LONG_SESSION_MS)
                   for i, out in enumerate(outs)]
        try:
            _until("three members joined", lambda: _members(llog, group) == 3)
            for n in range(ROUNDS):
                for p in range(PARTITIONS):
                    llog.produce(topic, [f"{n}-{p}-{i}" for i in range(PER_ROUND)], partition=p)
                if n == 3:
                    _until("the first member processed records", lambda: bool(
                        _processed(outs[0])))
                    generation = llog.describe_group(group).generation
                    workers[0].send_signal(signal.SIGKILL)
            _until("the others own everything and committed it all",
                   lambda: _settled(llog.describe_group(group), 2))
            assert llog.describe_group(group).generation > generation
            for worker in workers[1:]:
                worker.send_signal(signal.SIGTERM)
            for worker in workers[1:]:
                assert worker.wait(timeout=60) == 0
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        final = llog.describe_group(group)
    assert final.members == ()
    assert {(p.partition, p.committed_offset, p.high_watermark) for p in final.partitions} == {
        (p, ROUNDS * PER_ROUND, ROUNDS * PER_ROUND) for p in range(PARTITIONS)}
    every = {(p, o) for p in range(PARTITIONS) for o in range(1, ROUNDS * PER_ROUND + 1)}
    assert set().union(*map(_processed, outs)) == every
    assert _processed(outs[0]) and _processed(outs[0]) != every  # killed mid-stream
