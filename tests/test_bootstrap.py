"""scripts/bootstrap.sh installs what the suite needs or stops saying what to install: it
never lets the tests run with a feature missing. Run against a copy of the script in a
scratch checkout, with stand-ins for the system's commands on PATH."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bootstrap.sh"


class Machine:
    """A scratch checkout whose venv is installed already, and a PATH of stand-ins."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "stand-ins"
        self.bin.mkdir()
        (root / "scripts").mkdir()
        shutil.copy(SCRIPT, root / "scripts" / "bootstrap.sh")
        (root / "pyproject.toml").write_text("[project]\nname = 'scratch'\n")
        (root / "clients" / "python").mkdir(parents=True)
        (root / "clients" / "python" / "pyproject.toml").write_text(
            "[project]\nname = 'scratch-client'\n")
        (root / "clients" / "python" / "setup.py").write_text("")
        venv = root / ".venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").symlink_to(sys.executable)
        digest = hashlib.sha256((root / "pyproject.toml").read_bytes() + (
            root / "clients" / "python" / "pyproject.toml").read_bytes() + (
            root / "clients" / "python" / "setup.py").read_bytes()).hexdigest()
        (root / ".venv" / ".llog-installed").write_text(digest + "\n")
        helpers = root / "tests" / "helpers"
        helpers.mkdir(parents=True)
        for package in (root / "tests", helpers):
            (package / "__init__.py").write_text("")
        (helpers / "prebuild.py").write_text(
            "from pathlib import Path\n"
            "with (Path(__file__).parents[2] / 'built').open('a') as f:\n"
            "    f.write('servers, tools and client generators\\n')\n")
        for tool in ("bash", "sh", "sha256sum", "cut", "cat", "sed", "dirname"):
            found = shutil.which(tool)
            assert found is not None
            (self.bin / tool).symlink_to(found)
        self.command("go", "exit 0")
        self.command("id", "echo 0")  # root, so apt-get is the script's to run

    def command(self, name: str, body: str, where: Path | None = None) -> None:
        path = (where or self.bin) / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)

    def java(self, major: int) -> None:
        self.command("java", f'echo \'openjdk version "{major}.0.2" 2024-01-16\' >&2')

    def everything_but(self, *absent: str) -> None:
        """Stand-ins for every system package the suite needs, but those named."""
        if "java" not in absent:
            self.java(17)
        for tool in ("haproxy", "nginx", "node", "npm", "chromium"):
            if tool not in absent:
                self.command(tool, "exit 0")

    def run(self, want: str = "test", **env_: str) -> subprocess.CompletedProcess[str]:
        env = {"PATH": str(self.bin), "PYTHON": sys.executable, "LLOG_SBIN_DIRS": "",
               "HOME": str(self.root), **env_}
        return subprocess.run([str(self.bin / "bash"), str(self.root / "scripts" /
                                                          "bootstrap.sh"), want],
                              capture_output=True, text=True, env=env, timeout=60,
                              check=False)


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_everything_present_builds_the_servers(machine: Machine) -> None:
    machine.everything_but()
    done = machine.run()
    assert done.returncode == 0, done.stderr
    assert (machine.root / "built").read_text() == "servers, tools and client generators\n"


def test_a_missing_node_is_named(machine: Machine) -> None:
    machine.java(17)
    machine.command("haproxy", "exit 0")
    machine.command("nginx", "exit 0")
    done = machine.run()
    assert done.returncode == 1
    assert "Node.js 18+ and npm" in done.stderr
    assert not (machine.root / "built").exists()


def test_an_unreachable_apt_stops_before_the_tests_and_says_what_to_install(
        machine: Machine) -> None:
    machine.java(17)
    machine.command("haproxy", "exit 0")
    machine.command("apt-get", '[ "$1" = update ] && exit 100; exit 0')
    done = machine.run()
    assert done.returncode == 1
    assert "apt-get update failed" in done.stderr and "nginx" in done.stderr
    assert not (machine.root / "built").exists()


def test_an_install_that_leaves_a_package_missing_is_caught(machine: Machine) -> None:
    machine.java(17)
    machine.command("apt-get", "exit 0")  # says it worked, installs nothing
    done = machine.run()
    assert done.returncode == 1
    assert "need HAProxy" in done.stderr


def test_a_missing_chromium_is_named(machine: Machine) -> None:
    machine.everything_but("chromium")
    done = machine.run()
    assert done.returncode == 1
    assert "the console's browser tests need Chromium" in done.stderr
    assert "LLOG_CHROMIUM" in done.stderr
    assert not (machine.root / "built").exists()


def test_a_missing_chromium_is_installed_with_apt(machine: Machine) -> None:
    machine.everything_but("chromium")
    installs = machine.root / "installs"
    # apt-get installs by putting a chromium on PATH, as Debian's package does.
    chmod = shutil.which("chmod")
    machine.command("apt-get", f'[ "$1" = update ] && exit 0; echo "$@" >> {installs}; '
                               f'printf "#!/bin/sh\\nexit 0\\n" > {machine.bin}/chromium; '
                               f'{chmod} +x {machine.bin}/chromium')
    done = machine.run()
    assert done.returncode == 0, done.stderr
    assert installs.read_text().split()[-1:] == ["chromium"]
    assert (machine.root / "built").exists()


def test_llog_chromium_names_the_browser_and_nothing_is_installed(machine: Machine) -> None:
    machine.everything_but("chromium")
    own = machine.root / "own-chromium"
    machine.command("own-chromium", "exit 0", where=machine.root)
    machine.command("apt-get", "exit 100")  # would fail the run, were it called
    done = machine.run(LLOG_CHROMIUM=str(own))
    assert done.returncode == 0, done.stderr
    assert (machine.root / "built").exists()


def test_an_llog_chromium_that_is_not_there_is_named(machine: Machine) -> None:
    machine.everything_but()
    done = machine.run(LLOG_CHROMIUM=str(machine.root / "no-such-chromium"))
    assert done.returncode == 1
    assert "LLOG_CHROMIUM=" in done.stderr and "not an executable" in done.stderr
    assert not (machine.root / "built").exists()


def test_without_apt_a_missing_or_old_java_is_named(machine: Machine) -> None:
    machine.java(11)
    machine.command("haproxy", "exit 0")
    machine.command("nginx", "exit 0")
    done = machine.run()
    assert done.returncode == 1
    assert "Java 17+" in done.stderr


def test_the_dev_stack_needs_no_java_nor_proxies(machine: Machine) -> None:
    done = machine.run("dev")
    assert done.returncode == 0, done.stderr
    assert not (machine.root / "built").exists()  # `llog dev` builds what it runs


def test_no_go_is_named(machine: Machine) -> None:
    (machine.bin / "go").unlink()
    done = machine.run("dev")
    assert done.returncode == 1
    assert "install Go" in done.stderr
