"""Topics as first-class objects, and retention, through HTTP and the engine, on the real
Oxia and MinIO."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage import columnar
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.partitioner import partition_for_key
from app.storage.retention import apply_retention, trim_index
from app.storage.topic_catalog import TopicCatalog, TopicConfig
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.clock import FakeClock
from tests.helpers.compaction import compaction_settings, index_entries, make_compactor
from tests.helpers.stack import make_settings, open_engine


@contextlib.asynccontextmanager
async def broker(stack: LocalStack, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = create_app(make_settings(stack, **overrides))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


async def _consume(http: httpx.AsyncClient, topic: str, offset: int | str = 1,
                   partition: int = 0) -> dict[str, Any]:
    body = consume_body(topic, 1, partition, max_wait_ms=0)
    body["topic_partitions"][0]["fetch_offset"] = offset
    r = await http.post("/consume", json=body)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["results"][0]
    return result


async def test_create_list_describe_update_and_delete(stack: LocalStack, topic: str) -> None:
    async with broker(stack, topic_cache_ttl_s=0.5) as http:  # the delete settles in 1.5 s
        r = await http.post("/topics", json={"topic": topic, "partitions": 3,
                                             "retention_ms": 3_600_000})
        assert r.status_code == 201, r.text
        assert r.json()["partitions"] == 3 and r.json()["retention_ms"] == 3_600_000
        r = await http.post("/topics", json={"topic": topic})
        assert r.status_code == 409 and r.json()["error_type"] == "TopicExists"
        assert topic in [t["topic"] for t in (await http.get("/topics")).json()["topics"]]
        await http.post("/produce", json=produce_body(topic, "a", "bb", partition=1))

        described = (await http.get(f"/topics/{topic}")).json()
        states = {p["partition"]: p for p in described["partition_states"]}
        assert len(states) == 3 and states[1]["high_watermark"] == 2
        assert states[1]["retained_bytes"] > 0 and states[0]["high_watermark"] == 0

        r = await http.patch(f"/topics/{topic}", json={"partitions": 5, "retention_ms": None,
                                                       "retention_bytes": 10_000})
        assert r.status_code == 200, r.text
        assert (r.json()["partitions"], r.json()["retention_ms"],
                r.json()["retention_bytes"]) == (5, None, 10_000)
        # Fewer partitions than the topic has: a conflict with the topic, not a 400; an
        # integral number written with a fraction is an integer.
        r = await http.patch(f"/topics/{topic}", json={"partitions": 2})
        assert r.status_code == 409 and r.json()["error_type"] == "PartitionsOnlyGrow"
        assert "only grow" in r.json()["error"]
        r = await http.patch(f"/topics/{topic}", json={"partitions": 6.0})
        assert r.status_code == 200 and r.json()["partitions"] == 6, r.text

        r = await http.delete(f"/topics/{topic}")
        assert r.status_code == 200 and r.json()["status"] == "deleted", r.text
        assert (await http.get(f"/topics/{topic}")).status_code == 404
        gone = await _consume(http, topic, 1, partition=1)
        assert gone["error_type"] == "OffsetOutOfRange" and gone["log_start_offset"] == 3
        # Offsets are never reused: written again, the topic continues where it stopped.
        r = await http.post("/produce", json=produce_body(topic, "again", partition=1))
        assert r.json()["results"][0]["start_offset"] == 3
        # 0, like "earliest", is the log start wherever it moved: not offset 1.
        for start in (0, "earliest"):
            again = await _consume(http, topic, start, partition=1)
            assert [x["offset"] for x in again["records"]] == [3], (start, again)


async def test_without_auto_create_unknown_topics_and_partitions_are_refused(
        stack: LocalStack, topic: str) -> None:
    async with broker(stack, auto_create_topics=False) as http:
        r = await http.post("/produce", json=produce_body(topic, "x"))
        assert r.status_code == 404 and r.json()["error_type"] == "UnknownTopic"
        assert (await _consume(http, topic))["error_type"] == "UnknownTopic"
        assert (await http.post("/topics", json={"topic": topic, "partitions": 2})
                ).status_code == 201
        r = await http.post("/produce", json=produce_body(topic, "x", partition=2))
        assert r.status_code == 404 and r.json()["error_type"] == "UnknownPartition"
        assert (await _consume(http, topic, partition=2))["error_type"] == "UnknownPartition"
        r = await http.post("/produce", json=produce_body(topic, "x", partition=1))
        assert r.status_code == 200
        offsets = (await http.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 1}]})).json()["results"][0]
        assert offsets["high_watermark"] == 1


async def test_auto_create_grows_a_topic_to_the_partition_named(stack: LocalStack,
                                                                topic: str) -> None:
    async with broker(stack, auto_create_partitions=2) as http:
        await http.post("/produce", json=produce_body(topic, "x"))
        assert (await http.get(f"/topics/{topic}")).json()["partitions"] == 2
        await http.post("/produce", json=produce_body(topic, "x", partition=6))
        assert (await http.get(f"/topics/{topic}")).json()["partitions"] == 7


async def test_auto_create_grows_no_topic_past_the_partition_limit(stack: LocalStack,
                                                                  topic: str) -> None:
    """A produce naming a far partition neither creates nor grows a topic beyond
    LLOG_MAX_TOPIC_PARTITIONS: 400, nothing written, the topic as it was."""
    async with broker(stack, auto_create_partitions=2, max_topic_partitions=8) as http:
        r = await http.post("/produce", json=produce_body(topic, "x", partition=8))
        assert r.status_code == 400, r.text
        assert "LLOG_MAX_TOPIC_PARTITIONS" in r.json()["error"]
        assert (await http.get(f"/topics/{topic}")).status_code == 404
        await http.post("/produce", json=produce_body(topic, "x", partition=7))
        r = await http.post("/produce", json=produce_body(topic, "x", partition=57453))
        assert r.status_code == 400, r.text
        assert (await http.get(f"/topics/{topic}")).json()["partitions"] == 8
        document = (await http.get("/openapi.json")).json()
        entry = document["components"]["schemas"]["ProduceTopicPartition"]
        partition = entry["properties"]["partition"]  # an integer, or null: by key
        assert partition["type"] == ["integer", "null"] and partition["maximum"] == 7


async def test_writes_to_many_new_partitions_at_once_grow_the_topic_without_a_fight(
        stack: LocalStack, topic: str) -> None:
    """Producers to 64 partitions of a topic that has one: the requests that grow it take
    turns in a broker, each turn growing it as far as anyone waiting wants, so every
    write lands and the topic record is not fought over (compare-and-set conflicts)."""
    app: FastAPI = create_app(make_settings(stack))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as http:
        await _produce_to(http, topic, 0)
        registry = app.state.service.registry

        def conflicts() -> float:
            return registry.get_sample_value(
                "llog_oxia_puts_total", {"op": "cas", "outcome": "conflict"}) or 0.0

        before = conflicts()
        async with anyio.create_task_group() as tg:
            for p in range(1, 64):
                tg.start_soon(_produce_to, http, topic, p)
        assert (await http.get(f"/topics/{topic}")).json()["partitions"] == 64
        assert conflicts() - before < 10


async def _produce_to(http: httpx.AsyncClient, topic: str, partition: int) -> None:
    r = await http.post("/produce", json=produce_body(topic, f"p{partition}",
                                                       partition=partition))
    assert r.status_code == 200, r.text


async def test_records_without_a_partition_go_where_their_key_says(stack: LocalStack,
                                                                   topic: str) -> None:
    async with broker(stack) as http:
        await http.post("/topics", json={"topic": topic, "partitions": 8})
        placed: dict[str, int] = {}
        for key in ("alice", "bob", "carol", "dave"):
            r = await http.post("/produce", json={"topic_partitions": [{
                "topic": topic, "records": [{"value": f"{key}-1", "key": key},
                                            {"value": f"{key}-2", "key": key}]}]})
            assert r.status_code == 200, r.text
            placed[key] = r.json()["results"][0]["partition"]
        assert placed == {k: partition_for_key(k.encode(), 8) for k in placed}
        r = await http.post("/produce", json={"topic_partitions": [{
            "topic": topic, "records": [{"value": "1", "key": "a"}, {"value": "2", "key": "b"}]}]})
        assert r.status_code == 400 and "one key" in r.json()["error"]
        r = await http.post("/produce", json={"topic_partitions": [{
            "topic": topic, "records": ["no key"]}]})
        assert r.status_code == 400


async def test_retention_by_time_moves_the_log_start_and_trims_the_index(
        stack: LocalStack, tp: TopicPartition) -> None:
    clock = FakeClock(1_700_000_000_000)
    async with open_engine(compaction_settings(stack), clock=clock) as e:
        for _ in range(10):  # 10 appends of 3 records, a minute apart
            (r,) = await e.writer.append_shared([AppendGroup(tp, [b"r"] * 3)])
            assert isinstance(r, AppendResult)
            clock.advance(60_000)
        await make_compactor(e, max_entries=4).compact_once(tp)  # 1-12 compacted
        # Keep the last 5 minutes: appends 6..10 (offsets 16..30).
        start = await apply_retention(e.reader, e.oxia, e.layout, tp,
                                      TopicConfig(retention_ms=300_000), clock.now)
        assert start == 16
        with pytest.raises(Exception, match="below the log start"):
            await e.reader.read(tp, 15)
        assert (await e.reader.read(tp, 0)).records[0][0] == 16
        control = await e.reader.read_control(tp)
        assert control is not None and control.log_start == 16
        assert await trim_index(e.oxia, e.layout, tp, control)
        assert min(end for end, _ in await index_entries(e, tp)) >= 16
        assert [o for o, _ in (await e.reader.read(tp, 16)).records] == list(range(16, 31))


async def test_retention_by_bytes_keeps_the_newest_bytes(stack: LocalStack,
                                                        tp: TopicPartition) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        for i in range(10):  # 10 appends of 1 KiB bodies
            await e.writer.append_shared([AppendGroup(tp, [bytes([i]) * 1020])])
        start = await apply_retention(e.reader, e.oxia, e.layout, tp,
                                      TopicConfig(retention_bytes=3 * 1024), 0)
        assert start == 8  # the last three appends stay whole
        described = await e.reader.read_control(tp)
        body = len(columnar.encode([b"x" * 1020]))  # one append's body
        assert described is not None and described.log_start_bytes == 7 * body
        catalog = TopicCatalog(e.oxia, e.layout)
        assert (await catalog.get(tp.topic)) is not None  # the writer registered the topic
