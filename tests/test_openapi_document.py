"""The OpenAPI document of the broker and the compactor: valid, named by verbs, results
discriminated on ``ok``, every error type documented, every status declared with an
example that matches its schema, and every answer of a real broker as the document says."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI
from openapi_schema_validator import OAS31Validator
from openapi_spec_validator import validate

from app.compactor_app import create_compactor_app
from app.errors import error_types
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.routes.error_types import EDGE_ERROR_TYPES
from app.routes.openapi import install_openapi
from app.settings import Settings
from app.storage.keys import TopicPartition
from tests.helpers.auth import Keys, bearer
from tests.helpers.bodies import produce_body
from tests.helpers.stack import make_settings, open_engine

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
BROKER_OPERATIONS = {
    "produce", "consume", "stream", "list_offsets", "create_topic", "list_topics",
    "describe_topic", "update_topic", "delete_topic", "join_group", "heartbeat",
    "leave_group", "commit_offsets", "list_groups", "describe_group", "reset_offsets",
    "get_cluster", "check_health", "check_readiness", "check_liveness", "get_metrics",
    "get_prometheus_metrics", "get_whoami"}
# Served only with access control on: stream tickets stand in for a token.
AUTH_OPERATIONS = {"issue_stream_ticket"}
COMPACTOR_OPERATIONS = {"check_health", "check_readiness", "check_liveness", "get_metrics",
                        "get_prometheus_metrics"}


def _broker_spec() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _auth_spec() -> dict[str, Any]:
    """With auth on and JWTs from an issuer (the file is read only when the app starts)."""
    return create_app(Settings(
        auth="on", auth_file=Path("auth.toml"), auth_jwks_file=Path("jwks.json"),
        auth_jwt_issuer="https://issuer.test", auth_jwt_audience="llog")).openapi()


def _compactor_spec() -> dict[str, Any]:
    return create_compactor_app(Settings()).openapi()


SPECS = {"broker": _broker_spec, "broker with auth": _auth_spec,
         "compactor": _compactor_spec}


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


def resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def check(spec: dict[str, Any], schema: dict[str, Any], value: Any, where: str) -> None:
    """``value`` matches ``schema``, whose references point into the document."""
    errors = list(OAS31Validator({**schema, "components": spec["components"]})
                  .iter_errors(value))
    assert not errors, f"{where}: {value!r} does not match: {errors[0].message}"


@pytest.mark.parametrize("app", sorted(SPECS))
def test_the_document_is_valid_openapi(app: str) -> None:
    validate(SPECS[app]())


@pytest.mark.parametrize(("app", "expected"), [("broker", BROKER_OPERATIONS),
                                               ("broker with auth",
                                                BROKER_OPERATIONS | AUTH_OPERATIONS),
                                               ("compactor", COMPACTOR_OPERATIONS)])
def test_operation_ids_are_unique_snake_case_verb_phrases(app: str,
                                                          expected: set[str]) -> None:
    ids = [op["operationId"] for _, _, op in operations(SPECS[app]())]
    assert len(ids) == len(set(ids)), ids
    assert set(ids) == expected
    for op_id in ids:
        assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+){0,3}", op_id), op_id
        # Not the path and method FastAPI would append (produce_produce_post).
        assert not re.search(r"_(get|put|post|delete|patch|head|options)$", op_id), op_id


def test_a_new_route_is_named_after_its_handler_and_a_clash_is_refused() -> None:
    router = APIRouter()

    @router.post("/groups/{group}/join")
    async def join_group(group: str) -> None: ...

    @router.get("/groups", operation_id="list_consumer_groups")
    async def groups() -> None: ...

    app = FastAPI()
    app.router.routes.extend(router.routes)
    install_openapi(app)
    assert {op["operationId"] for _, _, op in operations(app.openapi())} == {
        "join_group", "list_consumer_groups"}

    other = APIRouter()

    @other.delete("/groups/{group}")
    async def join_group_again(group: str) -> None: ...

    clash = FastAPI()
    clash.router.routes.extend([*router.routes, *other.routes])
    other.routes[0].name = "join_group"  # type: ignore[attr-defined]
    install_openapi(clash)
    with pytest.raises(ValueError, match="join_group"):
        clash.openapi()


@pytest.mark.parametrize(("answer", "result", "success", "failure"), [
    ("ProduceResults", "ProducePartitionResult", "ProduceSuccess", "ProduceFailure"),
    ("ConsumeResults", "ConsumePartitionResult", "ConsumeSuccess", "ConsumeFailure"),
    ("OffsetsResponse", "OffsetsPartitionResult", "OffsetsSuccess", "OffsetsFailure"),
    ("OffsetResults", "OffsetResult", "OffsetSuccess", "OffsetFailure"),
])
def test_results_are_discriminated_on_a_string_beside_ok(answer: str, result: str,
                                                          success: str, failure: str) -> None:
    """``outcome`` ("success"/"failure") picks the schema, since generators cannot match
    a boolean discriminator; ``ok`` stays in every result, a plain boolean (a ``const:
    true`` reads as the string "true" to openapi-generator)."""
    spec = _broker_spec()
    schemas = spec["components"]["schemas"]
    ref = "#/components/schemas/"
    items = schemas[answer]["properties"]["results"]["items"]
    assert items == {"$ref": f"{ref}{result}"}
    union = schemas[result]
    assert union["oneOf"] == [{"$ref": ref + success}, {"$ref": ref + failure}]
    assert union["discriminator"] == {"propertyName": "outcome", "mapping": {
        "success": ref + success, "failure": ref + failure}}
    assert schemas[success]["properties"]["outcome"]["const"] == "success"
    assert schemas[failure]["properties"]["outcome"]["const"] == "failure"
    for name in (success, failure):
        assert {"ok", "outcome"} <= set(schemas[name]["required"])
        assert schemas[name]["properties"]["ok"]["type"] == "boolean"
        assert "const" not in schemas[name]["properties"]["ok"]
    assert {"error_type", "error", "retriable"} <= set(schemas[failure]["required"])
    assert schemas[failure]["properties"]["error_type"] == {"$ref": ref + "ErrorType"}
    # Fields left out of an answer are optional, never null.
    for name in (success, failure):
        for prop, schema in schemas[name]["properties"].items():
            assert "anyOf" not in schema, (name, prop)


def test_no_schema_is_named_like_a_generated_operation_wrapper() -> None:
    """oapi-codegen names its answer wrappers ``<Operation>Response`` (ProduceResponse for
    produce): a schema of that name makes its output fail to compile."""
    spec = _broker_spec()
    wrappers = {"".join(w.title() for w in op["operationId"].split("_")) + "Response"
                for _, _, op in operations(spec)}
    assert not wrappers & set(spec["components"]["schemas"])


def test_unions_of_records_and_headers_are_named_and_exclusive() -> None:
    """A record, its bytes and a header are each a named ``oneOf`` of whole shapes:
    ``anyOf`` reads to generators as one type with every member's fields (TypeScript's
    client then required both ``base64`` and ``value``), and an anonymous union
    becomes a type named after its place (``RecordsInner``)."""
    schemas = _broker_spec()["components"]["schemas"]
    ref = "#/components/schemas/"
    records = schemas["ProduceTopicPartition"]["properties"]["records"]
    assert records["items"] == {"$ref": ref + "ProduceRecord"}
    assert schemas["ProduceRecord"]["oneOf"] == [
        {"type": "string"}, {"$ref": ref + "Base64Record"}, {"$ref": ref + "RecordObject"}]
    assert schemas["RecordBytes"]["oneOf"] == [
        {"type": "string"}, {"$ref": ref + "Base64Record"}]
    assert schemas["RecordObject"]["properties"]["value"] == {"$ref": ref + "RecordBytes"}
    assert schemas["Header"]["oneOf"] == [{"$ref": ref + "TextHeader"},
                                          {"$ref": ref + "Base64Header"}]
    for name in ("Base64Record", "RecordObject", "TextHeader", "Base64Header"):
        assert schemas[name]["additionalProperties"] is False, name


def test_nullable_values_are_type_lists() -> None:
    """``T | None`` is ``type: [T, "null"]``, not ``anyOf`` with a null branch, which
    openapi-generator's Python generator cannot build a client from."""
    spec = _broker_spec()

    def nullable_unions(node: Any) -> Iterator[Any]:
        if isinstance(node, dict):
            branches = node.get("anyOf", [])
            if {"type": "null"} in branches and not any("$ref" in b for b in branches):
                yield node
            for value in node.values():
                yield from nullable_unions(value)
        elif isinstance(node, list):
            for value in node:
                yield from nullable_unions(value)

    assert list(nullable_unions(spec)) == []
    fetch = spec["components"]["schemas"]["TopicUpdateRequest"]["properties"]["retention_ms"]
    assert fetch["type"] == ["integer", "null"] and fetch["minimum"] == 1


