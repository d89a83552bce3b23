"""kustomize for the tests of deploy/k8s/: built like the local servers, from a Go module
of ours that pins the release (deploy/tools/kustomize/go.mod and go.sum), through the Go
module proxy, and cached beside them (``.llog/bin``, or ``LLOG_BIN_CACHE_DIR``) under a
name that changes with the pin."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.localstack.binaries import REPO_ROOT, ServerModule, ensure_binary

TOOL_DIR = REPO_ROOT / "deploy" / "tools" / "kustomize"


@dataclass(frozen=True)
class ToolModule(ServerModule):
    """A pinned Go tool built by the same code as the servers, from its own directory."""

    directory: Path = TOOL_DIR

    @property
    def module_dir(self) -> Path:
        return self.directory


KUSTOMIZE = ToolModule("kustomize", "sigs.k8s.io/kustomize/kustomize/v5",
                       "sigs.k8s.io/kustomize/kustomize/v5")


def ensure_kustomize() -> Path:
    """The cached kustomize binary, built first if needed (about a minute, once)."""
    return ensure_binary(KUSTOMIZE)


def render(kustomize: Path, directory: Path) -> list[dict[str, Any]]:
    """``kustomize build directory`` as a list of objects."""
    import yaml  # here: the build above runs before the venv's packages are there

    done = subprocess.run([str(kustomize), "build", str(directory)], capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise AssertionError(f"kustomize build {directory} failed:\n{done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
