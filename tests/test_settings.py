"""Pure unit tests of the ``LLOG_*`` configuration (app/settings.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.settings import ALL_ROLES, Settings, SettingsError


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LLOG_* variable of the surrounding environment leaks into a test."""
    for name in list(os.environ):
        if name.upper().startswith("LLOG_"):
            monkeypatch.delenv(name)


# -- defaults ---------------------------------------------------------------------------


def test_defaults() -> None:
    s = Settings.from_env()
    assert s.oxia_address == "127.0.0.1:6648"
    assert s.oxia_namespace == "default"
    assert s.s3_bucket == "leaderless-log-wal"
    assert s.s3_endpoint == "http://127.0.0.1:9000"
    assert s.root_prefix == "llog"
    assert s.roles == ("write", "read", "compact") == ALL_ROLES
    assert all(s.has_role(r) for r in ALL_ROLES)
    assert s.port == 8080
    assert s.batch_max_delay_ms == 5
    assert s.batch_max_bytes == 4 * 1024 * 1024
    assert s.tail_cache_dir is None
    assert s.s3_access_key is None
    assert s.broker_id.startswith("broker-")


def test_settings_are_frozen() -> None:
    s = Settings.from_env()
    with pytest.raises(ValueError):
        s.port = 1


# -- environment parsing ----------------------------------------------------------------


def test_env_roles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_ROLES", "read,write")
    s = Settings.from_env()
    assert s.roles == ("read", "write")
    assert s.has_role("read")
    assert not s.has_role("compact")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("compact", ("compact",)),
        (" read , write ", ("read", "write")),
        ("read,read,write,read", ("read", "write")),
        ("write,,read,", ("write", "read")),
        ("compact,read,write", ("compact", "read", "write")),
    ],
)
def test_env_roles_variants(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.setenv("LLOG_ROLES", value)
    assert Settings.from_env().roles == expected


def test_env_numbers_and_strings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLOG_BATCH_MAX_DELAY_MS", "25")
    monkeypatch.setenv("LLOG_BATCH_MAX_BYTES", "1024")
    monkeypatch.setenv("LLOG_OXIA_ADDRESS", "oxia.internal:6648")
    monkeypatch.setenv("LLOG_S3_BUCKET", "my.bucket-1")
    monkeypatch.setenv("LLOG_S3_ENDPOINT", "https://s3.example.com/")
    monkeypatch.setenv("LLOG_ROOT_PREFIX", "env/prod")
    monkeypatch.setenv("LLOG_OXIA_REQUEST_TIMEOUT_S", "2.5")
    monkeypatch.setenv("LLOG_TAIL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LLOG_BROKER_ID", "b1")
    s = Settings.from_env()
    assert s.batch_max_delay_ms == 25
    assert s.batch_max_bytes == 1024
    assert s.oxia_address == "oxia.internal:6648"
    assert s.s3_bucket == "my.bucket-1"
    assert s.s3_endpoint == "https://s3.example.com"  # trailing '/' dropped
    assert s.root_prefix == "env/prod"
    assert s.oxia_request_timeout_s == 2.5
    assert s.tail_cache_dir == tmp_path
    assert s.broker_id == "b1"


def test_env_empty_endpoint_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_S3_ENDPOINT", "")
    assert Settings.from_env().s3_endpoint is None


def test_env_ipv6_oxia_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_OXIA_ADDRESS", "[::1]:6648")
    assert Settings.from_env().oxia_address == "[::1]:6648"


def test_overrides_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_PORT", "9000")
    assert Settings.from_env().port == 9000
    assert Settings.from_env(port=9100).port == 9100


def test_unrelated_env_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_NOT_A_SETTING", "whatever")
    monkeypatch.setenv("PORT", "1")
    assert Settings.from_env().port == 8080


# -- invalid values ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLOG_OXIA_ADDRESS", "localhost"),
        ("LLOG_OXIA_ADDRESS", "127.0.0.1:"),
        ("LLOG_OXIA_ADDRESS", "host:123456"),
        ("LLOG_OXIA_ADDRESS", "http://127.0.0.1:6648"),
        ("LLOG_OXIA_ADDRESS", "a b:6648"),
        ("LLOG_S3_BUCKET", "Bad_Bucket"),
        ("LLOG_S3_BUCKET", "ab"),
        ("LLOG_S3_BUCKET", "-bucket"),
        ("LLOG_S3_BUCKET", "bucket-"),
        ("LLOG_S3_BUCKET", "b" * 64),
        ("LLOG_ROLES", "bogus"),
        ("LLOG_ROLES", "read,bogus"),
        ("LLOG_ROLES", ""),
        ("LLOG_ROLES", " , "),
        ("LLOG_BATCH_MAX_BYTES", "-1"),
        ("LLOG_BATCH_MAX_BYTES", "0"),
        ("LLOG_BATCH_MAX_BYTES", "lots"),
        ("LLOG_BATCH_MAX_DELAY_MS", "-5"),
        ("LLOG_BATCH_MAX_DELAY_MS", "60001"),
        ("LLOG_S3_ENDPOINT", "127.0.0.1:9000"),
        ("LLOG_S3_ENDPOINT", "s3.amazonaws.com"),
        ("LLOG_S3_ENDPOINT", "ftp://host"),
        ("LLOG_ROOT_PREFIX", "/llog"),
        ("LLOG_ROOT_PREFIX", "llog/"),
        ("LLOG_ROOT_PREFIX", "a//b"),
        ("LLOG_ROOT_PREFIX", ""),
        ("LLOG_ROOT_PREFIX", "ll og"),
        ("LLOG_PORT", "0"),
        ("LLOG_PORT", "65536"),
        ("LLOG_PORT", "http"),
        ("LLOG_OXIA_SESSION_TIMEOUT_MS", "1000"),
        ("LLOG_OXIA_REQUEST_TIMEOUT_S", "0"),
        ("LLOG_S3_MAX_ATTEMPTS", "0"),
        ("LLOG_MAX_REQUEST_BYTES", "10"),
    ],
)
def test_invalid_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def test_every_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_ROLES", "bogus")
    monkeypatch.setenv("LLOG_S3_BUCKET", "Bad_Bucket")
    monkeypatch.setenv("LLOG_ROOT_PREFIX", "/llog")
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    message = str(info.value)
    for name in ("LLOG_ROLES", "LLOG_S3_BUCKET", "LLOG_ROOT_PREFIX"):
        assert name in message
    assert "LLOG_OXIA_ADDRESS" not in message