def test_error_type_is_the_error_tree_with_what_each_means() -> None:
    schema = _broker_spec()["components"]["schemas"]["ErrorType"]
    classes = {c.__name__: c for c in error_types()}
    names = [*classes, *(e.name for e in EDGE_ERROR_TYPES)]
    assert schema["enum"] == names
    assert "Unavailable" in names and "RequestError" not in names
    assert len(schema["x-enum-descriptions"]) == len(names)
    assert schema["x-retriable"] == {n: n in classes and classes[n].retriable for n in names}
    assert schema["x-maybe-written"] == {
        n: n in classes and classes[n].maybe_written for n in names}
    assert schema["x-maybe-written"]["CommitInDoubt"] is True
    assert schema["x-retriable"]["BackPressureRejected"] is True
    produce_failure = _broker_spec()["components"]["schemas"]["ProduceFailure"]
    assert "maybe_written" in produce_failure["required"]


def _statuses(spec: dict[str, Any], path: str, method: str) -> set[str]:
    return set(spec["paths"][path][method]["responses"])


def test_every_status_a_route_answers_is_declared() -> None:
    spec = _broker_spec()
    assert _statuses(spec, "/produce", "post") == {
        "200", "400", "404", "409", "413", "415", "500", "503"}
    assert _statuses(spec, "/consume", "post") == {"200", "400", "409", "413", "500", "503"}
    assert _statuses(spec, "/topics/{topic}/stream", "get") == {
        "200", "400", "404", "500", "503"}
    assert _statuses(spec, "/offsets", "post") == {"200", "400", "413"}
    assert _statuses(spec, "/groups/{group}/commit", "post") == {
        "200", "400", "409", "413", "500", "503"}
    assert _statuses(spec, "/groups/{group}/join", "post") == {
        "200", "400", "409", "413", "500", "503"}
    assert _statuses(spec, "/groups/{group}", "get") == {"200", "400", "404", "500", "503"}
    assert _statuses(spec, "/topics", "post") == {"201", "400", "409", "413", "500", "503"}
    assert _statuses(spec, "/topics/{topic}", "get") == {"200", "400", "404", "500", "503"}
    assert _statuses(spec, "/health/ready", "get") == {"200", "503"}
    for path, method, op in operations(spec):
        assert "422" not in op["responses"], (path, method)
        for status, answer in op["responses"].items():
            assert answer["description"] != "Successful Response", (path, status)
            retry_after = answer.get("headers", {}).get("Retry-After")
            if status == "503" and not path.startswith("/health"):
                assert retry_after and retry_after["schema"]["type"] == "integer", path
            else:
                assert retry_after is None, (path, status)
    produce_503 = spec["paths"]["/produce"]["post"]["responses"]["503"]
    assert produce_503["content"]["application/json"]["schema"] == {"anyOf": [
        {"$ref": "#/components/schemas/ProduceResults"},
        {"$ref": "#/components/schemas/ErrorResponse"}]}


