"""What a broker shows to whoever reaches it: a broker on a public address with access
control off says so (a WARNING and ``llog_insecure_listener 1``) unless LLOG_AUTH=off was
set on purpose, and LLOG_METRICS_TOKEN keeps the metrics (which name topics and
principals) from anyone without it, on brokers and compactors alike."""

from __future__ import annotations

import logging
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.exposure import insecure_listener, is_loopback
from app.compactor_app import create_compactor_app
from app.factory import create_app
from app.localstack.broker import broker_process, wait_healthy
from app.localstack.processes import free_port
from app.localstack.stack import LocalStack
from app.settings import Settings, SettingsError
from tests.helpers.asgi import served
from tests.helpers.auth import Keys, bearer
from tests.helpers.stack import make_settings

TOKEN = "scrape-token-0123456789abcdef"
INSECURE = "llog_insecure_listener"


def gauge(text: str, name: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"{name} ")]
    return float(line.split()[1])


# -- the listener -------------------------------------------------------------------------

@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("10.0.0.7", False),
    ("broker.example.com", False)])
def test_only_loopback_addresses_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_auth_off_is_insecure_beyond_loopback_unless_chosen(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.delenv("LLOG_AUTH", raising=False)
    assert insecure_listener(Settings(host="0.0.0.0"))
    assert not insecure_listener(Settings(host="127.0.0.1"))
    assert not insecure_listener(Settings(host="0.0.0.0", auth="off"))
    assert not insecure_listener(Settings(host="0.0.0.0", auth="on",
                                          auth_file=tmp_path / "auth.toml"))
    monkeypatch.setenv("LLOG_AUTH", "off")  # chosen in the environment counts too
    assert not insecure_listener(Settings.from_env(host="0.0.0.0"))


def test_a_served_broker_on_every_address_without_auth_warns_and_exports_it(
        stack: LocalStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real command, `llog serve --host 0.0.0.0`, with LLOG_AUTH unset."""
    monkeypatch.delenv("LLOG_AUTH", raising=False)
    port = free_port()
    log = tmp_path / "broker.log"
    proc = broker_process("exposed", port, {**stack.settings_env(), "LLOG_DRAIN_S": "0"},
                          log, host="0.0.0.0")
    proc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        with urllib.request.urlopen(f"{url}/metrics/prometheus", timeout=30) as r:
            assert gauge(r.read().decode(), INSECURE) == 1
    finally:
        proc.stop()
    warnings = [ln for ln in log.read_text().splitlines() if "INSECURE" in ln]
    assert warnings and "WARNING" in warnings[0] and f"0.0.0.0:{port}" in warnings[0]


@pytest.mark.parametrize("case", ["auth off on purpose", "auth on", "loopback"])
async def test_no_warning_when_chosen_protected_or_local(
        stack: LocalStack, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        case: str) -> None:
    keys = Keys()
    auth_file = tmp_path / "auth.toml"
    token = keys.new("ops")
    auth_file.write_text(f'[principals.ops]\nkeys = ["{keys.entries["ops"]}"]\n')
    overrides: dict[str, Any] = {
        "auth off on purpose": {"host": "0.0.0.0", "auth": "off"},
        "auth on": {"host": "0.0.0.0", "auth": "on", "auth_file": auth_file},
        "loopback": {"host": "127.0.0.1"},
    }[case]
    with caplog.at_level(logging.WARNING, logger="app.auth.exposure"):
        app = create_app(make_settings(stack, **overrides))
        async with served(app) as client:
            r = await client.get("/metrics/prometheus", headers=bearer(token))
            assert r.status_code == 200
            assert gauge(r.text, INSECURE) == 0
    assert not [rec for rec in caplog.records if "INSECURE" in rec.getMessage()]


# -- the metrics token --------------------------------------------------------------------

def test_a_metrics_token_is_long_and_excludes_principal_authentication(
        tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="LLOG_METRICS_TOKEN"):
        Settings.from_env(metrics_token="short")
    with pytest.raises(SettingsError, match="LLOG_METRICS_TOKEN"):
        Settings.from_env(metrics_token=TOKEN, auth="on", auth_file=tmp_path / "a.toml",
                          auth_metrics="authenticated")
    assert TOKEN not in repr(Settings(metrics_token=TOKEN))


async def _only_with_the_token(client: httpx.AsyncClient, other: dict[str, str]) -> None:
    for path in ("/metrics", "/metrics/prometheus"):
        r = await client.get(path)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error_type"] == "Unauthenticated"
        assert r.headers["www-authenticate"].startswith("Bearer realm=")
        r = await client.get(path, headers=bearer(TOKEN[:-1] + "x"))
        assert r.status_code == 401 and "invalid_token" in r.headers["www-authenticate"]
        r = await client.get(path, headers=other)  # a principal's key is not the token
        assert r.status_code == 401, path
        r = await client.get(path, headers=bearer(TOKEN))
        assert r.status_code == 200, (path, r.text)
    assert (await client.get("/health")).status_code == 200  # probes need no token


@pytest.mark.parametrize("auth", ["off", "on"])
async def test_the_metrics_token_guards_the_broker_metrics(stack: LocalStack, tmp_path: Path,
                                                           auth: str) -> None:
    keys = Keys()
    key = keys.new("reader")
    auth_file = tmp_path / "auth.toml"
    auth_file.write_text(f'[principals.reader]\nkeys = ["{keys.entries["reader"]}"]\n'
                         'consume = ["*"]\n')
    app = create_app(make_settings(stack, auth=auth, auth_file=auth_file,
                                   metrics_token=TOKEN))
    spec = app.openapi()
    for path in ("/metrics", "/metrics/prometheus"):
        operation = spec["paths"][path]["get"]
        assert operation["security"] == [{"metricsToken": []}] and "401" in operation[
            "responses"]
    async with served(app) as client:
        await _only_with_the_token(client, bearer(key))


async def test_the_metrics_token_guards_the_compactor_metrics(stack: LocalStack) -> None:
    app = create_compactor_app(make_settings(stack, metrics_token=TOKEN))
    async with served(app) as client:
        await _only_with_the_token(client, bearer("llog_not-a-key"))


async def test_without_a_token_the_metrics_stay_open(stack: LocalStack) -> None:
    async with served(create_app(make_settings(stack))) as client:
        assert (await client.get("/metrics/prometheus")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
