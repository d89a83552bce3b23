"""What each command builds: the local stack only its two servers, `llog servers build`
what it is asked for.

Nothing is built here: the one function that builds a binary
(``binaries.ensure_binary``) is replaced by a recorder, and the real code of the stack
and of the command line runs around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import cli
from app.localstack import binaries
from app.localstack.stack import LocalStack, StackConfig


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The names of the modules asked for, in order; each "binary" is a path under
    ``tmp_path`` named after its module."""
    asked: list[str] = []

    def record(module: binaries.ServerModule, *, log: bool = True) -> Path:
        asked.append(module.name)
        return tmp_path / "bin" / module.name

    monkeypatch.setattr(binaries, "ensure_binary", record)
    return asked


def test_the_local_stack_builds_only_oxia_and_minio(
        built: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `llog dev` and the tests' session stack start through LocalStack.start: the
    # servers it runs are replaced by recorders of the binary each was given.
    stack = LocalStack(StackConfig(data_dir=tmp_path / "data"))
    started: dict[str, Path] = {}
    monkeypatch.setattr(stack, "_start_oxia", lambda path: started.setdefault("oxia", path))
    monkeypatch.setattr(stack, "_start_minio",
                        lambda path: started.setdefault("minio", path))
    monkeypatch.setattr(stack, "create_bucket", lambda: None)
    stack.start()
    assert sorted(built) == ["minio", "oxia"]  # each once; no Caddy, no tools
    # Each server runs the binary built for it.
    assert started == {"oxia": tmp_path / "bin" / "oxia", "minio": tmp_path / "bin" / "minio"}


def test_servers_build_builds_the_names_it_is_given_in_order(
        built: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["servers", "build", "minio", "caddy"]) == 0
    assert built == ["minio", "caddy"]
    assert capsys.readouterr().out.splitlines() == [
        f"minio: {tmp_path / 'bin' / 'minio'}", f"caddy: {tmp_path / 'bin' / 'caddy'}"]
    assert cli.main(["servers", "build", "--quiet", "promtool"]) == 0
    assert built[2:] == ["promtool"]
    assert capsys.readouterr().out == ""


def test_servers_build_without_names_builds_every_server_and_tool(built: list[str]) -> None:
    assert cli.main(["servers", "build", "--quiet"]) == 0
    assert built == ["oxia", "minio", "caddy", "promtool", "oapi-codegen"]


def test_an_unknown_name_builds_nothing_and_says_what_is_known(
        built: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["servers", "build", "kafka", "oxia"]) == 1
    assert built == []  # not even the known one: the command line is wrong as a whole
    err = capsys.readouterr().err
    assert err == ("llog servers build: no such server or tool: kafka "
                   "(known: oxia, minio, caddy, promtool, oapi-codegen)\n")


def test_a_failed_build_is_a_message_and_exit_code_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def fail(module: binaries.ServerModule, *, log: bool = True) -> Path:
        raise binaries.BuildError(f"building {module.name} failed: no network")

    monkeypatch.setattr(binaries, "ensure_binary", fail)
    assert cli.main(["servers", "build", "minio"]) == 1
    assert capsys.readouterr().err == "llog servers build: building minio failed: no network\n"
