"""A body read by ``read_body`` (routes served by the hot lane) is answered exactly as
FastAPI answers the same body for a route that takes the model as its body parameter:
the same model, or the same 400 with the same details."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse

from app.routes.errors import install_error_handlers
from app.routes.json_body import is_json, read_body
from app.routes.models import ConsumeRequest


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/framework")
    async def framework(body: Annotated[ConsumeRequest, Body()]) -> JSONResponse:
        return JSONResponse(body.model_dump(mode="json"))

    @app.post("/lane")
    async def lane(request: Request) -> JSONResponse:
        body = read_body(ConsumeRequest, await request.body(),
                         request.headers.get("content-type"))
        return JSONResponse(body.model_dump(mode="json"))

    return app


_GOOD = b'{"topic_partitions": [{"topic": "t", "partition": 0, "fetch_offset": 1}]}'
_CASES: list[tuple[bytes, dict[str, str]]] = [
    (_GOOD, {"content-type": "application/json"}),
    (_GOOD, {"content-type": "application/json; charset=utf-8"}),
    (_GOOD, {"content-type": "application/vnd.llog+json"}),
    (_GOOD, {"content-type": "text/plain"}),
    (_GOOD, {}),
    (b"", {"content-type": "application/json"}),
    (b"{", {"content-type": "application/json"}),
    (b'{"topic_partitions": [}', {"content-type": "application/json"}),
    (b"\xff\xfe{}", {"content-type": "application/json"}),
    (b"[]", {"content-type": "application/json"}),
    (b"{}", {"content-type": "application/json"}),
    (b'{"topic_partitions": [], "max_wait_ms": NaN}', {"content-type": "application/json"}),
    (b'{"topic_partitions": [{"topic": "t", "partition": 99999999999999999999999}]}',
     {"content-type": "application/json"}),
    (b'{"topic_partitions": [{"topic": "../x", "partition": -1, "fetch_offset": "soon"}],'
     b' "max_wait_ms": -5, "extra": 1}', {"content-type": "application/json"}),
]


@pytest.mark.parametrize(("content", "headers"), _CASES)
async def test_the_lane_answers_as_the_framework(content: bytes,
                                                 headers: dict[str, str]) -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        framework = await client.post("/framework", content=content, headers=headers)
        lane = await client.post("/lane", content=content, headers=headers)
    answer: dict[str, Any] = lane.json()
    assert (lane.status_code, answer) == (framework.status_code, framework.json())


def test_json_content_types() -> None:
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8")
    assert is_json("application/problem+json")
    assert not is_json(None) and not is_json("") and not is_json("text/json")
    assert not is_json("application/x-ndjson")
