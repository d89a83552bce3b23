"""bench/baseline.py: a broker of another revision runs that revision's code and takes
that revision's dev settings, for before/after figures measured in the same run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import baseline  # noqa: E402


def test_a_revision_is_checked_out_once_and_its_own_code_is_what_runs(tmp_path: Path
                                                                      ) -> None:
    tree, commit = baseline.checkout("HEAD")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert head.startswith(commit) and tree.is_relative_to(baseline.BASELINES)
    assert baseline.checkout(commit) == (tree, commit)  # reused, not added again
    imported = subprocess.run(
        [sys.executable, "-c", "import app; print(app.__file__)"], cwd=tree,
        env=baseline.environment(tree, {}), check=True, capture_output=True, text=True)
    assert Path(imported.stdout.strip()).resolve().is_relative_to(tree.resolve())
    assert baseline.serve_command(tree, 8123)[1:4] == ["-m", "app.cli", "serve"]
    env = baseline.dev_env(tree, {"LLOG_OXIA_ADDRESS": "127.0.0.1:1"}, tmp_path)
    assert env["LLOG_OXIA_ADDRESS"] == "127.0.0.1:1"  # the run's stack, passed through
    assert "write" in env["LLOG_ROLES"]  # and the revision's own dev settings
    assert len([t for t in baseline.BASELINES.iterdir() if t.is_dir()]) <= baseline.KEPT