def test_produce_declares_its_content_encodings_and_reads_declare_compressed_answers(
        ) -> None:
    spec = _broker_spec()
    produce = spec["paths"]["/produce"]["post"]
    (encoding,) = [p for p in produce["parameters"] if p["name"] == "Content-Encoding"]
    assert encoding["in"] == "header" and not encoding["required"]
    assert encoding["schema"]["enum"] == ["identity", "gzip", "zstd"]
    refused = produce["responses"]["415"]["content"]["application/json"]
    assert refused["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    assert [e["value"]["error_type"] for e in refused["examples"].values()] == [
        "UnsupportedEncoding"]
    assert produce["responses"]["415"]["headers"]["Accept-Encoding"]["required"]
    for path, method in (("/consume", "post"), ("/topics/{topic}/stream", "get")):
        operation = spec["paths"][path][method]
        assert next(p for p in operation["parameters"] if p["name"] == "Accept-Encoding"
                    )["in"] == "header", path
        headers = operation["responses"]["200"]["headers"]
        assert headers["Content-Encoding"]["schema"]["enum"] == ["zstd", "gzip"], path
        assert headers["Vary"]["schema"]["enum"] == ["Accept-Encoding"], path


def test_with_auth_on_every_protected_operation_declares_its_refusals() -> None:
    plain, spec = _broker_spec(), _auth_spec()
    www_authenticate = {"401", "403"}
    protected = 0
    refusals = {"401", "403", "429", "503"}
    for path, method, op in operations(spec):
        if op["operationId"] in AUTH_OPERATIONS:  # not in the plain document
            declared = set(op["responses"]) - refusals
        else:
            declared = set(plain["paths"][path][method]["responses"])
        if path.startswith("/health") or path.startswith("/metrics"):
            assert "security" not in op and set(op["responses"]) == declared, path
            continue
        protected += 1
        assert op["security"] == [{"bearerAuth": []}], path
        assert set(op["responses"]) == declared | {"401", "403", "429", "503"}, path
        for status in ("401", "403", "429", "503"):
            answer = op["responses"][status]
            headers = set(answer["headers"])
            assert headers == ({"WWW-Authenticate"} if status in www_authenticate
                               else {"Retry-After"}), (path, status)
            examples = answer["content"]["application/json"]["examples"]
            refusal = {"401": "Unauthenticated", "403": "Forbidden",
                       "429": "QuotaExceeded", "503": "Unavailable"}[status]
            assert refusal in examples, (path, status)
    assert protected == len(BROKER_OPERATIONS | AUTH_OPERATIONS) - 5
    # Without JWTs nothing in access control answers 503.
    keys_only = create_app(Settings(auth="on", auth_file=Path("auth.toml"))).openapi()
    assert "503" not in keys_only["paths"]["/offsets"]["post"]["responses"]
    assert "503" not in plain["paths"]["/offsets"]["post"]["responses"]
    assert "securitySchemes" not in plain["components"]


