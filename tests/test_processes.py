"""Managed child processes die with the process that started them, whichever way they
were launched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from app.localstack import processes

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
