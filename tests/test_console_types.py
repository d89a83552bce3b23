"""The console's JavaScript type-checks: TypeScript reads its JSDoc types
(app/console/tsconfig.json), so a wrong field or a call with the wrong arguments fails
here rather than in a person's browser."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.helpers import generators

CONSOLE = Path(__file__).resolve().parents[1] / "app" / "console"


def test_the_console_type_checks() -> None:
    node = shutil.which("node")
    assert node is not None, "the console's type check needs Node.js (scripts/bootstrap.sh)"
    done = subprocess.run([node, str(generators.typescript_compiler()), "-p",
                           str(CONSOLE / "tsconfig.json")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_module_checks_its_types() -> None:
    unchecked = [p.name for p in (CONSOLE / "assets" / "js").rglob("*.js")
                 if not p.read_text().startswith("// @ts-check")]
    assert not unchecked, f"modules without // @ts-check: {unchecked}"
