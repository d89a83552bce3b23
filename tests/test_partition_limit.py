"""``LLOG_MAX_PARTITIONS_PER_REQUEST`` at every way in: produce (JSON and binary),
consume, offsets, a group's commit and its reset. One over the limit is a 413 with the
one message (``PayloadTooLarge.unless_within``) and writes nothing; at the limit the
request goes through."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage import codec, columnar
from app.wire import produce as envelope
from tests.helpers.bodies import consume_body
from tests.helpers.stack import make_settings

LIMIT = 2
GROUP = "limits"


@contextlib.asynccontextmanager
async def _broker(stack: LocalStack) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_settings(stack, max_partitions_per_request=LIMIT))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


def _json(topic: str, n: int) -> dict[str, Any]:
    return {"topic_partitions": [{"topic": topic, "partition": p, "records": [f"r{p}"]}
                                 for p in range(n)]}


def _binary(topic: str, n: int) -> bytes:
    return envelope.build([(topic, p, None, columnar.encode([b"r"]), codec.ENCODING_V3)
                           for p in range(n)])


def _partitions(topic: str, n: int, **more: Any) -> list[dict[str, Any]]:
    return [{"topic": topic, "partition": p, **more} for p in range(n)]


async def _join(http: httpx.AsyncClient, topic: str) -> dict[str, Any]:
    r = await http.post(f"/groups/{GROUP}/join", json={"topics": [topic]})
    assert r.status_code == 200, r.text
    joined: dict[str, Any] = r.json()
    return joined


def _ways_in(topic: str, member: dict[str, Any]
             ) -> dict[str, Callable[[httpx.AsyncClient, int], Any]]:
    """Each way in, as a request naming ``n`` partitions."""
    return {
        "produce JSON": lambda http, n: http.post("/produce", json=_json(topic, n)),
        "produce binary": lambda http, n: http.post(
            "/produce", content=_binary(topic, n),
            headers={"content-type": envelope.CONTENT_TYPE}),
        "consume": lambda http, n: http.post("/consume", json={
            "topic_partitions": _partitions(topic, n, fetch_offset=0), "max_wait_ms": 0}),
        "offsets": lambda http, n: http.post("/offsets", json={
            "topic_partitions": _partitions(topic, n)}),
        "group commit": lambda http, n: http.post(f"/groups/{GROUP}/commit", json={
            "member_id": member["member_id"], "generation": member["generation"],
            "offsets": _partitions(topic, n, offset=0)}),
    }


async def test_every_way_in_refuses_one_partition_over_the_limit(
        stack: LocalStack, topic: str) -> None:
    async with _broker(stack) as http:
        r = await http.post("/topics", json={"topic": topic, "partitions": LIMIT + 2})
        assert r.status_code in (200, 201), r.text
        member = await _join(http, topic)
        for way, send in _ways_in(topic, member).items():
            over = await send(http, LIMIT + 1)
            assert over.status_code == 413, (way, over.text)
            what = "entries" if way.startswith("produce") else "partitions"
            assert over.json()["error"] == (
                f"{LIMIT + 1} {what} in one request; the limit is {LIMIT}"), way
            within = await send(http, LIMIT)
            assert within.status_code != 413, (way, within.text)
        # A reset of a whole topic counts the partitions it expands to.
        reset = await http.post(f"/groups/{GROUP}/reset-offsets", json={
            "topic_partitions": [{"topic": topic, "to": "earliest"}]})
        assert reset.status_code == 413, reset.text
        assert "the limit is 2" in reset.json()["error"]
        # Nothing of the refused produce requests was written: only the two at the limit.
        r = await http.post("/consume", json=consume_body(topic, 0, 0))
        assert [x["value"] for x in r.json()["results"][0]["records"]] == ["r0", "r"]
        r = await http.post("/consume", json=consume_body(topic, 0, LIMIT))
        assert r.json()["results"][0]["records"] == []
