"""Settings from a TOML file (LLOG_CONFIG_FILE, llog serve --config) under the LLOG_*
variables, and the warning about LLOG_* variables that name no setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.localstack.broker import wait_healthy
from app.localstack.processes import ManagedProcess, free_port
from app.localstack.stack import LocalStack
from app.settings import CONFIG_FILE_ENV, Settings, SettingsError


@pytest.fixture
def hermetic(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No LLOG_* variable of the surrounding environment leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("LLOG_"):
            monkeypatch.delenv(name)
    return monkeypatch


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llog.toml"
    path.write_text(text)
    return path


def test_the_file_sets_what_no_variable_sets(hermetic: pytest.MonkeyPatch, tmp_path: Path
                                             ) -> None:
    path = _file(tmp_path, 'batch_max_delay_ms = 9\nroles = ["read"]\nbroker_id = "file"\n'
                           'log_format = "json"\n')
    hermetic.setenv(CONFIG_FILE_ENV, str(path))
    s = Settings.from_env()
    assert (s.batch_max_delay_ms, s.roles, s.broker_id, s.log_format) == (
        9, ("read",), "file", "json")
    assert s.port == 8080  # neither: the default


def test_variables_win_over_the_file_and_arguments_over_both(
        hermetic: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = _file(tmp_path, "batch_max_delay_ms = 9\nport = 9001\n")
    hermetic.setenv(CONFIG_FILE_ENV, str(path))
    hermetic.setenv("LLOG_BATCH_MAX_DELAY_MS", "3")
    hermetic.setenv("LLOG_PORT", "9002")
    s = Settings.from_env(port=9003)
    assert (s.batch_max_delay_ms, s.port) == (3, 9003)


def test_a_bad_value_names_the_file_and_the_key(hermetic: pytest.MonkeyPatch, tmp_path: Path
                                                ) -> None:
    path = _file(tmp_path, 'batch_max_delay_ms = "soon"\nport = 1\n')
    hermetic.setenv(CONFIG_FILE_ENV, str(path))
    hermetic.setenv("LLOG_PORT", "0")
    with pytest.raises(SettingsError) as caught:
        Settings.from_env()
    message = str(caught.value)
    assert f"{path}: batch_max_delay_ms: Input should be a valid integer" in message
    # The bad port is the variable's, which wins over the file's good one.
    assert "LLOG_PORT: Input should be greater than or equal to 1" in message


@pytest.mark.parametrize(("text", "expected"), [
    ("batch_max_dealy_ms = 3\n", "batch_max_dealy_ms: not a setting; did you mean "
                                 "batch_max_delay_ms?"),
    ("zzz = 3\n", "zzz: not a setting"),
    ("port = \n", "not a valid TOML file"),
])
def test_a_bad_file_is_refused_naming_it(hermetic: pytest.MonkeyPatch, tmp_path: Path,
                                         text: str, expected: str) -> None:
    path = _file(tmp_path, text)
    hermetic.setenv(CONFIG_FILE_ENV, str(path))
    with pytest.raises(SettingsError, match=str(path)) as caught:
        Settings.from_env()
    assert expected in str(caught.value)


def test_a_missing_file_is_refused(hermetic: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hermetic.setenv(CONFIG_FILE_ENV, str(tmp_path / "nowhere.toml"))
    with pytest.raises(SettingsError, match="nowhere.toml: cannot read the configuration file"):
        Settings.from_env()


def test_unknown_variables_are_named_with_a_suggestion() -> None:
    environ = {"LLOG_BATCH_MAX_DELAY_MS": "5", "LLOG_BATCH_MAX_DELAY": "5",
               "llog_s3_secrte_key": "x", "LLOG_ZZZ": "1", "LLOG_CONFIG_FILE": "f",
               "LLOG_BIN_CACHE_DIR": "d", "LLOG_BROKER_URL": "u", "PATH": "/bin"}
    assert Settings.unknown_variables(environ) == [
        "LLOG_BATCH_MAX_DELAY is not a setting and is ignored; did you mean "
        "LLOG_BATCH_MAX_DELAY_MS?",
        "LLOG_ZZZ is not a setting and is ignored",
        "llog_s3_secrte_key is not a setting and is ignored; did you mean LLOG_S3_SECRET_KEY?",
    ]


def test_llog_serve_takes_a_config_file_and_warns_once_about_typos(
        stack: LocalStack, tmp_path: Path) -> None:
    port = free_port()
    path = _file(tmp_path, f'broker_id = "from-file"\nport = {port}\ndrain_s = 0\n')
    env = {**os.environ, **stack.settings_env(), "LLOG_DRAIN_TIME_S": "3"}
    proc = ManagedProcess("serve-config", [
        sys.executable, "-m", "app.cli", "serve", "--config", str(path), "--workers", "2",
        "--log-level", "info"], tmp_path / "serve.log", env=env)
    proc.start()
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()[
            "broker_id"] == "from-file"
    finally:
        proc.stop()
    log = (tmp_path / "serve.log").read_text()
    warning = "LLOG_DRAIN_TIME_S is not a setting and is ignored; did you mean LLOG_DRAIN_S?"
    assert log.count(warning) == 1, log


def test_a_bad_config_file_stops_llog_serve_with_its_name(tmp_path: Path) -> None:
    path = _file(tmp_path, 'batch_max_delay_ms = "soon"\n')
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("LLOG_")}
    run = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--config", str(path)],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2
    assert f"{path}: batch_max_delay_ms: Input should be a valid integer" in run.stderr
