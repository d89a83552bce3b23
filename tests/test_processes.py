"""Managed child processes die with the process that started them, whichever way they
were launched."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.localstack import processes
from tests.helpers.selection import worker_port_range

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from app.localstack import processes
    if sys.argv[2] == "preexec":
        processes._setpriv = lambda: None  # the fallback: prctl in a preexec_fn
    child = processes.ManagedProcess("sleeper", ["sleep", "600"], Path(sys.argv[1]))
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)
""")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: it only waits for its (new) parent to reap it.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.parametrize("launch", ["setpriv", "preexec"])
def test_a_child_dies_when_its_parent_is_killed(tmp_path: Path, launch: str) -> None:
    if launch == "setpriv":
        assert processes._setpriv() is not None, "util-linux setpriv 2.33+ is expected here"
    with subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "log"), launch],
                          stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).resolve().parents[1]) as parent:
        _kill_parent_then_wait_for_the_child(parent)


def _wait_until_it_runs(command: str, pid: int) -> None:
    """The death signal is armed by the launcher just before it execs the command; a
    parent killed before that leaves an orphan by design of prctl, so the test waits
    for the exec (on a loaded machine it can take a while)."""
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}/comm").read_text().strip() != command:
        assert not _gone(pid), f"child {pid} died before it ran {command}"
        assert time.monotonic() < deadline, f"child {pid} never ran {command}"
        time.sleep(0.01)


def _kill_parent_then_wait_for_the_child(parent: subprocess.Popen[str]) -> None:
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        _wait_until_it_runs("sleep", child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 60  # an outer bound only: the kernel signals at once
        while not _gone(child):
            assert time.monotonic() < deadline, f"child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait(timeout=30)


def test_free_port_avoids_the_ports_already_taken() -> None:
    """A probe's port is free again once it closes: the OS may hand it out twice, and
    two listeners of one Oxia server on one port fail to start."""
    first = processes.free_port()
    taken = {first}
    for _ in range(50):
        port = processes.free_port(avoid=taken)
        assert port not in taken
        taken.add(port)


def test_free_ports_are_all_different_and_avoid_the_ports_given() -> None:
    """The ports of one stack are chosen together, before any process binds one."""
    avoid = set(processes.free_ports(20))
    ports = processes.free_ports(200, avoid=avoid)
    assert len(set(ports)) == 200 and not avoid & set(ports)


def test_a_port_range_confines_the_choice_and_passes_over_ports_in_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With LLOG_PORT_RANGE each port comes from the range, a port something listens on
    is passed over, and a range with nothing free left says so."""
    busy = _middle_of_five_free_ports()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", busy))
        listener.listen()
        monkeypatch.setenv(processes.PORT_RANGE_ENV, f"{busy - 2}-{busy + 2}")
        chosen = processes.free_ports(4)
        assert sorted(chosen) == [busy - 2, busy - 1, busy + 1, busy + 2]
        with pytest.raises(RuntimeError, match="no free port .* LLOG_PORT_RANGE"):
            processes.free_port(avoid=chosen)


def _middle_of_five_free_ports() -> int:
    """The middle of five consecutive ports nothing uses, from this process's own range
    (below the kernel's ephemeral ports, where no other process's connection lands), or
    from ports below every test process's range."""
    lo, hi = processes.port_range() or (10_000, 11_999)
    for middle in range(lo + 2, hi - 1, 5):
        if all(processes._bindable("127.0.0.1", p) for p in range(middle - 2, middle + 3)):
            return middle
    raise AssertionError(f"no five consecutive free ports in {lo}-{hi}")


@pytest.mark.parametrize("raw", ["20000", "b-c", "30000-20000", "80-90", "20000-70000"])
def test_a_malformed_port_range_is_refused_by_name(raw: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(processes.PORT_RANGE_ENV, raw)
    with pytest.raises(ValueError, match="LLOG_PORT_RANGE"):
        processes.free_port()


def test_parallel_test_processes_get_disjoint_ranges_below_the_ephemeral_ports() -> None:
    for count in (1, 2, 3, 8):
        ranges = [tuple(map(int, worker_port_range(f"gw{i}", count).split("-")))
                  for i in range(count)]
        assert all(lo <= hi < 32768 for lo, hi in ranges)
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    with pytest.raises(ValueError):
        worker_port_range("gw2", 2)