def test_buffer_smaller_than_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_BATCH_MAX_BYTES", "2048")
    monkeypatch.setenv("LLOG_BATCH_BUFFER_MAX_BYTES", "1024")
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    assert "LLOG_BATCH_BUFFER_MAX_BYTES" in str(info.value)
    assert "LLOG_BATCH_MAX_BYTES" in str(info.value)


def test_forwarding_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.from_env()
    assert (s.forward_host, s.forward_port, s.forward_deadline_ms,
            s.forward_answer_timeout_ms, s.cluster_secret) == ("127.0.0.1", 0, 1000, 2000, None)
    monkeypatch.setenv("LLOG_FORWARD_HOST", "10.0.0.5")
    monkeypatch.setenv("LLOG_FORWARD_PORT", "39211")
    monkeypatch.setenv("LLOG_FORWARD_DEADLINE_MS", "50")
    monkeypatch.setenv("LLOG_FORWARD_ANSWER_TIMEOUT_MS", "500")
    monkeypatch.setenv("LLOG_CLUSTER_SECRET", "s" * 16)
    s = Settings.from_env()
    assert (s.forward_host, s.forward_port, s.forward_deadline_ms,
            s.forward_answer_timeout_ms) == ("10.0.0.5", 39211, 50, 500)
    assert s.cluster_secret is not None and s.cluster_secret.get_secret_value() == "s" * 16
    assert "s" * 16 not in repr(s)  # a secret never shows in logs
    _apply(monkeypatch, s.as_env())
    assert Settings.from_env() == s
    monkeypatch.setenv("LLOG_CLUSTER_SECRET", "")
    assert Settings.from_env().cluster_secret is None
    monkeypatch.setenv("LLOG_CLUSTER_SECRET", "too-short")
    with pytest.raises(SettingsError, match="LLOG_CLUSTER_SECRET"):
        Settings.from_env()
    monkeypatch.setenv("LLOG_CLUSTER_SECRET", "s" * 16)
    monkeypatch.setenv("LLOG_FORWARD_PORT", "65536")
    with pytest.raises(SettingsError, match="LLOG_FORWARD_PORT"):
        Settings.from_env()
    monkeypatch.setenv("LLOG_FORWARD_PORT", "39211")
    # An unanswered frame's fence is claimed within 5 minutes of sending, or never.
    monkeypatch.setenv("LLOG_FORWARD_DEADLINE_MS", "60000")
    monkeypatch.setenv("LLOG_FORWARD_ANSWER_TIMEOUT_MS", "180001")
    with pytest.raises(SettingsError, match="LLOG_FORWARD_ANSWER_TIMEOUT_MS"):
        Settings.from_env()
    monkeypatch.setenv("LLOG_FORWARD_ANSWER_TIMEOUT_MS", "180000")
    assert Settings.from_env().forward_answer_timeout_ms == 180000


