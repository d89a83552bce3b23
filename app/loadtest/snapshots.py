"""Git and environment snapshots written into each run directory."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from app.localstack.binaries import REPO_ROOT

_PACKAGES = ("leaderless-log", "fastapi", "uvicorn", "oxia", "aiobotocore", "anyio",
             "pydantic", "prometheus-client", "prometheus-fastapi-instrumentator")
_SECRET_WORDS = ("SECRET", "PASSWORD", "TOKEN", "KEY", "CREDENTIAL")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_snapshot() -> dict[str, Any]:
    status = _git("status", "--porcelain")
    return {
        "commit": _git("rev-parse", "HEAD"),
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
        "describe": _git("describe", "--always", "--dirty"),
        "dirty": bool(status) if status is not None else None,
        "status": status.splitlines() if status else [],
        "diff_stat": _git("diff", "--stat", "HEAD"),
    }


def cpu_model() -> str | None:
    """The processor's model name; psutil does not report it, so it comes from
    /proc/cpuinfo (None where that does not exist)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _go_version() -> str | None:
    go = shutil.which("go")
    if go is None:
        return None
    try:
        out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=20,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _redact(name: str, value: str) -> str:
    return "<redacted>" if any(w in name.upper() for w in _SECRET_WORDS) else value


def environment_snapshot() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for pkg in _PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    mem = psutil.virtual_memory()
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "kernel": platform.release(),
        "python": sys.version,
        "python_executable": sys.executable,
        "go": _go_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "mem_total_bytes": mem.total,
        "mem_available_bytes": mem.available,
        "loadavg": list(os.getloadavg()),
        "packages": versions,
        "llog_env": {k: _redact(k, v) for k, v in sorted(os.environ.items())
                     if k.startswith("LLOG_")},
    }
