"""Access control at the edge, in process on the real Oxia and MinIO: each refusal has
its status, error body and RFC 6750 challenge, and writes nothing (the partition's high
watermark is read back unchanged); keys reload without a restart; JWTs verify against a
key set from a file or a URL."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.auth.control import AccessControl
from app.factory import create_app
from app.localstack.stack import LocalStack
from tests.helpers.auth import AUDIENCE, ISSUER, Issuer, JwksServer, Keys, bearer, jwks
from tests.helpers.auth import write_atomically as write
from tests.helpers.bodies import produce_body
from tests.helpers.stack import make_settings


@contextlib.asynccontextmanager
async def auth_app(stack: LocalStack, auth_file: Path, **overrides: Any
                   ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(make_settings(stack, auth="on", auth_file=auth_file, **overrides))
    with anyio.fail_after(60):
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://broker",
                timeout=30) as client:
            yield app, client


def control(app: FastAPI) -> AccessControl:
    found: AccessControl = app.state.auth
    return found


def auth_text(keys: Keys, topic: str) -> str:
    k = keys.entries
    return f"""
[default]
consume = ["pub-*"]

[principals.writer]
keys = ["{k['writer']}"]
produce = ["{topic}"]
consume = ["{topic}"]
admin = ["{topic}"]
group = ["billing-*"]

[principals.reader]
keys = ["{k['reader']}"]
consume = ["{topic}"]

[principals.chatty]
keys = ["{k['chatty']}"]
produce = ["{topic}"]
quota = {{ requests_per_s = 0.01, burst_s = 100 }}

[principals.bulky]
keys = ["{k['bulky']}"]
produce = ["{topic}"]
quota = {{ produce_bytes_per_s = 10 }}

[principals.outsider]
keys = ["{k['outsider']}"]
consume = ["pub-*"]

