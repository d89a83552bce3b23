"""A broker of another revision, for before/after figures taken in the same run.

The machines these benchmarks run on are shared and noisy: a figure measured today and
one measured yesterday differ by more than most changes are worth. So a change is
measured against the code before it *in the same run*, on the same stack: ``--baseline
REF`` checks out REF (a commit, tag or branch of this repository) into a detached git
worktree under ``.llog/bench/baseline/`` and starts its ``llog serve`` from there, with
this checkout's Python environment (a revision that needs other dependencies is not a
baseline this can run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / ".llog" / "bench" / "baseline"


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def checkout(ref: str) -> tuple[Path, str]:
    """A worktree of ``ref`` (made once per commit, reused after) and its short hash."""
    commit = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    tree = BASELINES / commit[:12]
    if not (tree / "app" / "cli.py").is_file():
        BASELINES.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False,
                       capture_output=True)
        _git("worktree", "add", "--force", "--detach", str(tree), commit)
    tree.touch()  # most recently used
    _forget_old(keep=tree)
    return tree, commit[:12]


KEPT = 4  # baseline trees kept (each a checkout of the repository)


def _forget_old(keep: Path) -> None:
    """Remove all but the :data:`KEPT` most recently used baseline trees."""
    trees = sorted((t for t in BASELINES.iterdir() if t.is_dir() and t != keep),
                   key=lambda t: t.stat().st_mtime, reverse=True)
    for old in trees[KEPT - 1:]:
        subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                       check=False, capture_output=True)


def serve_command(tree: Path, port: int, *, workers: int = 1,
                  log_level: str = "warning") -> list[str]:
    """``llog serve`` of the revision in ``tree`` (run with ``cwd=tree``: ``python -m``
    imports the package of the working directory first)."""
    del tree  # the working directory picks the revision; kept for the call's meaning
    return [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), "--log-level", log_level]


def environment(tree: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` on top of ours, with the revision's package first on the path."""
    merged = {**os.environ, **env}
    merged["PYTHONPATH"] = os.pathsep.join(
        [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return merged


# Run in the revision's tree: its dev broker's environment, whatever its dev.py calls it.
_DEV_ENV = """
import json, sys
from pathlib import Path
from app.localstack import dev
make = getattr(dev, "broker_env", None) or dev._broker_env
class Stack:
    def settings_env(self):
        return json.loads(sys.argv[1])
print(json.dumps(make(Stack(), Path(sys.argv[2]), "broker")))
"""


def dev_env(tree: Path, stack_env: Mapping[str, str], data_dir: Path) -> dict[str, str]:
    """The environment ``llog dev`` of the revision in ``tree`` gives its one broker."""
    out = subprocess.run([sys.executable, "-c", _DEV_ENV, json.dumps(dict(stack_env)),
                          str(data_dir)], cwd=tree, env=environment(tree, {}), check=True,
                         capture_output=True, text=True, timeout=60)
    env: dict[str, str] = json.loads(out.stdout)
    return env
