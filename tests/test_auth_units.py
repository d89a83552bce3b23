"""Access control's pure parts: key hashing, the auth file, ACL patterns, token buckets,
metric labels, the settings that switch it on, the RFC 6750 challenge, `llog auth`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import anyio
import jwt
import pytest

from app.auth.apikeys import KeyRing, StoredKey, key_id_of, mint
from app.auth.authfile import AuthFileError, load, parse
from app.auth.jwks import JwksError
from app.auth.jwts import JwtVerifier
from app.auth.metrics import OTHER, PrincipalLabels
from app.auth.quotas import Quota, QuotaBook, TokenBucket
from app.auth.rights import Acl, Names, Right
from app.cli import main
from app.errors import Forbidden, QuotaExceeded, Unauthenticated, Unavailable
from app.localstack.processes import free_port
from app.routes.errors import error_response
from app.settings import Settings, SettingsError
from tests.helpers.auth import AUDIENCE, ISSUER, Issuer, jwks


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- API keys ----------------------------------------------------------------------------


def test_a_minted_key_verifies_and_nothing_else_does() -> None:
    token, stored = mint()
    ring = KeyRing([("alice", stored)])
    assert ring.principal(token) == "alice"
    assert StoredKey.parse(str(stored)) == stored
    assert key_id_of(token) == stored.key_id and stored.key_id in token
    other, _ = mint()
    tampered = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert ring.principal(tampered) is None
    assert ring.principal(other) is None
    assert ring.principal("llog_short") is None
    assert ring.principal(token + "x") is None
    assert token not in str(stored)  # only the digest is kept


def test_key_ids_are_unique_within_a_ring() -> None:
    _, stored = mint()
    with pytest.raises(ValueError, match="appears twice"):
        KeyRing([("a", stored), ("b", stored)])
    with pytest.raises(ValueError, match="sha256:"):
        StoredKey.parse("md5:abc")


# -- the auth file -----------------------------------------------------------------------


def test_the_auth_file_gives_rights_and_quotas_with_defaults() -> None:
    _, stored = mint()
    config = parse(f"""
[default]
consume = ["pub-*"]
quota = {{ requests_per_s = 5 }}

[principals.alice]
keys = ["{stored}"]
produce = ["orders", "logs.*"]
group = ["billing-*"]

