"""``GET /whoami`` through the real app: with access control off every right on
everything; with it on, the principal a token names, how it proved itself, and exactly
the patterns its auth-file entry grants (an unnamed JWT subject: the default's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.auth.rights import Names
from app.clock import wall_ms
from app.localstack.stack import LocalStack
from app.routes.whoami import patterns
from tests.helpers.asgi import in_process_broker
from tests.helpers.auth import AUDIENCE, ISSUER, Issuer, Keys, bearer, jwks

EVERYTHING = {"produce": ["*"], "consume": ["*"], "group": ["*"], "admin": ["*"]}


def test_patterns_are_written_as_the_auth_file_writes_them() -> None:
    names = Names.of(["orders", "logs.*", "*", "audit", "logs.*"])
    assert patterns(names) == ["audit", "orders", "*", "logs.*"]
    assert patterns(Names()) == []


async def test_with_access_control_off_the_caller_may_do_everything(
        stack: LocalStack) -> None:
    async with in_process_broker(stack) as http:
        r = await http.get("/whoami")
        assert r.status_code == 200, r.text
        assert r.json() == {"auth": False, "principal": None, "method": None,
                            "expires_at_ms": None, "rights": EVERYTHING}
        assert r.headers["cache-control"] == "no-store"
        # A token is ignored with access control off, as by every route.
        assert (await http.get("/whoami", headers=bearer("llog_whatever"))).json() == r.json()


@pytest.fixture
def auth_file(tmp_path: Path) -> tuple[Path, Keys]:
    keys = Keys()
    keys.new("orders-service")
    keys.new("nothing")
    e = keys.entries
    path = tmp_path / "auth.toml"
    path.write_text(f"""
[default]
consume = ["public.*"]

[principals.orders-service]
keys = ["{e['orders-service']}"]
produce = ["orders", "orders-retry.*"]
consume = ["orders", "*"]
group = ["billing-*"]

[principals.nothing]
keys = ["{e['nothing']}"]
""")
    return path, keys


async def test_an_api_key_principal_gets_exactly_its_grants(
        stack: LocalStack, auth_file: tuple[Path, Keys]) -> None:
    path, keys = auth_file
    async with in_process_broker(stack, auth="on", auth_file=path) as http:
        r = await http.get("/whoami", headers=bearer(keys.tokens["orders-service"]))
        assert r.status_code == 200, r.text
        assert r.json() == {
            "auth": True, "principal": "orders-service", "method": "api-key",
            "expires_at_ms": None, "rights": {
                "produce": ["orders", "orders-retry.*"], "consume": ["orders", "*"],
                "group": ["billing-*"], "admin": []}}
        assert r.headers["cache-control"] == "no-store"
        # Named in the file without rights: none, not the default's.
        r = await http.get("/whoami", headers=bearer(keys.tokens["nothing"]))
        assert r.json()["rights"] == {"produce": [], "consume": [], "group": [], "admin": []}


async def test_without_a_valid_token_the_answer_is_401(
        stack: LocalStack, auth_file: tuple[Path, Keys]) -> None:
    path, _ = auth_file
    async with in_process_broker(stack, auth="on", auth_file=path) as http:
        for headers in ({}, bearer("llog_not-a-key-of-this-file")):
            r = await http.get("/whoami", headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error_type"] == "Unauthenticated"
            assert r.headers["www-authenticate"].startswith('Bearer realm="llog"')


async def test_a_jwt_principal_has_its_method_expiry_and_the_default_rights(
        stack: LocalStack, auth_file: tuple[Path, Keys], tmp_path: Path) -> None:
    path, _ = auth_file
    issuer = Issuer()
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(jwks(issuer)))
    exp_s = wall_ms() // 1000 + 300
    async with in_process_broker(
            stack, auth="on", auth_file=path, auth_jwks_file=jwks_file,
            auth_jwt_issuer=ISSUER, auth_jwt_audience=AUDIENCE, auth_jwt_leeway_s=5) as http:
        r = await http.get("/whoami", headers=bearer(issuer.token("alice", exp=exp_s)))
        assert r.status_code == 200, r.text
        # The broker accepts the token until its exp plus the leeway.
        assert r.json() == {"auth": True, "principal": "alice", "method": "jwt",
                            "expires_at_ms": (exp_s + 5) * 1000, "rights": {
                                "produce": [], "consume": ["public.*"], "group": [],
                                "admin": []}}
        # A subject the file names gets that entry's rights.
        r = await http.get("/whoami", headers=bearer(issuer.token("orders-service")))
        assert r.json()["method"] == "jwt"
        assert r.json()["rights"]["produce"] == ["orders", "orders-retry.*"]
