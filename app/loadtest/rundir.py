"""The run directory: its file names, ``stack.json`` and process bookkeeping by pid.

Every process of a run is recorded with its pid and its creation time, so another
invocation can find it, tell it from a recycled pid, and stop it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from app.localstack.binaries import REPO_ROOT

DEFAULT_RESULTS = REPO_ROOT / "results"

RESOLVED = "resolved-config.json"
STACK = "stack.json"
MANIFEST = "routing-manifest.json"
HAMMER_CONFIG = "hammer-config.json"
CLIENT_INTERVALS = "client-30s.jsonl"
CLIENT_SUMMARY = "client-summary.json"
REMAP_EVENTS = "remap-events.jsonl"
RETRY_EVENTS = "retry-events.jsonl"
ACKED = "acked.tsv"
METRICS = "metrics-30s.jsonl"
METRICS_FINAL = "metrics-final.json"
SUMMARY = "summary.json"
REPORT = "report.html"
GIT = "git.json"
ENVIRONMENT = "environment.json"
PRECREATE = "precreate.json"
VERIFY = "verify.json"
FAULTS = "fault-events.jsonl"
FILE_SD = "prometheus-targets.json"
PROMETHEUS = "prometheus.yml"


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def write_json(path: Path, doc: Any) -> None:
    """Atomically (write, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def stack_data(self) -> Path:
        return self.path / "stack"

    def stack(self) -> dict[str, Any]:
        doc: dict[str, Any] = read_json(self.path / STACK)
        return doc

    def write_stack(self, doc: dict[str, Any]) -> None:
        doc["updated_at"] = time.time()
        write_json(self.path / STACK, doc)

    def resolved(self) -> dict[str, Any]:
        doc: dict[str, Any] = read_json(self.path / RESOLVED)
        return doc

    def exists(self) -> bool:
        return (self.path / STACK).is_file() and (self.path / RESOLVED).is_file()


def new_run_dir(results: Path, scenario_name: str) -> RunDir:
    results.mkdir(parents=True, exist_ok=True)
    stamp = utc_stamp()
    path = results / f"{stamp}-{scenario_name}"
    n = 1
    while path.exists():
        n += 1
        path = results / f"{stamp}-{scenario_name}-{n}"
    path.mkdir()
    (path / "logs").mkdir()
    return RunDir(path)


def latest_run_dir(results: Path, scenario_name: str | None) -> RunDir | None:
    """The newest run directory (of that scenario, if given) that has a stack.json."""
    if not results.is_dir():
        return None
    candidates = []
    for child in results.iterdir():
        if not child.is_dir() or not (child / STACK).is_file():
            continue
        if scenario_name is not None:
            try:
                name = read_json(child / RESOLVED).get("name")
            except (OSError, ValueError):
                continue
            if name != scenario_name:
                continue
        candidates.append(child)
    if not candidates:
        return None
    return RunDir(max(candidates, key=lambda p: p.name))


# -- processes -----------------------------------------------------------------------


def create_time(pid: int) -> float | None:
    """When ``pid`` was created (seconds since the epoch), or None if it does not run."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # it has exited
            return None
        return proc.create_time()
    except psutil.Error:
        return None


def process_ref(pid: int) -> dict[str, Any]:
    return {"pid": pid, "create_time": create_time(pid)}


def ref_alive(ref: dict[str, Any] | None) -> bool:
    """True if the recorded process still runs (same pid *and* creation time)."""
    if not ref or not ref.get("pid"):
        return False
    current = create_time(int(ref["pid"]))
    return current is not None and (ref.get("create_time") in (None, current))


def kill_ref(ref: dict[str, Any] | None, sig: int = signal.SIGKILL, group: bool = True) -> bool:
    """Signal a recorded process (its process group when it leads one); False if gone."""
    if not ref_alive(ref):
        return False
    assert ref is not None
    pid = int(ref["pid"])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
        return True
    return False


def wait_gone(refs: list[dict[str, Any]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(ref_alive(r) for r in refs):
            return True
        time.sleep(0.1)
    return not any(ref_alive(r) for r in refs)
