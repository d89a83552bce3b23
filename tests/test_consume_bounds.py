"""A consume request is bounded before it is parsed: its body by LLOG_MAX_REQUEST_BYTES
(413 at the edge, before anything reads it), its list of partitions by the model
(at most the largest LLOG_MAX_PARTITIONS_PER_REQUEST allows: 400 while it is read,
before the route runs), and then by the configured limit (413 from the route).

No store is needed: none of these requests reaches one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pydantic
import pytest
from fastapi.exceptions import RequestValidationError

from app.factory import create_app
from app.routes import consume as consume_route
from app.routes.json_body import read_body
from app.routes.models import ConsumeRequest
from app.settings import MAX_PARTITIONS_PER_REQUEST_CEILING, Settings
from tests.helpers.asgi import roleless_broker


def _body(partitions: int) -> dict[str, Any]:
    return {"topic_partitions": [{"topic": "t", "partition": p, "fetch_offset": 1}
                                 for p in range(partitions)], "max_wait_ms": 0}


class _Calls:
    def __init__(self) -> None:
        self.served = 0
        self.parsed = 0


@pytest.fixture
async def broker(monkeypatch: pytest.MonkeyPatch
                 ) -> AsyncIterator[tuple[httpx.AsyncClient, _Calls]]:
    """The app (not started: nothing here may reach the store; a broker of no role
    stands in for the one its lifespan would assemble), with its consume route's parsing
    and serving counted."""
    calls = _Calls()
    serve, parse = consume_route.serve, read_body

    async def counted_serve(*args: Any) -> Any:
        calls.served += 1
        return await serve(*args)

    def counted_parse(*args: Any) -> Any:
        calls.parsed += 1
        return parse(*args)

    monkeypatch.setattr(consume_route, "serve", counted_serve)
    monkeypatch.setattr(consume_route, "read_body", counted_parse)
    app = create_app(Settings(broker_id="bounds", max_request_bytes=8 * 1024 * 1024))
    app.state.broker = roleless_broker(app.state.service)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://broker") as client:
        yield client, calls


def test_the_model_refuses_more_partitions_than_any_limit_allows() -> None:
    body = pydantic_json(_body(MAX_PARTITIONS_PER_REQUEST_CEILING + 1))
    with pytest.raises(RequestValidationError) as refused:
        read_body(ConsumeRequest, body, "application/json")
    (error,) = refused.value.errors()
    assert error["type"] == "too_long" and error["loc"] == ("body", "topic_partitions")
    read_body(ConsumeRequest, pydantic_json(_body(MAX_PARTITIONS_PER_REQUEST_CEILING)),
              "application/json")  # the most a configured limit may allow is admitted


def test_the_schema_and_the_setting_share_the_bound() -> None:
    schema = ConsumeRequest.model_json_schema()["properties"]["topic_partitions"]
    assert schema["maxItems"] == MAX_PARTITIONS_PER_REQUEST_CEILING
    with pytest.raises(pydantic.ValidationError):
        Settings(max_partitions_per_request=MAX_PARTITIONS_PER_REQUEST_CEILING + 1)


async def test_too_many_partitions_are_refused_before_the_route_runs(
        broker: tuple[httpx.AsyncClient, _Calls]) -> None:
    client, calls = broker
    r = await client.post("/consume", json=_body(MAX_PARTITIONS_PER_REQUEST_CEILING + 1))
    assert r.status_code == 400, r.text
    assert r.json()["error_type"] == "InvalidRequest"
    assert r.json()["details"][0]["loc"] == "topic_partitions"
    assert (calls.parsed, calls.served) == (1, 0)
    # Within the model's bound, the configured limit (1000 by default) is the route's.
    r = await client.post("/consume", json=_body(1001))
    assert r.status_code == 413 and "the limit is 1000" in r.json()["error"]
    assert calls.served == 1


async def test_a_body_over_the_request_limit_is_refused_before_it_is_parsed(
        broker: tuple[httpx.AsyncClient, _Calls]) -> None:
    client, calls = broker
    body = pydantic_json(_body(MAX_PARTITIONS_PER_REQUEST_CEILING * 3))
    assert len(body) > 8 * 1024 * 1024
    r = await client.post("/consume", content=body,
                          headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error_type"] == "PayloadTooLarge"
    assert (calls.parsed, calls.served) == (0, 0)


def pydantic_json(value: Any) -> bytes:
    return pydantic.TypeAdapter(Any).dump_json(value)
