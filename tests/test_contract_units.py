"""The schema and the server agree, piece by piece and without servers (the whole
contract, against a real broker, is tests/test_contract_fuzz.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from pydantic import TypeAdapter, ValidationError

from app.factory import create_app
from app.routes.group_models import CommitRequest, ResetEntry
from app.routes.models import ConsumeRequest, Header, TopicCreateRequest, TopicUpdateRequest
from app.settings import Settings


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings(group_list_max=500, max_wait_ms_ceiling=2000,
                               max_topic_partitions=64)).openapi()


def _valid(document: dict[str, Any], model: str, body: Any) -> bool:
    """``body`` against the document's schema of ``model`` (JSON Schema 2020-12, the
    dialect of OpenAPI 3.1), its references pointed at the schemas beside it."""
    schemas = document["components"]["schemas"]
    text = json.dumps({**schemas[model], "$defs": schemas})
    schema = json.loads(text.replace("#/components/schemas/", "#/$defs/"))
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


@pytest.mark.parametrize(("path", "allowed"), [
    ("/topics", "GET, POST"), ("/topics/orders", "DELETE, GET, PATCH"),
    ("/produce", "POST"), ("/groups", "GET")])
async def test_a_405_lists_every_method_of_the_path(path: str, allowed: str) -> None:
    # No lifespan: routing alone answers these.
    transport = httpx.ASGITransport(app=create_app(Settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://broker") as client:
        for method in ("OPTIONS", "PUT"):
            r = await client.request(method, path)
            assert r.status_code == 405, (method, r.text)
            assert r.headers["allow"] == allowed, (method, r.headers)
            assert r.json()["error_type"] == "MethodNotAllowed"


def test_an_integer_written_with_a_zero_fraction_is_an_integer() -> None:
    assert TopicUpdateRequest.model_validate({"partitions": 2191.0}).partitions == 2191
    assert TopicCreateRequest.model_validate({"topic": "t", "partitions": 8.0}).partitions == 8
    body = CommitRequest.model_validate({"member_id": "m", "generation": 3.0, "offsets": [
        {"topic": "t", "partition": 1.0, "offset": 4.0}]})
    assert (body.generation, body.offsets[0].partition, body.offsets[0].offset) == (3, 1, 4)
    for bad in (2.5, "2", True, 0.0, 1e300):
        with pytest.raises(ValidationError):
            TopicUpdateRequest.model_validate({"partitions": bad})


def test_the_document_states_the_configured_limits(document: dict[str, Any]) -> None:
    limit = next(p for p in document["paths"]["/groups"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert (limit["schema"]["minimum"], limit["schema"]["maximum"]) == (1, 500)
    s = Settings()
    schemas = document["components"]["schemas"]
    assert schemas["ConsumeRequest"]["properties"]["max_wait_ms"]["maximum"] == 2000
    session = schemas["JoinRequest"]["properties"]["session_timeout_ms"]
    assert (session["minimum"], session["maximum"]) == (
        s.group_min_session_timeout_ms, s.group_max_session_timeout_ms)
    assert _valid(document, "TopicCreateRequest", {"topic": "t", "partitions": 64})
    assert not _valid(document, "TopicCreateRequest", {"topic": "t", "partitions": 65})
    assert schemas["CommitRequest"]["properties"]["offsets"]["maxItems"] == (
        s.max_partitions_per_request)
    assert schemas["ConsumeRequest"]["properties"]["topic_partitions"]["maxItems"] == (
        s.max_partitions_per_request)


@pytest.mark.parametrize(("model", "body", "accepted"), [
    ("ConsumeRequest", {"topic_partitions": [{"topic": "t", "partition": 0,
                                              "fetch_offset": 1}],
                        "group": "g", "commit": True, "member_id": "m"}, False),
    ("ConsumeRequest", {"topic_partitions": [{"topic": "t", "partition": 0,
                                              "fetch_offset": 1}],
                        "group": "g", "commit": True, "member_id": "m", "generation": 1}, True),
    ("ConsumeRequest", {"topic_partitions": [{"topic": "t", "partition": 0,
                                              "fetch_offset": 1}],
                        "member_id": "m", "generation": 1}, False),
    ("ConsumeRequest", {"topic_partitions": [{"topic": "t", "partition": 0,
                                              "fetch_offset": "committed"}]}, False),
    ("ConsumeRequest", {"topic_partitions": [{"topic": "t", "partition": 0,
                                              "fetch_offset": 1}],
                        "member_id": None, "generation": None}, True),
    ("CommitRequest", {"member_id": "m", "generation": None,
                       "offsets": [{"topic": "t", "partition": 0, "offset": 1}]}, False),
    ("ResetEntry", {"topic": "t", "to": "earliest", "offset": 3}, False),
    ("ResetEntry", {"topic": "t"}, False),
    ("ResetEntry", {"to": "earliest"}, False),
    ("ResetEntry", {"topic": ".", "to": "earliest"}, False),
    ("ResetEntry", {"topic": "t", "to": "earliest"}, True),
    ("ResetEntry", {"topic": "t", "partition": None, "to": "latest"}, True),
    ("ResetEntry", {"topic": "t", "partition": 2, "timestamp_ms": 0}, True),
    ("ResetEntry", {"topic": "t", "offset": 3}, True),
    ("ResetEntry", {"topic": "t", "to": "first"}, False),
    ("Header", {"name": "h", "value": "v", "base64": "AAE="}, False),
    ("Header", {"name": "h", "base64": "AAA"}, False),
    ("Header", {"name": "h", "base64": "AAE="}, True),
    ("Header", {"name": "h", "value": "v"}, True),
    ("Header", {"name": "h", "value": "v", "base64": None}, False),
    ("Header", {"name": "h"}, False),
    ("TopicCreateRequest", {"topic": "."}, False),
    ("TopicCreateRequest", {"topic": "...", "timestamp_ms": 1}, False),
    ("TopicCreateRequest", {"topic": "..."}, True),
])
def test_the_document_and_the_models_draw_the_same_lines(
        document: dict[str, Any], model: str, body: dict[str, Any], accepted: bool) -> None:
    classes = {"ConsumeRequest": ConsumeRequest, "CommitRequest": CommitRequest,
               "ResetEntry": ResetEntry, "Header": Header,
               "TopicCreateRequest": TopicCreateRequest}
    assert _valid(document, model, body) is accepted
    try:
        TypeAdapter(classes[model]).validate_python(body)
        served = True
    except (ValidationError, ValueError):
        served = False
    assert served is accepted


def test_a_reset_entry_is_one_of_three_named_shapes_each_with_its_topic(
        document: dict[str, Any]) -> None:
    """Named, closed shapes, so that generators give each a type with the topic and the
    partition (rules alone beside the properties came out as types holding the target
    only, whose serializers sent ``{"to": ...}`` without the topic)."""
    schemas = document["components"]["schemas"]
    shapes = {"ResetToPosition": "to", "ResetToTimestamp": "timestamp_ms",
              "ResetToOffset": "offset"}
    assert schemas["ResetEntry"]["oneOf"] == [
        {"$ref": f"#/components/schemas/{name}"} for name in shapes]
    assert "properties" not in schemas["ResetEntry"]
    for name, target in shapes.items():
        shape = schemas[name]
        assert shape["additionalProperties"] is False, name
        assert set(shape["properties"]) == {"topic", "partition", target}, name
        assert shape["required"] == ["topic", target], name
        assert _valid(document, name, shape["examples"][0]), name


def test_a_null_target_beside_the_one_given_is_refused_as_the_document_refuses_it(
        document: dict[str, Any]) -> None:
    """The document's shapes leave unused targets out; the broker refuses a null one
    too, so it takes exactly what its document admits."""
    body = {"topic": "t", "to": None, "offset": 3}
    with pytest.raises(ValidationError, match="leave the others out rather than null"):
        ResetEntry.model_validate(body)
    assert not _valid(document, "ResetEntry", body)
    assert ResetEntry.model_validate({"topic": "t", "offset": 3}).offset == 3
    every_partition = {"topic": "t", "partition": None, "offset": 3}  # null: every one
    assert _valid(document, "ResetEntry", every_partition)
    assert ResetEntry.model_validate(every_partition).partition is None


def test_no_list_of_the_document_claims_unique_items(document: dict[str, Any]) -> None:
    """A list of partitions names each partition once, whatever its offsets: a rule of
    a part of each item, which ``uniqueItems`` (whole items) does not state, and which
    made typescript-fetch type the lists as a ``Set`` (objects held by identity)."""
    assert "uniqueItems" not in json.dumps(document)
    schemas = document["components"]["schemas"]
    for model, field in (("ConsumeRequest", "topic_partitions"), ("CommitRequest", "offsets")):
        assert "each partition at most once (400 otherwise)" in (
            schemas[model]["properties"][field]["description"])
