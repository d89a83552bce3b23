"""The HTTP edge, in process (httpx's ASGI transport) on the real Oxia and MinIO: no input
yields a 5xx, statuses follow the error classes, a client that goes away is let go."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.broker.assembly import Broker
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import make_settings, open_engine


@contextlib.asynccontextmanager
async def running_app(stack: LocalStack, **overrides: Any
                      ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(make_settings(stack, **overrides))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield app, client


def _broker(app: FastAPI) -> Broker:
    broker: Broker = app.state.broker
    return broker


# -- no input is a 5xx -------------------------------------------------------------------

_SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800"])
_TEXT = st.one_of(st.text(max_size=12), _SURROGATES)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=12)
_TOPIC = st.one_of(st.from_regex(r"[a-z]{1,8}", fullmatch=True), _TEXT)
_RECORD = st.one_of(_TEXT, st.fixed_dictionaries({"base64": _TEXT}), _JSON)
_PRODUCE = st.fixed_dictionaries({"topic_partitions": st.lists(st.fixed_dictionaries(
    {"topic": _TOPIC, "partition": st.one_of(st.integers(-1, 3), _JSON),
     "records": st.lists(_RECORD, max_size=3)},
    optional={"idempotency_key": _TEXT}), max_size=3)})
_CONSUME = st.fixed_dictionaries({"topic_partitions": st.lists(st.fixed_dictionaries(
    {"topic": _TOPIC, "partition": st.integers(-1, 3), "fetch_offset": _JSON},
    optional={"partition_max_bytes": _JSON}), max_size=3)},
    optional={"max_wait_ms": st.just(0), "max_bytes": _JSON, "min_bytes": _JSON})


async def test_no_json_input_yields_a_5xx(stack: LocalStack, topic: str) -> None:
    async with running_app(stack) as (_, client):
        bodies: list[tuple[str, Any]] = []

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(path=st.sampled_from(["/produce", "/consume"]),
               body=st.one_of(_JSON, _PRODUCE, _CONSUME))
        def collect(path: str, body: Any) -> None:
            bodies.append((path, body))

        collect()
        for path, body in bodies:
            if path == "/consume" and isinstance(body, dict):
                body = {**body, "max_wait_ms": 0}
            r = await client.post(path, content=json.dumps(body),
                                  headers={"content-type": "application/json"})
            assert r.status_code < 500, (path, body, r.text)
            assert "error_type" in r.json() or r.status_code in (200, 409), (path, body)


async def test_a_lone_surrogate_is_a_400_and_writes_nothing(stack: LocalStack,
                                                           topic: str) -> None:
    async with running_app(stack) as (app, client):
        r = await client.post("/produce", content=json.dumps(
            produce_body(topic, "ok", "\ud800")), headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error_type"] == "InvalidRequest"
        assert "surrogate" in r.json()["details"][0]["msg"]
        reader = _broker(app).reader
        assert reader is not None and await reader.high_watermark(TopicPartition(topic, 0)) == 0


# -- statuses by class -------------------------------------------------------------------

async def test_a_partly_failed_produce_is_409_with_each_entry_as_it_is(
        stack: LocalStack, topic: str) -> None:
    async with open_engine(make_settings(stack)) as operator:
        await operator.writer.fence(TopicPartition(topic, 1))
    async with running_app(stack) as (_, client):
        r = await client.post("/produce", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "records": ["kept"]},
            {"topic": topic, "partition": 1, "records": ["refused"]}]})
        assert r.status_code == 409
        body = r.json()
        assert (body["success_count"], body["error_count"]) == (1, 1)
        ok, fenced = body["results"]
        assert ok["ok"] and ok["start_offset"] == 1
        assert fenced == {"topic": topic, "partition": 1, "ok": False, "outcome": "failure",
                          "error_type": "PartitionFenced", "error": fenced["error"],
                          "retriable": False, "maybe_written": False}


async def test_a_broker_without_a_role_refuses_that_operation(stack: LocalStack,
                                                              topic: str) -> None:
    async with running_app(stack, roles="read") as (_, client):
        r = await client.post("/produce", json=produce_body(topic, "x"))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        (result,) = r.json()["results"]
        assert result["error_type"] == "RoleDisabled" and result["retriable"] is True
    async with running_app(stack, roles="write") as (_, client):
        r = await client.post("/consume", json=consume_body(topic, max_wait_ms=0))
        (result,) = r.json()["results"]
        assert result["ok"] is False and result["error_type"] == "RoleDisabled"


async def test_a_client_that_goes_away_frees_its_long_poll(stack: LocalStack,
                                                          topic: str) -> None:
    # The long-poll's own deadline is far beyond the bound below: only the disconnect
    # ends it within that.
    async with running_app(stack, max_wait_ms_ceiling=600_000) as (app, _):
        service = _broker(app).consume
        assert service is not None
        body = json.dumps(consume_body(topic, 1, max_wait_ms=600_000)).encode()
        gone = anyio.Event()
        queue = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if queue:
                return queue.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/consume",
                 "raw_path": b"/consume", "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 40000), "server": ("broker", 80), "state": {}}
        with anyio.fail_after(60):  # only catches a long-poll the disconnect did not end
            async with anyio.create_task_group() as tg:
                tg.start_soon(app, scope, receive, send)
                # Parked in its long-poll (its first look reads Oxia on a worker thread).
                parked = False
                while not parked:
                    await anyio.sleep(0.01)
                    parked = service.statistics().long_polls == 1
                gone.set()
        (start,) = [m for m in sent if m["type"] == "http.response.start"]
        assert start["status"] == 499
        assert service.statistics().long_polls == 0
