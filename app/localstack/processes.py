"""Child processes that die with us: own process group, log file, SIGTERM then SIGKILL."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Linux only: the kernel sends SIGTERM to the child when the parent exits, so even a
    # SIGKILLed `llog dev` or test run leaves no stray servers behind.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@functools.cache
def _setpriv() -> str | None:
    """util-linux's ``setpriv`` when it can set the parent-death signal (2.33+)."""
    found = shutil.which("setpriv")
    if found is None:
        return None
    try:
        usage = subprocess.run([found, "--help"], capture_output=True, text=True,
                               timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return found if "--pdeathsig" in usage else None


def _launch(argv: Sequence[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The command line to start and the ``preexec_fn`` to start it with.

    Running Python between ``fork`` and ``exec`` (a ``preexec_fn``) makes the child of a
    multi-threaded parent run the fork handlers of every library loaded: gRPC's aborted
    there ("Check failed: wakeup_fd_->Wakeup()") and the server never started. So the
    parent-death signal is set by ``setpriv``, which then execs the server (same pid), and
    the child is spawned without any Python in it; ``preexec_fn`` only where there is no
    ``setpriv``."""
    setpriv = _setpriv()
    if setpriv is not None:
        return [setpriv, "--pdeathsig", "TERM", "--", *argv], None
    return list(argv), _die_with_parent


class ProcessFailed(RuntimeError):
    """A managed process exited or never became healthy; carries the tail of its log."""


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv, preexec_fn = _launch(self.argv)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=preexec_fn,
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if not self.alive():
            code = self._proc.returncode if self._proc is not None else None
            raise ProcessFailed(
                f"{self.name} exited (code {code}); last lines of {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    def signal(self, sig: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def wait(self, timeout: float) -> int:
        """The exit code, once the process has exited (``TimeoutExpired`` if not)."""
        if self._proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL the whole process group and reap it (crash simulation)."""
        self.signal(signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        if self._proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def stop_together(processes: Iterable[ManagedProcess], timeout: float = 15.0) -> None:
    """SIGTERM to each of ``processes`` at once, then wait for all of them within one
    ``timeout``; any still running then is killed."""
    running = [p for p in processes if p.alive()]
    for proc in running:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


# LLOG_PORT_RANGE=LOW-HIGH: the range this process (and its children) choose free ports
# from, instead of the kernel's ephemeral range. The test runner gives each of its parallel
# processes a range of its own below the ephemeral one, so two processes can never choose
# the same port in the moment between a probe and the server's bind, and no outgoing
# connection's port is ever chosen.
PORT_RANGE_ENV = "LLOG_PORT_RANGE"
_port_cursor: dict[tuple[int, int], int] = {}
_port_lock = threading.Lock()


def port_range() -> tuple[int, int] | None:
    """The configured ``(low, high)`` of :data:`PORT_RANGE_ENV`, both included, or None."""
    raw = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not raw:
        return None
    low, sep, high = raw.partition("-")
    if not (sep and low.strip().isdigit() and high.strip().isdigit()):
        raise ValueError(f"{PORT_RANGE_ENV}={raw!r}: expected LOW-HIGH, e.g. 20000-25999")
    lo, hi = int(low), int(high)
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={raw!r}: expected 1024 <= LOW <= HIGH <= 65535")
    return lo, hi


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _free_port_in(bounds: tuple[int, int], host: str, avoid: Collection[int]) -> int:
    # Round the range from where the last choice stopped (a random start per process):
    # a port handed out is not handed out again until the range has gone round.
    lo, hi = bounds
    size = hi - lo + 1
    with _port_lock:
        start = _port_cursor.get(bounds)
        if start is None:
            start = random.randrange(size)
        for step in range(size):
            port = lo + (start + step) % size
            if port not in avoid and _bindable(host, port):
                _port_cursor[bounds] = (start + step + 1) % size
                return port
    raise RuntimeError(f"no free port on {host} in {PORT_RANGE_ENV} {lo}-{hi} outside the "
                       f"{len(avoid)} taken")


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port free now and not in ``avoid``: ports chosen earlier are free again once
    their probe closed, and the OS may hand the same one out twice. Within
    :data:`PORT_RANGE_ENV` when it is set."""
    bounds = port_range()
    if bounds is not None:
        return _free_port_in(bounds, host, avoid)
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port
    raise RuntimeError(f"no free port on {host} outside the {len(avoid)} taken")


def free_ports(count: int, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> list[int]:
    """``count`` ports free now, all different: the ports of one stack are chosen before
    any of its processes binds, and one chosen twice stops a process at its start."""
    taken = set(avoid)
    ports = []
    for _ in range(count):
        port = free_port(host, avoid=taken)
        taken.add(port)
        ports.append(port)
    return ports


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    what: str,
    probe: object,
    *,
    timeout: float,
    process: ManagedProcess | None = None,
    interval: float = 0.1,
) -> None:
    """Poll ``probe()`` until it returns true; fail fast if ``process`` died."""
    assert callable(probe)
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None:
            process.check_alive()
        try:
            if probe():
                return
        except Exception as exc:  # a probe failing is the normal "not yet"
            last_error = exc
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    tail = f"\nlast lines of {process.log_path}:\n{process.log_tail()}" if process else ""
    raise ProcessFailed(f"{what} not healthy after {timeout:.0f}s{detail}{tail}")