def _examples(spec: dict[str, Any], media: dict[str, Any]) -> list[Any]:
    named = [e["value"] for e in media.get("examples", {}).values()]
    if "example" in media:
        named.append(media["example"])
    return named or resolve(spec, media["schema"]).get("examples", [])


@pytest.mark.parametrize("app", sorted(SPECS))
def test_every_body_has_examples_that_match_its_schema(app: str) -> None:
    spec = SPECS[app]()
    for path, method, op in operations(spec):
        bodies = [("request", op["requestBody"]["content"])] if "requestBody" in op else []
        bodies += [(status, answer["content"]) for status, answer in op["responses"].items()
                   if "content" in answer]
        for where, content in bodies:
            for media_type, media in content.items():
                if media["schema"].get("format") == "binary":
                    # Bytes JSON cannot hold: the format names their layout instead.
                    assert media["x-llog-format"], (path, method, where)
                    continue
                examples = _examples(spec, media)
                assert examples, (path, method, where, media_type)
                for example in examples:
                    check(spec, media["schema"], example, f"{method} {path} {where}")
    for name, schema in spec["components"]["schemas"].items():
        for example in schema.get("examples", []):
            check(spec, {"$ref": f"#/components/schemas/{name}"}, example, name)


def test_the_error_table_in_the_docs_lists_every_error_type() -> None:
    text = (ROOT / "docs" / "http-api.md").read_text()
    section = text.split("### Errors", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[2].strip("*").startswith("yes"),
                                         cells[3].strip("*").startswith("yes"))
    schema = _broker_spec()["components"]["schemas"]["ErrorType"]
    assert list(rows) == schema["enum"]
    for name, (retriable, maybe_written) in rows.items():
        assert retriable == schema["x-retriable"][name], name
        assert maybe_written == schema["x-maybe-written"][name], name


# -- what a real broker answers ----------------------------------------------------------

