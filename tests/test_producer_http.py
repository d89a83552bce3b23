"""Idempotent producers over HTTP, on the real Oxia and MinIO: the JSON fields (fast
path and model alike), the binary LLP2 envelope, the refusals of malformed entries
(400, nothing written) and the answers of a producer's resend and gap."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage import codec, columnar
from app.storage.appends import ProducerSeq
from app.wire import produce as llp
from tests.helpers.bodies import consume_body
from tests.helpers.stack import make_settings


@contextlib.asynccontextmanager
async def broker(stack: LocalStack) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_settings(stack))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


def _entry(topic: str, records: list[Any], partition: int | None = 0, **extra: Any
           ) -> dict[str, Any]:
    entry: dict[str, Any] = {"topic": topic, "records": records, **extra}
    if partition is not None:
        entry["partition"] = partition
    return entry


async def _produce(http: httpx.AsyncClient, *entries: dict[str, Any], status: int = 200
                   ) -> list[dict[str, Any]]:
    r = await http.post("/produce", json={"topic_partitions": list(entries)})
    assert r.status_code == status, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


async def _values(http: httpx.AsyncClient, topic: str) -> list[str]:
    r = await http.post("/consume", json=consume_body(topic, 1, 0))
    assert r.status_code == 200, r.text
    return [x["value"] for x in r.json()["results"][0]["records"]]


async def test_json_entries_of_a_producer_append_once_and_in_order(
        stack: LocalStack, topic: str) -> None:
    """Text records take the fast path, base64 ones the model: both carry the producer;
    a resend is a duplicate with the first offsets, a gap a failure that wrote nothing."""
    async with broker(stack) as http:
        first, = await _produce(http, _entry(topic, ["a", "b"], producer_id="p-1",
                                             sequence=0))
        second, = await _produce(http, _entry(topic, [{"base64": "Yw=="}],
                                              producer_id="p-1", sequence=1))
        again, gap = await _produce(
            http, _entry(topic, ["a", "b"], producer_id="p-1", sequence=0),
            _entry(topic, ["late"], producer_id="p-1", sequence=3), status=409)
        assert (first["start_offset"], first["end_offset"]) == (1, 2)
        assert second["start_offset"] == 3
        assert again["duplicate"] is True and again["start_offset"] == 1
        assert gap["outcome"] == "failure" and gap["error_type"] == "OutOfOrderSequence"
        assert gap["retriable"] is True and gap["maybe_written"] is False
        unknown, = await _produce(http, _entry(topic, ["x"], producer_id="p-2", sequence=4),
                                  status=409)
        assert unknown["error_type"] == "UnknownProducer" and unknown["retriable"] is False
        assert await _values(http, topic) == ["a", "b", "c"]


async def test_an_llp2_body_appends_a_producers_entries_once(stack: LocalStack,
                                                             topic: str) -> None:
    body = columnar.encode([b"v1", b"v2"])
    envelope = llp.build([(topic, 0, None, body, codec.ENCODING_V3)], [ProducerSeq("p", 0)])
    headers = {"content-type": llp.CONTENT_TYPE}
    async with broker(stack) as http:
        for duplicate in (False, True):
            r = await http.post("/produce", content=envelope, headers=headers)
            assert r.status_code == 200, r.text
            (result,) = r.json()["results"]
            assert (result["start_offset"], result.get("duplicate", False)) == (1, duplicate)
        assert await _values(http, topic) == ["v1", "v2"]


@pytest.mark.parametrize(("extra", "partition", "why"), [
    ({"producer_id": "p"}, 0, "producer_id and sequence come together"),
    ({"sequence": 0}, 0, "producer_id and sequence come together"),
    ({"producer_id": "p", "sequence": 0}, None, "names its partition"),
    ({"producer_id": "p", "sequence": 0, "idempotency_key": "k"}, 0, "no idempotency key"),
    ({"producer_id": "has space", "sequence": 0}, 0, "producer_id"),
    ({"producer_id": "p", "sequence": -1}, 0, "sequence"),
    ({"producer_id": "p", "sequence": 2**53}, 0, "sequence"),
    ({"producer_id": "p", "sequence": "1"}, 0, "sequence"),
])
async def test_a_malformed_producer_entry_is_a_400_and_writes_nothing(
        stack: LocalStack, topic: str, extra: dict[str, Any], partition: int | None,
        why: str) -> None:
    records: list[Any] = ["x"] if partition is not None else [{"value": "x", "key": "k"}]
    async with broker(stack) as http:
        r = await http.post("/produce", json={"topic_partitions": [
            _entry(topic, ["fine"], 0), _entry(topic, records, partition, **extra)]})
        assert r.status_code == 400, r.text
        assert why in r.text
        assert await _values(http, topic) == []