[principals.bob]
admin = ["*"]
quota = {{ produce_bytes_per_s = 1024, burst_s = 2 }}
""")
    alice, bob, anyone = config.entry("alice"), config.entry("bob"), config.entry("carol")
    assert alice.acl.allows(Right.PRODUCE, "orders")
    assert alice.acl.allows(Right.PRODUCE, "logs.app")
    assert not alice.acl.allows(Right.PRODUCE, "logs")
    assert not alice.acl.allows(Right.CONSUME, "orders")
    assert alice.acl.allows(Right.GROUP, "billing-eu")
    assert alice.quota == Quota(requests_per_s=5)  # the default's
    assert bob.acl.allows(Right.ADMIN, "anything") and bob.acl.sees_topic("anything")
    assert bob.quota == Quota(produce_bytes_per_s=1024, burst_s=2.0)
    assert anyone.acl.allows(Right.CONSUME, "pub-1") and not anyone.acl.sees_topic("orders")
    assert config.keys.principal("llog_x") is None and len(config.keys) == 1


@pytest.mark.parametrize(("text", "where"), [
    ("[principals.a]\nproduce = ['a*b']\n", "principals.a.produce.0"),
    ("[principals.a]\nprodcue = ['a']\n", "principals.a.prodcue"),
    ("[principals.a]\nkeys = ['sha256:zz']\n", "principals.a.keys.0"),
    ("[principals.a]\nquota = { requests_per_s = 0 }\n", "requests_per_s"),
    ("[principals.a]\nquota = { requests_per_s = '5' }\n", "requests_per_s"),
    ("[principals.'a b']\n", "principals.a b"),
    ("[principals.a\n", "not valid TOML"),
])
def test_a_broken_auth_file_is_refused_whole(text: str, where: str) -> None:
    with pytest.raises(AuthFileError, match=where.replace(".", r"\.")):
        parse(text)


def test_acl_names_exact_and_by_prefix() -> None:
    names = Names.of(["orders", "logs.*"])
    assert "orders" in names and "logs." in names and "logs.x" in names
    assert "orders2" not in names and "log" not in names
    assert "*x" not in Names.of(["x"]) and "anything" in Names.of(["*"])
    acl = Acl.of({Right.CONSUME: ["a", "b*"]})
    assert acl.denied(Right.CONSUME, ["a", "b1", "c", "c", "d"]) == ["c", "d"]
    assert acl.denied(Right.PRODUCE, ["a"]) == ["a"]


# -- quotas ------------------------------------------------------------------------------


def test_a_bucket_grants_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, capacity=4.0, now=0.0)
    assert [bucket.take(1, 0.0) for _ in range(4)] == [0.0] * 4
    assert bucket.take(1, 0.0) == pytest.approx(0.5)
    assert bucket.take(1, 0.5) == 0.0


def test_a_cost_larger_than_the_bucket_passes_once_then_the_debt_is_paid() -> None:
    bucket = TokenBucket(rate=10.0, capacity=10.0, now=0.0)
    assert bucket.take(100, 0.0) == 0.0  # the bucket was full
    assert bucket.take(1, 0.0) == pytest.approx(9.1)  # 90 of debt, then 1
    assert bucket.take(100, 9.0) > 0 and bucket.take(100, 10.0) == 0.0


def test_quotas_refuse_with_retry_after_and_follow_a_changed_quota() -> None:
    clock = Clock()
    book = QuotaBook(max_principals=10, clock=clock)
    slow = Quota(requests_per_s=0.5)
    book.charge_request("a", slow)
    with pytest.raises(QuotaExceeded) as refused:
        book.charge_request("a", slow)
    assert refused.value.retry_after_s == 2 and refused.value.http_status == 429
    book.charge_request("b", slow)  # its own bucket
    book.charge_request("a", Quota(requests_per_s=100))  # a new quota: a new bucket
    book.charge_request("a", None)
    book.charge_bytes("a", Quota(requests_per_s=1), 10**9)  # no bytes limit
    clock.now += 2
    book.charge_request("a", slow)


def test_quota_buckets_are_bounded() -> None:
    clock = Clock()
    book = QuotaBook(max_principals=2, clock=clock)
    quota = Quota(produce_bytes_per_s=10)
    for name in ("a", "b", "c"):
        book.charge_bytes(name, quota, 10)
    assert len(book._buckets) == 2
    book.charge_bytes("a", quota, 10)  # forgotten, so it starts full again
    with pytest.raises(QuotaExceeded, match="produce-bytes"):
        book.charge_bytes("c", quota, 10)


# -- metric labels -----------------------------------------------------------------------


def test_unlisted_principals_beyond_the_limit_share_other() -> None:
    labels = PrincipalLabels(max_unlisted=2)
    assert labels.label("listed", listed=True) == "listed"
    assert [labels.label(p, listed=False) for p in ("j1", "j2", "j3", "j1")] == [
        "j1", "j2", OTHER, "j1"]
    assert labels.label("other", listed=False) == OTHER


# -- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "message"), [
    ({"auth": "on"}, "LLOG_AUTH_FILE"),
    ({"auth_jwt_algorithms": "RS256,HS256"}, "'HS256' is not allowed"),
    ({"auth_jwt_algorithms": "none"}, "'none' is not allowed"),
    ({"auth": "on", "auth_file": "a.toml", "auth_jwks_url": "https://i/jwks"},
     "LLOG_AUTH_JWT_ISSUER"),
    ({"auth": "on", "auth_file": "a", "auth_jwks_url": "https://i", "auth_jwks_file": "j"},
     "one of"),
    ({"auth_jwks_url": "ftp://x"}, "https://"),
    ({"oxia_tls_ca_file": "ca.pem"}, "LLOG_OXIA_TLS=true"),
    ({"ssl_certfile": "c.pem"}, "LLOG_SSL_KEYFILE"),
    ({"ssl_client_cert": "required"}, "LLOG_SSL_CA_CERTS"),
])
def test_security_settings_are_checked(values: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(**values)


def test_auth_is_off_by_default() -> None:
    s = Settings.from_env()
    assert not s.auth_enabled and not s.jwt_enabled and s.cors_allow_origins == ()
    assert Settings.from_env(cors_allow_origins="https://a, https://b").cors_allow_origins == (
        "https://a", "https://b")


# -- the challenge -----------------------------------------------------------------------


def test_refusals_carry_rfc_6750_challenges() -> None:
    r = error_response(Unauthenticated('bad "token"\\ here'))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == (
        'Bearer realm="llog", error="invalid_token", error_description="bad ?token?? here"')
    assert error_response(Unauthenticated("none", code=None)).headers[
        "www-authenticate"] == 'Bearer realm="llog"'
    forbidden = error_response(Forbidden("no"))
    assert forbidden.status_code == 403 and 'error="insufficient_scope"' in forbidden.headers[
        "www-authenticate"]
    quota = error_response(QuotaExceeded("slow down", retry_after_s=7))
    assert quota.status_code == 429 and quota.headers["retry-after"] == "7"
    assert "www-authenticate" not in quota.headers


# -- llog auth ---------------------------------------------------------------------------


def test_new_key_prints_the_key_and_an_entry_that_verifies_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["auth", "new-key", "svc.orders"]) == 0
    out, err = capsys.readouterr()
    token = out.strip()
    entry = "\n".join(line for line in err.splitlines() if not line.startswith("#"))
    assert tomllib.loads(entry)["principals"]["svc.orders"]["keys"]
    assert parse(entry).keys.principal(token) == "svc.orders"


def test_auth_check_reports_a_broken_file(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "auth.toml"
    path.write_text("[principals.a]\nadmin = ['*']\n")
    assert main(["auth", "check", str(path)]) == 0
    assert "1 principals, 0 API keys" in capsys.readouterr().out
    path.write_text("[principals.a]\nadmin = '*'\n")
    assert main(["auth", "check", str(path)]) == 1
    assert "principals.a.admin" in capsys.readouterr().err


# -- JWT verification (a key set from a file; no servers) ---------------------------------


def _verifier(tmp_path: Path, doc: object, **overrides: object) -> JwtVerifier:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(doc))
    values: dict[str, object] = {"auth": "on", "auth_file": tmp_path / "auth.toml",
                                 "auth_jwks_file": path, "auth_jwt_issuer": ISSUER,
                                 "auth_jwt_audience": AUDIENCE, "auth_jwks_min_refresh_s": 0}
    values.update(overrides)
    return JwtVerifier(Settings.from_env(**values))


async def test_a_token_without_key_id_needs_a_single_key(tmp_path: Path) -> None:
    issuer, other = Issuer(), Issuer()
    no_kid = {**issuer.jwk()}
    del no_kid["kid"]
    token = jwt.encode({"sub": "a", "iss": ISSUER, "aud": AUDIENCE, "exp": 4_000_000_000},
                       issuer.private, algorithm="RS256")
    verifier = _verifier(tmp_path, {"keys": [no_kid]})
    await verifier.refresh()
    assert await verifier.principal(token) == "a"
    verifier = _verifier(tmp_path, jwks(issuer, other))
    await verifier.refresh()
    with pytest.raises(Unauthenticated, match="a key the issuer does not publish"):
        await verifier.principal(token)


async def test_an_exp_written_as_a_string_is_read_as_the_decoder_reads_it(
        tmp_path: Path) -> None:
    """PyJWT accepts ``"exp": "4000000000"`` (it checks ``int(exp)``): the expiry the
    broker keeps for streams is read the same way, never an error that becomes a 500."""
    issuer = Issuer()
    verifier = _verifier(tmp_path, jwks(issuer))
    await verifier.refresh()
    token = jwt.encode({"sub": "a", "iss": ISSUER, "aud": AUDIENCE, "exp": "4000000000"},
                       issuer.private, algorithm="RS256", headers={"kid": issuer.kid})
    principal, until = await verifier.verify(token)
    assert principal == "a" and until >= 4_000_000_000


async def test_symmetric_keys_and_other_algorithms_are_not_kept(tmp_path: Path) -> None:
    issuer = Issuer()
    secret = {"kty": "oct", "k": "c2VjcmV0", "kid": "s", "alg": "HS256"}
    verifier = _verifier(tmp_path, {"keys": [secret]})
    with pytest.raises(JwksError, match="no signing key"):
        await verifier.refresh()
    verifier = _verifier(tmp_path, jwks(issuer), auth_jwt_algorithms="ES256")
    with pytest.raises(JwksError, match="ES256"):
        await verifier.refresh()


async def test_unloadable_keys_answer_503_not_401(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path, {"keys": []}, auth_jwks_file=None,
                         auth_jwks_url=f"http://127.0.0.1:{free_port()}/jwks.json",
                         auth_jwks_timeout_s=2)
    with anyio.fail_after(10), pytest.raises(Unavailable, match="could not be loaded"):
        await verifier.principal(Issuer().token("alice"))


async def test_the_principal_claim_is_configurable(tmp_path: Path) -> None:
    issuer = Issuer()
    verifier = _verifier(tmp_path, jwks(issuer), auth_jwt_principal_claim="client_id")
    await verifier.refresh()
    assert await verifier.principal(issuer.token("x", client_id="svc-7")) == "svc-7"
    with pytest.raises(Unauthenticated, match="lacks the client_id claim"):
        await verifier.principal(issuer.token("x"))


def test_an_auth_file_over_its_size_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    path.write_text("[principals.a]\nadmin = ['*']\n" + "# padding\n" * 200)
    assert load(path, 1 << 20).entry("a").acl.allows(Right.ADMIN, "x")
    with pytest.raises(AuthFileError, match="larger than 1024 bytes"):
        load(path, 1024)
