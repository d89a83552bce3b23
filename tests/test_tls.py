"""TLS everywhere it is configured: `llog serve` over HTTPS (with client certificates),
and a broker whose Oxia and S3 speak only TLS, trusting a CA made by the test."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from app.errors import StorageUnavailable
from app.factory import create_app
from app.localstack.broker import broker_process
from app.localstack.processes import ManagedProcess, free_port, wait_until
from app.localstack.stack import LocalStack, StackConfig
from app.stores.metrics import StoreMetrics
from app.stores.s3.store import S3Store
from tests.helpers.auth import Keys, bearer, write_atomically
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import make_settings
from tests.helpers.tls import Certs, TlsStack


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_stack(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsStack]:
    config = StackConfig.ephemeral(tmp_path_factory.mktemp("tls-stack"))
    with TlsStack(config, certs=certs) as running:
        yield running


# -- Oxia and S3 over TLS ----------------------------------------------------------------


async def test_a_broker_on_oxia_and_s3_over_tls(tls_stack: TlsStack, topic: str) -> None:
    app = create_app(make_settings(tls_stack, **tls_stack.settings_overrides()))
    with anyio.fail_after(90):
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://broker") as http:
            r = await http.post("/produce", json=produce_body(topic, "over", "tls"))
            assert r.status_code == 200, r.text
            assert r.json()["results"][0]["wal_uri"].startswith("s3://")
            r = await http.post("/consume", json=consume_body(topic))
            records = r.json()["results"][0]["records"]
            assert [x["value"] for x in records] == ["over", "tls"]


async def test_s3_refuses_an_endpoint_it_cannot_verify(tls_stack: TlsStack) -> None:
    trusted = make_settings(tls_stack, s3_ca_bundle=tls_stack.settings_overrides()[
        "s3_ca_bundle"], s3_max_attempts=1)
    untrusted = make_settings(tls_stack, s3_max_attempts=1)
    with anyio.fail_after(60):
        async with S3Store(trusted, StoreMetrics()) as s3:
            await s3.put("tls-probe", b"x")
            assert await s3.get("tls-probe") == b"x"
        async with S3Store(untrusted, StoreMetrics()) as s3:
            with pytest.raises(StorageUnavailable, match="(?i)certificate"):
                await s3.get("tls-probe")


# -- llog serve over HTTPS ---------------------------------------------------------------


def _https_broker(stack: LocalStack, certs: Certs, auth_file: Path, logs: Path
                  ) -> tuple[ManagedProcess, str]:
    port = free_port()
    env = {**stack.settings_env(), "LLOG_BROKER_ID": f"tls-{port}", "LLOG_DRAIN_S": "0",
           "LLOG_OXIA_SESSION_TIMEOUT_MS": "3000",
           "LLOG_SSL_CERTFILE": str(certs.cert_file), "LLOG_SSL_KEYFILE": str(certs.key_file),
           "LLOG_SSL_CA_CERTS": str(certs.ca_file), "LLOG_SSL_CLIENT_CERT": "required",
           "LLOG_AUTH": "on", "LLOG_AUTH_FILE": str(auth_file),
           "LLOG_AUTH_RELOAD_INTERVAL_S": "3600"}  # only SIGHUP reloads in this test
    proc = broker_process(f"tls-{port}", port, env, logs / f"tls-{port}.log",
                          log_level="info")
    return proc, f"https://127.0.0.1:{port}"


def test_serve_over_https_with_client_certificates_and_sighup_reload(
        stack: LocalStack, certs: Certs, tmp_path: Path, topic: str) -> None:
    keys = Keys()
    old = keys.new("app")
    auth_file = tmp_path / "auth.toml"

    def write_auth() -> None:
        write_atomically(auth_file, f'[principals.app]\nkeys = ["{keys.entries["app"]}"]\n'
                                    f'produce = ["{topic}"]\n')

    write_auth()
    proc, url = _https_broker(stack, certs, auth_file, tmp_path)
    proc.start()
    try:
        with httpx.Client(base_url=url, verify=certs.context(client_cert=True),
                          timeout=30) as http:
            wait_until("broker over HTTPS", lambda: http.get("/health").status_code == 200,
                       timeout=60, process=proc, interval=0.2)
            r = http.post("/produce", json=produce_body(topic, "a"), headers=bearer(old))
            assert r.status_code == 200, r.text
            _refused_without_trust(url, certs)

            new = keys.new("app")  # rotate the key, then tell the broker
            write_auth()
            os.kill(proc.pid, signal.SIGHUP)
            deadline = time.monotonic() + 20
            while http.post("/produce", json=produce_body(topic, "b"),
                            headers=bearer(new)).status_code != 200:
                assert time.monotonic() < deadline, "SIGHUP did not reload the auth file"
                time.sleep(0.1)
            assert http.post("/produce", json=produce_body(topic, "c"),
                             headers=bearer(old)).status_code == 401
        assert proc.alive(), "SIGHUP must not stop the broker"
        assert "principal=app" in proc.log_path.read_text()
    finally:
        proc.stop()


def _refused_without_trust(url: str, certs: Certs) -> None:
    """A client that does not trust the CA, or brings no certificate, gets nowhere."""
    with pytest.raises(httpx.ConnectError, match="(?i)certificate"), httpx.Client(
            base_url=url, timeout=30) as untrusting:
        untrusting.get("/health")
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)), \
            httpx.Client(base_url=url, verify=certs.context(), timeout=30) as anonymous:
        anonymous.get("/health")
