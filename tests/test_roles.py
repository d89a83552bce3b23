"""A broker without a role refuses that role's operations the same way on every way in
(the hot lane, the FastAPI routes, the event stream): each answer here is pinned byte
for byte, so that moving the refusal into the services (app/broker/roles.py) changed
no answer. On the real Oxia and MinIO, in process; the stand-ins a broker holds for
the services it lacks, without them."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import pickle
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from app.broker import roles
from app.broker.assembly import Broker
from app.broker.process import BrokerProcess
from app.errors import RoleDisabled
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.settings import Settings
from tests.helpers.asgi import roleless_broker
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import make_settings

READ = "this broker does not have the read role"
WRITE = "this broker does not have the write role"
GROUPS = "this broker does not serve consumer groups (it needs the read role)"
ADMIN = "this broker does not serve topic administration (it needs the read role)"


@contextlib.asynccontextmanager
async def _client(stack: LocalStack, roles: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_settings(stack, roles=roles))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


def _refused(message: str) -> bytes:
    """A whole request refused: the error body, as the error handler writes it."""
    return orjson.dumps({"error_type": "RoleDisabled", "error": message})


def _failed(topic: str, message: str, **more: Any) -> dict[str, Any]:
    return {"topic": topic, "partition": 0, "ok": False, "outcome": "failure",
            "error_type": "RoleDisabled", "error": message, "retriable": True, **more}


async def test_a_broker_without_the_read_role_refuses_every_read(stack: LocalStack,
                                                                 topic: str) -> None:
    async with _client(stack, "write") as client:
        for offset in (1, "earliest", "latest"):
            r = await client.post("/consume", json=consume_body(topic, offset))
            assert (r.status_code, r.content) == (200, orjson.dumps(
                {"results": [_failed(topic, READ)]}))
        r = await client.post("/consume", json=consume_body(topic, "committed", group="g"))
        assert (r.status_code, r.content) == (503, _refused(GROUPS))
        assert r.headers["retry-after"] == "1"
        r = await client.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0}]})
        assert (r.status_code, r.content) == (200, orjson.dumps(
            {"results": [_failed(topic, READ)]}))
        r = await client.get(f"/topics/{topic}/stream", params={"from": "earliest"})
        assert (r.status_code, r.content) == (503, _refused(READ))
        r = await client.get("/groups")
        assert (r.status_code, r.content) == (503, _refused(GROUPS))
        r = await client.get("/topics")
        assert (r.status_code, r.content) == (503, _refused(ADMIN))


async def test_a_broker_without_the_write_role_refuses_every_entry(stack: LocalStack,
                                                                   topic: str) -> None:
    async with _client(stack, "read") as client:
        r = await client.post("/produce", json=produce_body(topic, "x"))
        assert (r.status_code, r.headers["retry-after"]) == (503, "1")
        assert r.content == orjson.dumps({
            "results": [_failed(topic, WRITE, maybe_written=False)],
            "success_count": 0, "error_count": 1})


def _roleless() -> Broker:
    return roleless_broker(BrokerProcess.create(Settings(broker_id="roles")))


@pytest.mark.parametrize(("ask", "message"), [
    (lambda b: b.consume.answer, READ), (lambda b: b.reader.read, READ),
    (lambda b: b.consuming.consume.stream_slots, READ),
    (lambda b: b.streaming.consume.stream_slots, READ),
    (lambda b: b.positions.reader.read, READ),
    (lambda b: b.groups.offsets, GROUPS), (lambda b: b.consuming.groups.offsets, GROUPS),
    (lambda b: b.admin.catalog, ADMIN), (lambda b: b.deleter.start, ADMIN),
    (lambda b: b.producing.topics.place, WRITE), (lambda b: b.batcher.submit, WRITE),
])
def test_a_service_the_broker_lacks_refuses_when_used(ask: Any, message: str) -> None:
    """A broker holds a stand-in for each service of a role it lacks: each refuses, by
    name, as soon as it is used."""
    with pytest.raises(RoleDisabled) as refused:
        ask(_roleless())
    assert str(refused.value) == message


def test_a_request_may_ask_for_the_refusal_first() -> None:
    """What answers each entry or partition with the refusal asks before using it."""
    broker = _roleless()
    assert str(roles.refusal_of(broker.producing.topics)) == WRITE
    assert str(roles.refusal_of(broker.consuming.consume)) == READ
    assert roles.refusal_of(broker.settings) is None  # a part that is there


def test_a_stand_in_is_an_ordinary_object_to_python_itself() -> None:
    """Copying, pickling, ``hasattr`` and ``getattr`` with a default, ``inspect`` and
    ``dataclasses.replace`` of the broker ask a stand-in for dunder names: they find none,
    as on any object, and nothing is refused; the service's own names still refuse."""
    broker = _roleless()
    stand_in = broker.consume
    copied = copy.copy(stand_in)
    assert str(roles.refusal_of(copied)) == READ
    assert str(roles.refusal_of(pickle.loads(pickle.dumps(stand_in)))) == READ
    assert not hasattr(stand_in, "__wrapped__")
    assert getattr(stand_in, "__missing_protocol__", "none") == "none"
    assert not inspect.iscoroutinefunction(stand_in)
    assert dataclasses.replace(broker).consume is stand_in
    with pytest.raises(RoleDisabled, match=READ):
        _ = copied.answer


async def test_appending_without_the_write_role_is_refused() -> None:
    with pytest.raises(RoleDisabled, match=WRITE):
        await _roleless().producing.append([])