[principals.jwt-writer]
produce = ["{topic}"]
consume = ["{topic}"]
"""


@pytest.fixture
def keys() -> Keys:
    out = Keys()
    for name in ("writer", "reader", "chatty", "bulky", "outsider"):
        out.new(name)
    return out


@pytest.fixture
def auth_file(tmp_path: Path, keys: Keys, topic: str) -> Path:
    path = tmp_path / "auth.toml"
    write(path, auth_text(keys, topic))
    return path


async def high_watermark(http: httpx.AsyncClient, token: str, topic: str) -> int:
    r = await http.post("/offsets", json={"topic_partitions": [
        {"topic": topic, "partition": 0}]}, headers=bearer(token))
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert result["ok"], result
    return int(result["high_watermark"])


def assert_refused(r: httpx.Response, status: int, error_type: str,
                   challenge: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.json()["error_type"] == error_type, r.json()
    if challenge is not None:
        assert r.headers["www-authenticate"].startswith('Bearer realm="llog"'), r.headers
        assert challenge in r.headers["www-authenticate"], r.headers["www-authenticate"]


# -- API keys, rights, quotas ------------------------------------------------------------


async def test_refusals_write_nothing(stack: LocalStack, auth_file: Path, keys: Keys,
                                      topic: str) -> None:
    t = keys.tokens
    async with auth_app(stack, auth_file) as (_, http):
        r = await http.post("/produce", json=produce_body(topic, "first"),
                            headers=bearer(t["writer"]))
        assert r.status_code == 200, r.text

        r = await http.post("/produce", json=produce_body(topic, "x"))
        assert_refused(r, 401, "Unauthenticated")
        assert r.headers["www-authenticate"] == 'Bearer realm="llog"'
        r = await http.post("/produce", json=produce_body(topic, "x"),
                            headers={"authorization": "Basic d3JpdGVyOng="})
        assert_refused(r, 401, "Unauthenticated")
        forged = t["writer"][:-4] + ("AAAA" if not t["writer"].endswith("AAAA") else "BBBB")
        r = await http.post("/produce", json=produce_body(topic, "x"), headers=bearer(forged))
        assert_refused(r, 401, "Unauthenticated", 'error="invalid_token"')
        r = await http.post("/produce", json=produce_body(topic, "x"),
                            headers=bearer(t["reader"]))
        assert_refused(r, 403, "Forbidden", 'error="insufficient_scope"')
        assert "reader may not produce on topic " + topic in r.json()["error"]
        # One topic of the request not allowed: the whole request is refused.
        both = {"topic_partitions": [*produce_body(topic, "x")["topic_partitions"],
                                     *produce_body("other-topic", "y")["topic_partitions"]]}
        r = await http.post("/produce", json=both, headers=bearer(t["writer"]))
        assert_refused(r, 403, "Forbidden")
        assert "other-topic" in r.json()["error"]

        assert await high_watermark(http, t["writer"], topic) == 1


async def test_consume_offsets_and_topics_need_their_rights(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    t = keys.tokens
    async with auth_app(stack, auth_file) as (_, http):
        fetch = {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1}],
                 "max_wait_ms": 0}
        assert (await http.post("/consume", json=fetch, headers=bearer(t["reader"]))
                ).status_code == 200
        assert_refused(await http.post("/consume", json=fetch, headers=bearer(t["chatty"])),
                       403, "Forbidden")
        r = await http.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0}]}, headers=bearer(t["bulky"]))
        assert_refused(r, 403, "Forbidden")

        created = {"topic": topic, "partitions": 2}
        assert_refused(await http.post("/topics", json=created, headers=bearer(t["reader"])),
                       403, "Forbidden")
        r = await http.post("/topics", json=created, headers=bearer(t["writer"]))
        assert r.status_code == 201, r.text
        assert_refused(await http.patch(f"/topics/{topic}", json={"partitions": 3},
                                        headers=bearer(t["reader"])), 403, "Forbidden")
        assert_refused(await http.delete(f"/topics/{topic}", headers=bearer(t["reader"])),
                       403, "Forbidden")
        r = await http.get(f"/topics/{topic}", headers=bearer(t["reader"]))
        assert r.status_code == 200 and r.json()["partitions"] == 2, r.text
        assert_refused(await http.get(f"/topics/{topic}", headers=bearer(t["outsider"])),
                       403, "Forbidden")
        # A well-formed key that the file does not hold.
        assert_refused(await http.get(f"/topics/{topic}", headers=bearer(keys.new("nobody"))),
                       401, "Unauthenticated")
        listed = (await http.get("/topics", headers=bearer(t["reader"]))).json()["topics"]
        assert [x["topic"] for x in listed] == [topic]
        assert (await http.get("/topics", headers=bearer(t["outsider"]))).json() == {
            "topics": []}


async def test_request_quota_answers_429_with_retry_after(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    token = keys.tokens["chatty"]
    async with auth_app(stack, auth_file) as (app, http):
        r = await http.post("/produce", json=produce_body(topic, "one"), headers=bearer(token))
        assert r.status_code == 200, r.text
        r = await http.post("/produce", json=produce_body(topic, "two"), headers=bearer(token))
        assert_refused(r, 429, "QuotaExceeded")
        assert 1 <= int(r.headers["retry-after"]) <= 100, r.headers
        # Another principal is not held back by chatty's quota.
        assert await high_watermark(http, keys.tokens["writer"], topic) == 1
        metrics = (await http.get("/metrics/prometheus")).text
        assert 'llog_principal_requests_total{principal="chatty",status="429"} 1.0' in metrics
        assert 'llog_auth_refusals_total{reason="QuotaExceeded"} 1.0' in metrics
        assert control(app).metrics is not None


async def test_produce_bytes_quota_answers_429_and_writes_nothing(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    token = keys.tokens["bulky"]
    async with auth_app(stack, auth_file) as (_, http):
        # 100 bytes against a 10-byte bucket: granted once (the bucket was full), in debt.
        r = await http.post("/produce", json=produce_body(topic, "a" * 100),
                            headers=bearer(token))
        assert r.status_code == 200, r.text
        r = await http.post("/produce", json=produce_body(topic, "b"), headers=bearer(token))
        assert_refused(r, 429, "QuotaExceeded")
        assert "produce-bytes" in r.json()["error"]
        assert 9 <= int(r.headers["retry-after"]) <= 11, r.headers
        assert await high_watermark(http, keys.tokens["writer"], topic) == 1
        metrics = (await http.get("/metrics/prometheus")).text
        assert 'llog_principal_produced_bytes_total{principal="bulky"} 100.0' in metrics


async def test_health_is_open_and_metrics_can_be_protected(
        stack: LocalStack, auth_file: Path, keys: Keys) -> None:
    async with auth_app(stack, auth_file, auth_metrics="authenticated") as (_, http):
        assert (await http.get("/health/ready")).status_code == 200
        assert (await http.get("/openapi.json")).status_code == 200
        assert_refused(await http.get("/metrics/prometheus"), 401, "Unauthenticated")
        r = await http.get("/metrics/prometheus", headers=bearer(keys.tokens["reader"]))
        assert r.status_code == 200 and "llog_principal_requests_total" in r.text


async def test_group_routes_need_the_group_right_and_the_topics_consume_right(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    writer, reader = bearer(keys.tokens["writer"]), bearer(keys.tokens["reader"])
    join = {"topics": [topic]}
    async with auth_app(stack, auth_file) as (_, http):
        assert (await http.post("/produce", json=produce_body(topic, "a", "b"),
                                headers=writer)).status_code == 200
        r = await http.post("/groups/audit/join", json=join, headers=writer)
        assert_refused(r, 403, "Forbidden")
        assert "consumer group audit" in r.json()["error"]
        # The reader may consume the topic but holds no group right.
        assert_refused(await http.post("/groups/billing-eu/join", json=join, headers=reader),
                       403, "Forbidden")
        assert_refused(await http.get("/groups/billing-eu", headers=reader), 403, "Forbidden")
        committed = {"topic_partitions": [{"topic": topic, "partition": 0,
                                           "fetch_offset": "committed"}],
                     "group": "billing-eu", "max_wait_ms": 0}
        assert_refused(await http.post("/consume", json=committed, headers=reader),
                       403, "Forbidden")
        # Nothing was made by the refusals: the group does not exist yet.
        assert (await http.get("/groups/billing-eu", headers=writer)).status_code == 404

        r = await http.post("/groups/billing-eu/join", json=join, headers=writer)
        assert r.status_code == 200, r.text
        member = r.json()
        r = await http.post("/consume", json=committed, headers=writer)
        assert r.status_code == 200, r.text
        assert [x["value"] for x in r.json()["results"][0]["records"]] == ["a", "b"]
        listed = await http.get("/groups", headers=writer)
        assert "billing-eu" in [g["group"] for g in listed.json()["groups"]]
        hidden = await http.get("/groups", headers=reader)
        assert hidden.status_code == 200 and hidden.json()["groups"] == []
        r = await http.post("/groups/billing-eu/leave", headers=writer,
                            json={"member_id": member["member_id"]})
        assert r.status_code == 200 and r.json()["left"]


async def test_a_stream_needs_the_consume_right(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    async with auth_app(stack, auth_file) as (_, http):
        r = await http.get(f"/topics/{topic}/stream", headers=bearer(keys.tokens["outsider"]))
        assert_refused(r, 403, "Forbidden")
        assert_refused(await http.get(f"/topics/{topic}/stream"), 401, "Unauthenticated")


# -- reloading the auth file -------------------------------------------------------------


async def test_keys_reload_without_restart_and_a_broken_file_keeps_them(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    old = keys.tokens["reader"]
    async with auth_app(stack, auth_file, auth_reload_interval_s=0.1) as (app, http):
        watch = control(app).watch
        fetch = {"topic_partitions": [{"topic": topic, "partition": 0}]}
        assert (await http.post("/offsets", json=fetch, headers=bearer(old))).status_code == 200
        new = keys.new("reader")  # rotate: the file now holds only the new key
        seen = watch.attempts
        write(auth_file, auth_text(keys, topic))
        with anyio.fail_after(60):  # only catches a reload never attempted
            await watch.attempted(seen)
        assert (await http.post("/offsets", json=fetch, headers=bearer(new))).status_code == 200
        assert_refused(await http.post("/offsets", json=fetch, headers=bearer(old)),
                       401, "Unauthenticated")

        seen = watch.attempts
        write(auth_file, "[principals.reader]\nkeys = 'not a list'\n")
        with anyio.fail_after(60):  # only catches a reload never attempted
            await watch.attempted(seen)
        assert (await http.post("/offsets", json=fetch, headers=bearer(new))).status_code == 200
        metrics = (await http.get("/metrics/prometheus")).text
        assert 'llog_auth_file_reloads_total{outcome="failed"} 1.0' in metrics


async def test_a_broken_auth_file_stops_the_start(stack: LocalStack, tmp_path: Path) -> None:
    path = tmp_path / "auth.toml"
    write(path, "[principals.x]\nkeys = ['sha256:nothex']\n")
    app = create_app(make_settings(stack, auth="on", auth_file=path))
    with anyio.fail_after(30), pytest.raises(ValueError, match=r"principals\.x\.keys\.0"):
        async with app.router.lifespan_context(app):
            pass


# -- JWTs --------------------------------------------------------------------------------


def jwt_settings(jwks_file: Path | None = None, jwks_url: str | None = None) -> dict[str, Any]:
    return {"auth_jwks_file": jwks_file, "auth_jwks_url": jwks_url,
            "auth_jwt_issuer": ISSUER, "auth_jwt_audience": AUDIENCE,
            "auth_jwt_leeway_s": 5, "auth_jwks_min_refresh_s": 0}


async def test_jwts_from_a_jwks_file_and_every_bad_token_is_refused(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str, tmp_path: Path) -> None:
    issuer, impostor = Issuer(), Issuer()
    impostor.kid = issuer.kid  # same key id, another key: a forged signature
    jwks_file = tmp_path / "jwks.json"
    jwks_file.write_text(json.dumps(jwks(issuer)))
    async with auth_app(stack, auth_file, **jwt_settings(jwks_file=jwks_file)) as (_, http):
        good = issuer.token("jwt-writer")
        r = await http.post("/produce", json=produce_body(topic, "ok"), headers=bearer(good))
        assert r.status_code == 200, r.text

        bad = {
            "the token's signature does not verify": impostor.token("jwt-writer"),
            "the token has expired": issuer.token("jwt-writer", exp=1_000_000_000),
            "the token is not valid yet": issuer.token("jwt-writer", nbf=4_000_000_000),
            "the token comes from another issuer": issuer.token("jwt-writer",
                                                                iss="https://evil.test"),
            "the token is not meant for this audience": issuer.token("jwt-writer",
                                                                     aud="another-service"),
            "the token lacks the exp claim": issuer.token("jwt-writer", exp=None),
            "the token's algorithm is not accepted": _hs256_confusion(issuer),
            "not a well-formed JWT": "a.b.c",
        }
        for description, token in bad.items():
            r = await http.post("/produce", json=produce_body(topic, "x"), headers=bearer(token))
            assert_refused(r, 401, "Unauthenticated", 'error="invalid_token"')
            assert description in r.json()["error"], (description, r.json())

        # A valid token for a subject without rights on the topic.
        r = await http.post("/produce", json=produce_body(topic, "x"),
                            headers=bearer(issuer.token("stranger")))
        assert_refused(r, 403, "Forbidden")
        assert await high_watermark(http, keys.tokens["writer"], topic) == 1


def _hs256_confusion(issuer: Issuer) -> str:
    """A token signed with HMAC, keyed by the issuer's public key: accepting it would let
    anyone who knows the public key mint tokens."""
    import base64
    import hashlib
    import hmac

    from cryptography.hazmat.primitives import serialization

    public = issuer.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": issuer.kid}).encode())
    payload = b64(json.dumps({"sub": "jwt-writer", "iss": ISSUER, "aud": AUDIENCE,
                              "exp": 4_000_000_000}).encode())
    signature = hmac.new(public, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64(signature)}"


async def test_jwks_from_a_url_follows_a_key_rotation(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> None:
    first, second = Issuer(), Issuer()
    server = JwksServer(jwks(first))
    with server.running():
        async with auth_app(stack, auth_file, auth_metrics_max_principals=2,
                            **jwt_settings(jwks_url=server.url)) as (_, http):
            assert server.fetches == 1
            r = await http.post("/produce", json=produce_body(topic, "a"),
                                headers=bearer(first.token("jwt-writer")))
            assert r.status_code == 200, r.text
            assert server.fetches == 1  # served from the keys held

            # The issuer rotates: a token names a key id the broker has not seen yet.
            server.document = jwks(first, second)
            r = await http.post("/produce", json=produce_body(topic, "b"),
                                headers=bearer(second.token("jwt-writer")))
            assert r.status_code == 200, r.text
            assert server.fetches == 2

            # Subjects beyond LLOG_AUTH_METRICS_MAX_PRINCIPALS share the "other" label.
            for sub in ("s1", "s2", "s3"):
                await http.post("/offsets", json={"topic_partitions": [
                    {"topic": "pub-x", "partition": 0}]}, headers=bearer(first.token(sub)))
            metrics = (await http.get("/metrics/prometheus")).text
            assert all(f'principal="{p}"' in metrics for p in ("jwt-writer", "s1", "s2"))
            assert 'principal="s3"' not in metrics and 'principal="other"' in metrics
    assert await _hw_after(stack, auth_file, keys, topic) == 2


async def _hw_after(stack: LocalStack, auth_file: Path, keys: Keys, topic: str) -> int:
    async with auth_app(stack, auth_file) as (_, http):
        return await high_watermark(http, keys.tokens["writer"], topic)


# -- CORS and the OpenAPI document -------------------------------------------------------


async def test_cors_answers_preflights_and_refusals_carry_its_headers(
        stack: LocalStack, auth_file: Path) -> None:
    site = "https://app.example"
    preflight = {"origin": site, "access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-encoding, "
                                                   "content-type"}
    async with auth_app(stack, auth_file, cors_allow_origins=site) as (_, http):
        r = await http.options("/produce", headers=preflight)
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == site
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        assert r.headers["access-control-max-age"] == "600"
        r = await http.options("/produce", headers={**preflight,
                                                    "origin": "https://elsewhere.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        # A browser can read why it was refused, and when to come back.
        r = await http.post("/produce", json={}, headers={"origin": site})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == site
        assert "www-authenticate" in r.headers["access-control-expose-headers"].lower()


async def test_cors_is_off_by_default(stack: LocalStack) -> None:
    app = create_app(make_settings(stack))
    with anyio.fail_after(60):
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://broker") as http:
            r = await http.options("/produce", headers={
                "origin": "https://app.example", "access-control-request-method": "POST"})
            assert "access-control-allow-origin" not in r.headers
            schema = (await http.get("/openapi.json")).json()
            assert "securitySchemes" not in schema.get("components", {})
            assert "security" not in schema["paths"]["/produce"]["post"]


async def test_openapi_declares_the_bearer_scheme_on_protected_operations(
        stack: LocalStack, auth_file: Path) -> None:
    async with auth_app(stack, auth_file) as (_, http):
        schema = (await http.get("/openapi.json")).json()
    scheme = schema["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    protected = {(path, method): op for path, ops in schema["paths"].items()
                 for method, op in ops.items() if "security" in op}
    assert {("/produce", "post"), ("/consume", "post"), ("/offsets", "post"),
            ("/topics", "get"), ("/topics", "post"), ("/topics/{topic}", "delete")
            } <= set(protected)
    for op in protected.values():
        assert op["security"] == [{"bearerAuth": []}]
        for status, header in (("401", "WWW-Authenticate"), ("403", "WWW-Authenticate"),
                               ("429", "Retry-After")):
            answer = op["responses"][status]
            ref = answer["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorResponse"
            assert answer["headers"][header]["required"] is True
    assert "security" not in schema["paths"]["/health/ready"]["get"]
    assert "security" not in schema["paths"]["/metrics/prometheus"]["get"]
    enum = schema["components"]["schemas"]["ErrorType"]["enum"]
    assert {"Unauthenticated", "Forbidden", "QuotaExceeded"} <= set(enum)


# -- the Python client -------------------------------------------------------------------


async def test_the_python_client_sends_its_token_and_names_each_refusal(
        stack: LocalStack, auth_file: Path, keys: Keys, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from llog_client import (
        NO_RETRIES,
        AsyncLlogClient,
        Forbidden,
        QuotaExceeded,
        Unauthenticated,
    )

    async with auth_app(stack, auth_file) as (app, _):
        transport = httpx.ASGITransport(app=app)

        def client(token: str | None) -> AsyncLlogClient:
            return AsyncLlogClient("http://broker", token=token, retry=NO_RETRIES,
                                   transport=transport)

        async with client(keys.tokens["writer"]) as llog:
            assert (await llog.produce(topic, ["a"])).batches
        monkeypatch.setenv("LLOG_TOKEN", keys.tokens["reader"])
        async with client(None) as llog:  # LLOG_TOKEN
            assert (await llog.offsets(topic)).high_watermark == 1
            with pytest.raises(Forbidden):
                await llog.produce(topic, ["b"])
        async with client(keys.new("stranger")) as llog:
            with pytest.raises(Unauthenticated):
                await llog.offsets(topic)
        async with client(keys.tokens["chatty"]) as llog:
            await llog.produce(topic, ["c"])
            with pytest.raises(QuotaExceeded) as refused:
                await llog.produce(topic, ["d"])
            assert refused.value.retriable and (refused.value.retry_after_s or 0) >= 1
