"""The Go load generator (deploy/loadtest/hammer): build, configure, run.

Built with the machine's ``go`` into ``.llog/bin/hammer-<digest>``, where the digest
covers the sources (the hammer's and those of the latency module beside it, which it
shares with the HTTP benchmark's load generator) and the Go version, so an edit rebuilds
and an unchanged tree starts at once. Its one external module, the HDR histogram library
pinned in go.sum, comes through the Go module proxy the first time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from app.loadtest import rundir
from app.loadtest.rundir import RunDir
from app.loadtest.scenario import Scenario
from app.localstack.binaries import DEFAULT_CACHE_DIR, REPO_ROOT
from app.storage.idempotency import IDEMPOTENCY_WINDOW

HAMMER_SRC = REPO_ROOT / "deploy" / "loadtest" / "hammer"
LATENCY_SRC = REPO_ROOT / "deploy" / "loadtest" / "latency"  # a module the hammer uses


class HammerError(RuntimeError):
    """The hammer could not be built or failed."""


def _cache_dir() -> Path:
    configured = os.environ.get("LLOG_BIN_CACHE_DIR")
    return Path(configured) if configured else DEFAULT_CACHE_DIR


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go"
                               if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise HammerError("the load generator needs Go (go 1.24 or newer) on PATH")
    return go


def source_digest(go: str) -> str:
    h = hashlib.sha256()
    for src in (HAMMER_SRC, LATENCY_SRC):
        for path in sorted(src.iterdir()):
            if path.suffix == ".go" or path.name in ("go.mod", "go.sum"):
                if path.name.endswith("_test.go"):
                    continue
                name = f"{src.name}/{path.name}"
                h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=False)
    h.update(version.stdout.encode())
    return h.hexdigest()[:12]


def build_hammer() -> Path:
    """The hammer binary, built if missing (serialised by a lock file)."""
    go = _go()
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    binary = cache / f"hammer-{source_digest(go)}"
    if binary.exists():
        return binary
    with (cache / ".hammer.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists():
            return binary
        tmp = binary.with_name(binary.name + ".tmp")
        env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
        if "GOCACHE" not in env and "HOME" not in env:
            env["GOCACHE"] = str(cache / ".go-build-cache")
        result = subprocess.run([go, "build", "-trimpath", "-o", str(tmp), "."],
                                cwd=HAMMER_SRC, env=env, capture_output=True, text=True,
                                check=False)
        if result.returncode != 0:
            raise HammerError(f"building the hammer failed (go build in {HAMMER_SRC}):\n"
                              f"{result.stderr.strip()}")
        tmp.replace(binary)
    return binary


PROXY_ID = "proxy"  # the hammer's one "broker" when a load balancer fronts them all


def _targets(stack: dict[str, Any], manifest: dict[str, Any]
             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The brokers the hammer sends to and each partition's owners and readers among
    them: the stack's brokers and the manifest's owner sets, or, behind a proxy, the
    proxy alone for every partition."""
    proxy = stack.get("proxy")
    if not proxy:
        return ([{"id": b["id"], "url": b["url"], "write": "write" in b["roles"],
                  "read": "read" in b["roles"]} for b in stack["brokers"]],
                manifest["partitions"])
    one = [PROXY_ID]
    return ([{"id": PROXY_ID, "url": proxy["url"], "write": True, "read": True}],
            [{"topic": p["topic"], "partition": p["partition"], "owners": one,
              "readers": one} for p in manifest["partitions"]])


def hammer_config(run: RunDir, scenario: Scenario, stack: dict[str, Any],
                  manifest: dict[str, Any]) -> dict[str, Any]:
    w, c = scenario.workload, scenario.consumer
    brokers, partitions = _targets(stack, manifest)
    return {
        "run_id": run.run_id,
        "brokers": brokers,
        "partitions": partitions,
        "policy": scenario.routing.policy,
        "mode": w.mode,
        "connections": w.connections,
        "rate": w.rate,
        "duration_s": w.duration_s,
        "warmup_s": w.warmup_s,
        "record_bytes": w.record_bytes,
        "records_per_request": w.records_per_request,
        "entries_per_request": w.entries_per_request,
        "request_timeout_s": w.request_timeout_s,
        "max_retries": w.max_retries,
        "retry_backoff_ms": w.retry_backoff_ms,
        "retry_backoff_max_ms": w.retry_backoff_max_ms,
        "idempotency_keys": w.idempotency_keys,
        "key_window": IDEMPOTENCY_WINDOW,
        "interval_s": scenario.hammer.interval_s,
        "down_backoff_ms": scenario.hammer.down_backoff_ms,
        "consumer": {"enabled": c.enabled, "max_wait_ms": c.max_wait_ms,
                     "max_partitions_per_request": c.max_partitions_per_request,
                     "max_bytes": c.max_bytes, "drain_timeout_s": c.drain_timeout_s},
        "out": {"dir": str(run.path), "client_intervals": rundir.CLIENT_INTERVALS,
                "client_summary": rundir.CLIENT_SUMMARY, "remap_events": rundir.REMAP_EVENTS,
                "retry_events": rundir.RETRY_EVENTS,
                "acked": rundir.ACKED if scenario.hammer.record_acks else ""},
    }


def start_hammer(binary: Path, run: RunDir, config: dict[str, Any]) -> subprocess.Popen[bytes]:
    path = run / rundir.HAMMER_CONFIG
    rundir.write_json(path, config)
    log = (run.logs / "hammer.log").open("ab")
    try:
        return subprocess.Popen([str(binary), "-config", str(path)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=run.path)
    finally:
        log.close()