@contextlib.asynccontextmanager
async def documented_broker(stack: LocalStack, **overrides: Any
                            ) -> AsyncIterator[Callable[..., Awaitable[httpx.Response]]]:
    """A broker in process on the real stack, and a function that sends it a request and
    checks the answer against the document: a declared status, a body of the declared
    schema, ``Retry-After`` where the document says so."""
    app = create_app(make_settings(stack, **overrides))
    spec = app.openapi()
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:

        async def send(method: str, template: str, path: str | None = None,
                       **kwargs: Any) -> httpx.Response:
            r = await client.request(method, path or template, **kwargs)
            answers = spec["paths"][template][method.lower()]["responses"]
            assert str(r.status_code) in answers, (method, path, r.status_code, r.text)
            answer = answers[str(r.status_code)]
            media = answer.get("content", {}).get("application/json")
            if media is not None:
                check(spec, media["schema"], r.json(), f"{method} {template} {r.status_code}")
            headers = answer.get("headers", {})
            if "Retry-After" in headers:
                assert int(r.headers["retry-after"]) >= 0
            if "WWW-Authenticate" in headers:
                assert r.headers["www-authenticate"].startswith("Bearer realm="), r.headers
            return r

        yield send


async def test_every_answer_is_declared_and_matches_its_schema(stack: LocalStack,
                                                               topic: str) -> None:
    async with open_engine(make_settings(stack)) as operator:
        await operator.writer.fence(TopicPartition(topic, 1))
    async with documented_broker(stack, max_partitions_per_request=2) as send:
        r = await send("POST", "/produce", json=produce_body(topic, "a", {"base64": "AAE="}))
        assert r.status_code == 200
        r = await send("POST", "/produce", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "records": ["b"]},
            {"topic": topic, "partition": 1, "records": ["c"]}]})
        assert r.status_code == 409
        r = await send("POST", "/produce", json={"topic_partitions": []})
        assert r.status_code == 400
        r = await send("POST", "/produce", json={"topic_partitions": [
            {"topic": topic, "partition": p, "records": ["x"]} for p in range(3)]})
        assert r.status_code == 413
        r = await send("POST", "/consume", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "fetch_offset": 1},
            {"topic": topic, "partition": 2, "fetch_offset": 9}], "max_wait_ms": 0})
        assert [x["ok"] for x in r.json()["results"]] == [True, False]
        assert (await send("POST", "/consume", json={})).status_code == 400
        r = await send("POST", "/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "timestamp_ms": 0}]})
        assert r.json()["results"][0]["offset"] == 1
        await _topic_answers(send, f"{topic}-admin")
        await _group_answers(send, topic)
        r = await send("GET", "/topics/{topic}/stream", f"/topics/{topic}/stream",
                       params={"partitions": "zero"})
        assert r.status_code == 400
        for path in ("/health", "/health/ready", "/health/live", "/metrics"):
            assert (await send("GET", path)).status_code == 200
        r = await send("GET", "/cluster")  # affinity off: no members
        assert r.status_code == 200 and r.json()["members"] == []
    async with documented_broker(stack, roles=("read",)) as send:
        r = await send("POST", "/produce", json=produce_body(topic, "x"))
        assert r.status_code == 503 and r.json()["results"][0]["error_type"] == "RoleDisabled"
    async with documented_broker(stack, auto_create_topics=False) as send:
        r = await send("POST", "/produce", json=produce_body(f"{topic}-absent", "x"))
        assert r.status_code == 404 and r.json()["error_type"] == "UnknownTopic"
        stream = "/topics/{topic}/stream"
        r = await send("GET", stream, f"/topics/{topic}-absent/stream")
        assert r.status_code == 404 and r.json()["error_type"] == "UnknownTopic"


async def _group_answers(send: Callable[..., Awaitable[httpx.Response]], topic: str) -> None:
    group = f"g-{topic}"
    one = "/groups/{group}"

    def at(action: str) -> tuple[str, str]:
        return f"{one}/{action}", f"/groups/{group}/{action}"

    r = await send("POST", *at("join"), json={"topics": [topic]})
    member, generation = r.json()["member_id"], r.json()["generation"]
    assert (await send("POST", *at("heartbeat"), json={"member_id": member})
            ).status_code == 200
    r = await send("POST", *at("heartbeat"), json={"member_id": "gone"})
    assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"
    fetch = {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1}],
             "group": group, "commit": True, "max_wait_ms": 0}
    r = await send("POST", "/consume", json={**fetch, "member_id": member,
                                             "generation": generation + 1})
    assert r.status_code == 409 and r.json()["error_type"] == "StaleGeneration"
    commit = {"member_id": member, "generation": generation,
              "offsets": [{"topic": topic, "partition": 0, "offset": 1}]}
    r = await send("POST", *at("commit"), json=commit)
    assert r.status_code == 200 and r.json()["results"][0]["ok"] is True
    r = await send("POST", *at("commit"), json={**commit, "generation": generation + 1})
    assert r.status_code == 409
    r = await send("POST", *at("commit"), json={
        **commit, "offsets": [{"topic": topic, "partition": 0, "offset": 99}]})
    assert r.status_code == 409 and r.json()["error_type"] == "OffsetBeyondHighWatermark"
    assert (await send("GET", "/groups")).status_code == 200
    assert (await send("GET", one, f"/groups/{group}")).status_code == 200
    assert (await send("GET", one, f"/groups/{group}-absent")).status_code == 404
    reset = {"topic_partitions": [{"topic": topic, "partition": 0, "to": "earliest"}]}
    r = await send("POST", *at("reset-offsets"), json=reset)
    assert r.status_code == 409 and r.json()["error_type"] == "GroupNotEmpty"
    assert (await send("POST", *at("leave"), json={"member_id": member})).status_code == 200
    assert (await send("POST", *at("reset-offsets"), json=reset)).status_code == 200
    r = await send("POST", f"{one}/leave", f"/groups/{group}-absent/leave",
                   json={"member_id": member})
    assert r.status_code == 404 and r.json()["error_type"] == "UnknownGroup"


