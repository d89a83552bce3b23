"""The run's gate and the xdist groups, end to end: small projects in a temporary
directory run by pytest in a subprocess, with the project's gate plugin
(``tests.helpers.gate``, what ``tests/conftest.py`` registers) and its selection code.

A skip whose reason is not on the allow-list fails the run, whether a test skipped while
running or a whole module skipped while being collected, with pytest-xdist and without;
a module that fails to import fails it too; an allowed skip and a passing run pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import gate
from tests.helpers.selection import OWN_SERVERS_GROUP

REPO = Path(__file__).resolve().parents[1]
SECTION = "skips not on the allow-list"
ALLOWED_REASON = "allowed in this project"
# Bounds one pytest run of a small project; a healthy one takes about a second.
RUN_TIMEOUT_S = 60
# Without xdist, and with it as `scripts/test` runs it (the controller judges the run).
MODES = {"serial": [], "xdist": ["-p", "xdist.plugin", "-n", "2", "--dist", "loadgroup"]}

# Every project also has a passing test, so the run would pass but for the case.
PASSING = "def test_passes() -> None:\n    pass\n"

# The project's own allow-list entry, added the way a real one is: to ALLOWED_SKIPS.
GATE_CONFTEST = f"""
from tests.helpers import selection

selection.ALLOWED_SKIPS = (*selection.ALLOWED_SKIPS, ({ALLOWED_REASON!r}, "this project"))
"""

# Records each collected test's xdist group, after the project's marking has run.
GROUPS_CONFTEST = """
import json
from pathlib import Path

import pytest

from tests.helpers import selection


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    selection.mark_by_fixture(items)


def pytest_collection_finish(session):
    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        groups[item.name] = None if mark is None else mark.args[0]
    Path(session.config.rootpath, "groups.json").write_text(json.dumps(groups))
"""


@dataclass(frozen=True)
class Case:
    source: str
    exit_code: int
    # What the gate prints about the skip (None: it prints no section at all).
    listed: str | None


MISSING = "a_module_that_does_not_exist_xyz"

CASES = {
    "importorskip": Case(f"""
        import pytest

        pytest.importorskip("{MISSING}")


        def test_never_runs() -> None:
            pass
        """, 1, f"test_case.py: could not import '{MISSING}'"),
    "module_skip": Case("""
        import pytest

        pytest.skip("why", allow_module_level=True)
        """, 1, "test_case.py: why"),
    "runtime_skip": Case("""
        import pytest


        def test_skips() -> None:
            pytest.skip("why")
        """, 1, "test_case.py::test_skips: why"),
    "passing": Case(PASSING.replace("test_passes", "test_also_passes"), 0, None),
    "allowed_skip": Case(f"""
        import pytest

        pytest.skip("{ALLOWED_REASON} only", allow_module_level=True)
        """, 0, None),
}


def write_project(root: Path, files: dict[str, str]) -> None:
    # pytest.ini makes the directory the rootdir, away from the repository's pyproject.
    for name, text in {"pytest.ini": "[pytest]\n", **files}.items():
        (root / name).write_text(textwrap.dedent(text))


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a subprocess on the project in ``root``, with the gate loaded the way
    another project would load it and no other plugin than those asked for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {"PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.helpers.gate", "-p", "no:cacheprovider",
         "-q", *args],
        cwd=root, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        check=False)


def test_the_suite_runs_with_the_gate(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.is_registered(gate)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_the_gate_fails_a_run_with_a_skip_not_on_the_allow_list(
        tmp_path: Path, case: str, mode: str) -> None:
    expected = CASES[case]
    write_project(tmp_path, {"conftest.py": GATE_CONFTEST, "test_passes.py": PASSING,
                             "test_case.py": expected.source})
    run = run_pytest(tmp_path, *MODES[mode])
    output = run.stdout + run.stderr
    assert run.returncode == expected.exit_code, output
    if expected.listed is None:
        assert SECTION not in output, output
    else:
        assert SECTION in output and expected.listed in output, output


@pytest.mark.parametrize("mode", MODES)
def test_a_module_that_fails_to_import_fails_the_run(tmp_path: Path, mode: str) -> None:
    write_project(tmp_path, {"test_passes.py": PASSING,
                             "test_broken.py": f"import {MISSING}\n"})
    run = run_pytest(tmp_path, *MODES[mode])
    assert run.returncode != 0, run.stdout + run.stderr
    assert "ERROR test_broken.py" in run.stdout


def test_a_module_marked_own_servers_runs_in_the_own_servers_group(tmp_path: Path) -> None:
    write_project(tmp_path, {
        "conftest.py": GROUPS_CONFTEST,
        "test_own.py": """
            import pytest

            from tests.helpers.selection import starts_servers

            pytestmark = pytest.mark.own_servers


            @pytest.fixture(scope="module")
            def shared() -> str:
                return "shared"


            @pytest.fixture
            @starts_servers(group="elsewhere")
            def servers_elsewhere() -> str:
                return "servers"


            def test_plain() -> None:
                pass


            def test_with_a_module_fixture(shared: str) -> None:
                pass


            def test_with_a_fixture_naming_its_group(servers_elsewhere: str) -> None:
                pass
            """,
        "test_other.py": PASSING,
    })
    run = run_pytest(tmp_path, "--collect-only")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((tmp_path / "groups.json").read_text()) == {
        "test_plain": OWN_SERVERS_GROUP,
        "test_with_a_module_fixture": OWN_SERVERS_GROUP,
        "test_with_a_fixture_naming_its_group": "elsewhere",
        "test_passes": None,
    }


def test_a_group_runs_in_one_process_and_the_rest_spread(tmp_path: Path) -> None:
    """What ``--dist loadgroup`` promises, as ``scripts/test`` runs it: every test of one
    xdist group in one process. (pytest-xdist groups by rewriting a private attribute of
    pytest's items; a pytest that stops reading it ignores every group, silently.)"""
    tests = "\n".join(
        f"@pytest.mark.xdist_group('together')\ndef test_grouped_{i}() -> None:\n"
        f"    record('grouped_{i}')\n\n\ndef test_spread_{i}() -> None:\n"
        f"    record('spread_{i}')\n" for i in range(8))
    write_project(tmp_path, {"test_groups.py": f"""
import os
from pathlib import Path

import pytest


def record(name: str) -> None:
    worker = os.environ['PYTEST_XDIST_WORKER']
    (Path(__file__).parent / f'{{name}}.worker').write_text(worker)


{tests}
"""})
    run = run_pytest(tmp_path, *MODES["xdist"])
    assert run.returncode == 0, run.stdout + run.stderr
    ran = {p.stem: p.read_text() for p in tmp_path.glob("*.worker")}
    assert len(ran) == 16, ran
    assert len({w for name, w in ran.items() if name.startswith("grouped")}) == 1, ran
    assert len(set(ran.values())) == 2, ran  # the others went to both processes
