"""The brokers users run, as environments for a benchmark's ``llog serve``: ``llog dev``
as shipped (app/localstack/dev.py) and the Kubernetes reference (deploy/k8s/base).

Nothing here is a copy of their settings: the dev broker's environment is what
``broker_env`` of app/localstack/dev.py returns, the Kubernetes one is read from
deploy/k8s/base/llog.env and the broker container's ``env`` in broker-deployment.yaml.
A change to what either ships changes the benchmark's rows with it.

Only what a benchmark on one machine cannot reproduce is replaced, and none of it is on
the produce or read path: the stack's Oxia and S3 (the overlay's endpoints and the
Secret's credentials), access control off (the Secrets are not here), no drain on stop.
The Kubernetes tail cache is a memory-backed emptyDir, so it goes to a tmpfs directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from app.localstack.dev import broker_env
from app.localstack.stack import LocalStack

ROOT = Path(__file__).resolve().parent.parent
K8S_BASE = ROOT / "deploy" / "k8s" / "base"
TMPFS = Path("/dev/shm")
# Settings of the deployment that need what a benchmark does not have (the Secrets)
# or that only change how a broker stops: replaced, never on the produce or read path.
_K8S_DROPPED = ("LLOG_AUTH", "LLOG_AUTH_FILE", "LLOG_METRICS_TOKEN",
                "LLOG_STREAM_TICKET_SECRET", "LLOG_S3_ACCESS_KEY", "LLOG_S3_SECRET_KEY")


def parse_env_file(text: str) -> dict[str, str]:
    """A kustomize ``envs`` file: ``KEY=VALUE`` lines, ``#`` comments, blank lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"not KEY=VALUE: {line!r}")
        out[key.strip()] = value
    return out


def container_env(manifest: str, container: str) -> dict[str, str]:
    """The literal ``env`` values of ``container`` in a Deployment (``valueFrom``
    entries, Secrets and the like, are left out)."""
    doc: dict[str, Any] = yaml.safe_load(manifest)
    for c in doc["spec"]["template"]["spec"]["containers"]:
        if c["name"] == container:
            return {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
    raise ValueError(f"no container {container!r} in the manifest")


def k8s_broker_env(stack: LocalStack, tail_dir: Path, base: Path = K8S_BASE
                   ) -> dict[str, str]:
    """The broker of the Kubernetes reference: llog.env (the ConfigMap), then the broker
    container's env, then this run's stack, the tail cache in ``tail_dir`` (a tmpfs as
    the emptyDir of medium Memory) and access control off."""
    env = {**parse_env_file((base / "llog.env").read_text()),
           **container_env((base / "broker-deployment.yaml").read_text(), "broker")}
    for name in _K8S_DROPPED:
        env.pop(name, None)
    if "LLOG_TAIL_CACHE_DIR" in env:
        env["LLOG_TAIL_CACHE_DIR"] = str(tail_dir)
    return {**env, **stack.settings_env(), "LLOG_AUTH": "off", "LLOG_DRAIN_S": "0",
            "LLOG_BROKER_ID": "perf-k8s"}


def dev_broker_env(stack: LocalStack, data_dir: Path) -> dict[str, str]:
    """The single broker of ``llog dev --data-dir data_dir``, draining 0 s on stop."""
    return {**broker_env(stack, data_dir, "broker"), "LLOG_DRAIN_S": "0",
            "LLOG_BROKER_ID": "perf-dev"}


def tmpfs_dir(prefix: str) -> Path:
    """A fresh directory on a tmpfs (/dev/shm), or under the temporary directory when
    the machine has none; the caller removes it."""
    import tempfile

    base = TMPFS if TMPFS.is_dir() and os.access(TMPFS, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def describe(env: dict[str, str]) -> dict[str, str]:
    """The settings of a row worth printing: everything but the stack's addresses and
    credentials."""
    skip = ("LLOG_OXIA_", "LLOG_S3_")
    return {k: v for k, v in sorted(env.items())
            if k.startswith("LLOG_") and not k.startswith(skip)
            and "SECRET" not in k and "TOKEN" not in k}
