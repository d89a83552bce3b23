"""Broker processes on loopback (`llog serve`), for `llog dev`, tests and load tests."""

from __future__ import annotations

import os
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from app.localstack.processes import ManagedProcess, wait_until


def broker_process(
    name: str,
    port: int,
    env: Mapping[str, str],
    log_path: Path,
    *,
    workers: int = 1,
    host: str = "127.0.0.1",
    log_level: str = "warning",
) -> ManagedProcess:
    """A `llog serve` child with ``env`` (LLOG_* settings) on top of ours."""
    return ManagedProcess(
        name,
        [sys.executable, "-m", "app.cli", "serve", "--host", host, "--port", str(port),
         "--workers", str(workers), "--log-level", log_level],
        log_path,
        env={**os.environ, **env},
    )


def wait_healthy(proc: ManagedProcess, url: str, timeout: float = 60.0) -> None:
    def healthy() -> bool:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
            return bool(resp.status == 200)

    wait_until(f"broker {proc.name} on {url}", healthy, timeout=timeout, process=proc)