async def test_with_auth_on_every_refusal_is_declared_with_its_headers(
        stack: LocalStack, topic: str, tmp_path: Path) -> None:
    keys = Keys()
    writer, reader, chatty = (keys.new(n) for n in ("writer", "reader", "chatty"))
    auth_file = tmp_path / "auth.toml"
    e = keys.entries
    auth_file.write_text(
        f'[principals.writer]\nkeys = ["{e["writer"]}"]\nproduce = ["{topic}"]\n'
        f'[principals.reader]\nkeys = ["{e["reader"]}"]\nconsume = ["{topic}"]\n'
        f'[principals.chatty]\nkeys = ["{e["chatty"]}"]\nconsume = ["{topic}"]\n'
        'quota = { requests_per_s = 0.01, burst_s = 100 }\n')
    async with documented_broker(stack, auth="on", auth_file=auth_file) as send:
        body = produce_body(topic, "x")
        assert (await send("POST", "/produce", json=body)).status_code == 401
        r = await send("POST", "/produce", json=body, headers=bearer(reader))
        assert r.status_code == 403 and r.json()["error_type"] == "Forbidden"
        assert (await send("POST", "/produce", json=body, headers=bearer(writer))
                ).status_code == 200
        offsets = {"topic_partitions": [{"topic": topic, "partition": 0}]}
        assert (await send("POST", "/offsets", json=offsets, headers=bearer(chatty))
                ).status_code == 200
        r = await send("POST", "/offsets", json=offsets, headers=bearer(chatty))
        assert r.status_code == 429 and r.json()["error_type"] == "QuotaExceeded"
        assert (await send("GET", "/health/ready")).status_code == 200


async def _topic_answers(send: Callable[..., Awaitable[httpx.Response]], name: str) -> None:
    one = "/topics/{topic}"
    assert (await send("POST", "/topics", json={"topic": name})).status_code == 201
    assert (await send("POST", "/topics", json={"topic": name})).status_code == 409
    assert (await send("GET", "/topics")).status_code == 200
    assert (await send("GET", one, f"/topics/{name}")).status_code == 200
    r = await send("PATCH", one, f"/topics/{name}", json={"partitions": 2})
    assert r.json()["partitions"] == 2
    r = await send("PATCH", one, f"/topics/{name}", json={"partitions": 1})
    assert r.status_code == 409 and r.json()["error_type"] == "PartitionsOnlyGrow"
    assert (await send("DELETE", one, f"/topics/{name}")).status_code == 200
    assert (await send("GET", one, f"/topics/{name}")).status_code == 404
