"""bench/shipped.py: the benchmark's `llog dev` and Kubernetes brokers take their settings
from what ships (app/localstack/dev.py, deploy/k8s/base), never from a copy."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import shipped  # noqa: E402

from app.localstack.dev import broker_env, compactor_env  # noqa: E402
from app.localstack.stack import LocalStack, StackConfig  # noqa: E402
from app.settings import Settings  # noqa: E402


@pytest.fixture
def stack(tmp_path: Path) -> LocalStack:
    return LocalStack(StackConfig.ephemeral(tmp_path / "stack", root_prefix="bench"))


def test_env_file_lines() -> None:
    assert shipped.parse_env_file("# c\n\nA=1\nB=x=y\n  C=  \n") == {
        "A": "1", "B": "x=y", "C": ""}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        shipped.parse_env_file("LONELY\n")


def test_container_env_keeps_literal_values_only() -> None:
    manifest = """
spec:
  template:
    spec:
      containers:
        - name: other
          env: [{name: A, value: "no"}]
        - name: broker
          env:
            - {name: A, value: "1"}
            - {name: S, valueFrom: {secretKeyRef: {name: s, key: k}}}
"""
    assert shipped.container_env(manifest, "broker") == {"A": "1"}
    with pytest.raises(ValueError, match="no container"):
        shipped.container_env(manifest, "missing")


def test_k8s_broker_follows_the_reference(stack: LocalStack, tmp_path: Path) -> None:
    base = shipped.K8S_BASE
    configmap = shipped.parse_env_file((base / "llog.env").read_text())
    deployment = shipped.container_env((base / "broker-deployment.yaml").read_text(),
                                       "broker")
    env = shipped.k8s_broker_env(stack, tmp_path / "tail")
    for name, value in {**configmap, **deployment}.items():
        if name in ("LLOG_DRAIN_S", "LLOG_ROOT_PREFIX", "LLOG_TAIL_CACHE_DIR", "LLOG_AUTH",
                    "LLOG_AUTH_FILE"):
            continue
        assert env[name] == value, name
    # What the benchmark cannot have or must replace: the stack, no Secrets, no drain.
    assert env["LLOG_ROOT_PREFIX"] == "bench"
    assert env["LLOG_OXIA_ADDRESS"] == stack.oxia_address
    assert env["LLOG_AUTH"] == "off" and "LLOG_AUTH_FILE" not in env
    assert env["LLOG_DRAIN_S"] == "0"
    if "LLOG_TAIL_CACHE_DIR" in deployment:
        assert env["LLOG_TAIL_CACHE_DIR"] == str(tmp_path / "tail")
    Settings(**{k.removeprefix("LLOG_").lower(): v for k, v in env.items()})


def test_k8s_broker_changes_with_the_files(stack: LocalStack, tmp_path: Path) -> None:
    base = tmp_path / "base"
    shutil.copytree(shipped.K8S_BASE, base)
    with (base / "llog.env").open("a") as f:
        f.write("LLOG_TAIL_CACHE_MAX_BYTES=12345\n")
    text = (base / "broker-deployment.yaml").read_text()
    (base / "broker-deployment.yaml").write_text(
        text.replace("value: write,read\n", "value: write,read,compact\n", 1))
    env = shipped.k8s_broker_env(stack, tmp_path / "tail", base)
    assert env["LLOG_TAIL_CACHE_MAX_BYTES"] == "12345"
    assert env["LLOG_ROLES"] == "write,read,compact"


def test_dev_broker_is_the_one_llog_dev_starts(stack: LocalStack, tmp_path: Path) -> None:
    env = shipped.dev_broker_env(stack, tmp_path / "data")
    dev = broker_env(stack, tmp_path / "data", "broker")
    assert {k: v for k, v in env.items() if k not in ("LLOG_DRAIN_S", "LLOG_BROKER_ID")} == {
        k: v for k, v in dev.items() if k not in ("LLOG_DRAIN_S", "LLOG_BROKER_ID")}
    assert env["LLOG_DRAIN_S"] == "0"


def _compactor_settings(stack: LocalStack) -> Settings:
    return Settings(**{k.removeprefix("LLOG_").lower(): v  # type: ignore[arg-type]
                       for k, v in compactor_env(stack).items()})


def test_dev_compactor_is_throttled_unless_the_user_says_otherwise(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """`llog dev` (and the benchmark's dev rows, which start the compactor through
    start_compactor and so compactor_env) ship the throttle; an explicit value wins,
    "unlimited" included."""
    monkeypatch.delenv("LLOG_COMPACTION_MAX_BYTES_PER_S", raising=False)
    assert compactor_env(stack)["LLOG_COMPACTION_MAX_BYTES_PER_S"] == "4194304"
    assert _compactor_settings(stack).compaction_max_bytes_per_s == 4 * 1024 * 1024
    monkeypatch.setenv("LLOG_COMPACTION_MAX_BYTES_PER_S", "1048576")
    assert _compactor_settings(stack).compaction_max_bytes_per_s == 1024 * 1024
    for unlimited in ("unlimited", ""):
        monkeypatch.setenv("LLOG_COMPACTION_MAX_BYTES_PER_S", unlimited)
        assert compactor_env(stack)["LLOG_COMPACTION_MAX_BYTES_PER_S"] == unlimited
        assert _compactor_settings(stack).compaction_max_bytes_per_s is None


def test_dev_compactor_rewrites_in_small_runs_unless_the_user_says_otherwise(
        stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run is paid for once done: runs of 8 MiB keep the throttle's bursts short (a
    64 MiB run held up the broker's PUTs to the same MinIO); an explicit value wins."""
    monkeypatch.delenv("LLOG_COMPACTION_MAX_BYTES", raising=False)
    assert _compactor_settings(stack).compaction_max_bytes == 8 * 1024 * 1024
    monkeypatch.setenv("LLOG_COMPACTION_MAX_BYTES", str(64 * 1024 * 1024))
    assert _compactor_settings(stack).compaction_max_bytes == 64 * 1024 * 1024
