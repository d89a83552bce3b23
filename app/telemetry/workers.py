"""``llog serve --workers N``: the workers' shared metrics directory, and a supervisor
that keeps what it holds right.

Before the workers start, the server creates a fresh directory of its own and names it
in ``PROMETHEUS_MULTIPROC_DIR``; every worker's prometheus_client then writes its values
there, and a scrape answered by any worker reads them all
(:class:`app.telemetry.registry.ServiceRegistry`). The directory lives below
``LLOG_METRICS_DIR`` (default: the system's temporary directory) and is removed when the
server stops; directories that servers of this host left behind when they were killed
are removed at the next start.

uvicorn's supervisor replaces a worker that dies (and retires workers on SIGHUP and
SIGTTOU). Each one that is gone is marked dead in the directory: its live gauges (its
buffer, its long-polls) stop counting, while its counters and histograms stay, so the
server's totals never go backwards. Each retired worker leaves its counter and
histogram files behind (a few KiB of data each) until the server stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path

import uvicorn
from prometheus_client.multiprocess import mark_process_dead
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess

from app.telemetry.registry import MULTIPROC_ENV

DIR_PREFIX = "llog-metrics-"


def serve(config: uvicorn.Config, metrics_parent: Path | None) -> int:
    """Run ``config`` as ``uvicorn.run`` would; with several workers, they share a
    fresh metrics directory. Returns the exit code."""
    os.environ.pop(MULTIPROC_ENV, None)  # one process exposes its own registry
    if config.workers > 1:
        serve_workers(config, metrics_parent)
        return 0
    server = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0 if server.started else STARTUP_FAILURE


def serve_workers(config: uvicorn.Config, metrics_parent: Path | None) -> None:
    """Run ``config`` (``workers`` > 1) as uvicorn.run would, with a shared metrics
    directory for this server alone."""
    shared = create_shared_dir(metrics_parent)
    os.environ[MULTIPROC_ENV] = str(shared)  # inherited by the workers it spawns
    try:
        sock = config.bind_socket()
        _Supervisor(config, [sock], shared).run()
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(shared, ignore_errors=True)


def create_shared_dir(parent: Path | None) -> Path:
    """A fresh, empty directory for one server's metrics."""
    base = parent if parent is not None else Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    host = _host_tag()
    _remove_left_behind(base, host)
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{host}-{os.getpid()}-", dir=base))


def _host_tag() -> str:
    """The host name, made safe for a file name (a directory mounted on several hosts
    is never cleaned of another host's servers)."""
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:64] or "host"


def _remove_left_behind(base: Path, host: str) -> None:
    """Directories of this host's servers that are no longer running."""
    for path in base.glob(f"{DIR_PREFIX}{host}-*"):
        pid = path.name.removeprefix(f"{DIR_PREFIX}{host}-").split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge
    return True


class _Supervisor(Multiprocess):
    """uvicorn's supervisor; every worker that is gone is marked dead in ``shared``."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], shared: Path
                 ) -> None:
        super().__init__(config, sockets)
        self._shared = shared
        self._pids: set[int] = set()

    def init_processes(self) -> None:
        super().init_processes()
        self._forget_gone()

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()  # a dead worker is joined, then replaced
        self._forget_gone()

    def handle_signals(self) -> None:
        super().handle_signals()  # SIGHUP, SIGTTOU: retired workers are joined first
        self._forget_gone()

    def _forget_gone(self) -> None:
        current = {p.pid for p in self.processes if p.pid is not None}
        for pid in self._pids - current:
            with contextlib.suppress(OSError):
                mark_process_dead(pid, str(self._shared))  # type: ignore[no-untyped-call]
        self._pids = current