def test_group_session_outside_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLOG_GROUP_MIN_SESSION_TIMEOUT_MS", "10000")
    monkeypatch.setenv("LLOG_GROUP_SESSION_TIMEOUT_MS", "5000")
    with pytest.raises(SettingsError, match="LLOG_GROUP_SESSION_TIMEOUT_MS"):
        Settings.from_env()
    monkeypatch.setenv("LLOG_GROUP_SESSION_TIMEOUT_MS", "20000")
    assert Settings.from_env().group_session_timeout_ms == 20000


def test_invalid_override_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="LLOG_OXIA_ADDRESS"):
        Settings.from_env(oxia_address="nope")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("LLOG_OXIA_ADDRESS", "127.0.0.1:6648\n"),
        ("LLOG_S3_BUCKET", "leaderless-log-wal\n"),
        ("LLOG_ROOT_PREFIX", "llog\n"),
    ],
)
def test_trailing_newline_is_rejected(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=name):
        Settings.from_env()


# -- as_env -----------------------------------------------------------------------------


def _apply(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        assert name.startswith("LLOG_")
        assert isinstance(value, str)
        monkeypatch.setenv(name, value)


def test_as_env_round_trip_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.from_env()
    env = s.as_env()
    assert env["LLOG_OXIA_ADDRESS"] == "127.0.0.1:6648"
    assert env["LLOG_ROLES"] == "write,read,compact"
    assert env["LLOG_TAIL_CACHE_DIR"] == ""  # unset travels as "", read back as None
    _apply(monkeypatch, env)
    assert Settings.from_env() == s


def test_as_env_round_trip_custom(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = Settings.from_env(
        oxia_address="oxia:6648",
        s3_endpoint="https://s3.example.com",
        s3_bucket="other-bucket",
        s3_access_key="ak",
        s3_secret_key="sk",
        root_prefix="env/test",
        broker_id="b-7",
        roles="compact,read",
        port=9001,
        batch_max_delay_ms=0,
        batch_max_bytes=1,
        oxia_request_timeout_s=0.25,
        tail_cache_dir=tmp_path,
    )
    env = s.as_env()
    assert env["LLOG_ROLES"] == "compact,read"
    assert env["LLOG_TAIL_CACHE_DIR"] == str(tmp_path)
    _apply(monkeypatch, env)
    again = Settings.from_env()
    assert again == s
    assert again.as_env() == env


def test_as_env_round_trip_without_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    s = Settings.from_env(s3_endpoint="")
    assert s.s3_endpoint is None
    _apply(monkeypatch, s.as_env())
    assert Settings.from_env().s3_endpoint is None


# -- cluster: membership ----------------------------------------------------------------


def test_affinity_is_off_and_the_advertised_url_is_the_listener_by_default() -> None:
    s = Settings.from_env()
    assert s.affinity == "off" and s.advertised_url is None
    assert s.membership_refresh_s == 2.0
    assert s.broker_url == "http://127.0.0.1:8080"
    assert Settings(host="::1", port=9000).broker_url == "http://[::1]:9000"


def test_affinity_and_advertised_url_from_the_environment(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("LLOG_AFFINITY", "forward")
    monkeypatch.setenv("LLOG_ADVERTISED_URL", "https://b1.example:8443/")
    monkeypatch.setenv("LLOG_MEMBERSHIP_REFRESH_S", "0.5")
    s = Settings.from_env()
    assert (s.affinity, s.broker_url, s.membership_refresh_s) == (
        "forward", "https://b1.example:8443", 0.5)
    monkeypatch.setenv("LLOG_ADVERTISED_URL", "")
    assert Settings.from_env().advertised_url is None


@pytest.mark.parametrize(("name", "value"), [("LLOG_AFFINITY", "leader"),
                                             ("LLOG_ADVERTISED_URL", "b1.example:8080"),
                                             ("LLOG_MEMBERSHIP_REFRESH_S", "0")])
def test_bad_cluster_settings_are_named(monkeypatch: pytest.MonkeyPatch, name: str,
                                        value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        Settings.from_env()
    assert name in str(info.value)
