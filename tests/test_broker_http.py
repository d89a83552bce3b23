"""The HTTP contract (docs/http-api.md), black-box against a real broker process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest
import pytest_asyncio

from app.localstack.stack import LocalStack
from tests.helpers.bodies import consume_body, produce_body, without_times
from tests.helpers.long_polls import NEVER_MS, woken_by_a_write
from tests.helpers.stack import Broker, BrokerFactory

LIMIT_BODY = 262144


@pytest_asyncio.fixture
async def http(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        yield client


async def high_watermark(http: httpx.AsyncClient, topic: str, partition: int = 0) -> int:
    r = await http.post("/consume", json=consume_body(topic, 0, partition))
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["ok"], result
    return int(result["high_watermark"])


async def test_produce_then_consume(http: httpx.AsyncClient, topic: str) -> None:
    r = await http.post("/produce", json=produce_body(topic, "alpha", {"base64": "AAE="}, ""))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success_count"] == 1 and body["error_count"] == 0
    (res,) = body["results"]
    assert res["ok"] is True
    assert (res["topic"], res["partition"]) == (topic, 0)
    assert (res["start_offset"], res["end_offset"], res["count"]) == (1, 3, 3)
    assert res["index_key"].startswith(f"llog/{topic}/partitions/0/index/")
    assert res["wal_uri"].startswith("s3://leaderless-log-wal/llog/wal-shared/")

    r = await http.post("/consume", json=consume_body(topic, 0))
    assert r.status_code == 200
    (c,) = r.json()["results"]
    assert c["ok"] and c["high_watermark"] == 3 and c["next_offset"] == 4
    assert without_times(c["records"]) == [
        {"offset": 1, "value": "alpha"}, {"offset": 2, "base64": "AAE="},
        {"offset": 3, "value": ""}]

    r = await http.post("/consume", json=consume_body(topic, 2, encoding="base64"))
    assert without_times(r.json()["results"][0]["records"]) == [
        {"offset": 2, "base64": "AAE="}, {"offset": 3, "base64": ""}]


async def test_never_written_partition_is_an_empty_log(http: httpx.AsyncClient,
                                                        topic: str) -> None:
    r = await http.post("/consume", json=consume_body(topic, 0))
    (c,) = r.json()["results"]
    assert c == {"topic": topic, "partition": 0, "ok": True, "outcome": "success",
                 "high_watermark": 0,
                 "log_start_offset": 1, "next_offset": 1, "records": []}


def _bad_produce_bodies(topic: str) -> list[tuple[str, Any]]:
    good = {"topic": topic, "partition": 0, "records": ["fine"]}
    return [
        ("empty list", {"topic_partitions": []}),
        ("missing list", {}),
        ("not an object", [good]),
        ("unknown top-level field", {"topic_partitions": [good], "x": 1}),
        ("records empty", {"topic_partitions": [{**good, "records": []}]}),
        ("records missing", {"topic_partitions": [{"topic": topic, "partition": 0}]}),
        ("partition as string", {"topic_partitions": [{**good, "partition": "0"}]}),
        ("partition negative", {"topic_partitions": [{**good, "partition": -1}]}),
        ("partition too large", {"topic_partitions": [{**good, "partition": 2**31}]}),
        ("partition bool", {"topic_partitions": [{**good, "partition": True}]}),
        # (0.0 is the integer 0, as JSON Schema counts it; a fraction is not.)
        ("partition fraction", {"topic_partitions": [{**good, "partition": 0.5}]}),
        ("record number", {"topic_partitions": [{**good, "records": ["ok", 1]}]}),
        ("record null", {"topic_partitions": [{**good, "records": [None]}]}),
        ("record bad base64", {"topic_partitions": [{**good, "records": [{"base64": "!!"}]}]}),
        ("record extra field",
         {"topic_partitions": [{**good, "records": [{"base64": "AAE=", "x": 1}]}]}),
        ("record empty object", {"topic_partitions": [{**good, "records": [{}]}]}),
        ("topic empty", {"topic_partitions": [{**good, "topic": ""}]}),
        ("topic slash", {"topic_partitions": [{**good, "topic": "a/b"}]}),
        ("topic dot", {"topic_partitions": [{**good, "topic": "."}]}),
        ("topic dotdot", {"topic_partitions": [{**good, "topic": ".."}]}),
        ("topic too long", {"topic_partitions": [{**good, "topic": "t" * 250}]}),
        ("topic number", {"topic_partitions": [{**good, "topic": 7}]}),
        ("one bad entry among good ones", {"topic_partitions": [
            good, {**good, "partition": 1, "records": [1]}]}),
    ]


async def test_every_invalid_produce_is_400_and_writes_nothing(
    http: httpx.AsyncClient, topic: str
) -> None:
    for name, body in _bad_produce_bodies(topic):
        r = await http.post("/produce", json=body)
        assert r.status_code == 400, (name, r.status_code, r.text)
        err = r.json()
        assert err["error_type"] == "InvalidRequest", name
        assert err["error"] and err["details"], name
    for raw in (b"{not json", b"", b"\xff\xfe"):
        r = await http.post("/produce", content=raw,
                            headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
    assert await high_watermark(http, topic, 0) == 0
    assert await high_watermark(http, topic, 1) == 0


async def test_validation_errors_say_where(http: httpx.AsyncClient, topic: str) -> None:
    r = await http.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": "0", "records": ["a"]}]})
    assert r.status_code == 400
    assert [d["loc"] for d in r.json()["details"]] == ["topic_partitions.0.partition"]


async def test_limits_are_413_and_write_nothing(http: httpx.AsyncClient, topic: str) -> None:
    too_big = produce_body(topic, "x" * (LIMIT_BODY + 1))
    r = await http.post("/produce", json=too_big)
    assert r.status_code == 413 and r.json()["error_type"] == "PayloadTooLarge"

    # Streamed without Content-Length: counted as it arrives.
    async def chunks() -> AsyncIterator[bytes]:
        data = json.dumps(too_big).encode()
        for i in range(0, len(data), 65536):
            yield data[i:i + 65536]

    r = await http.post("/produce", content=chunks(),
                        headers={"content-type": "application/json"})
    assert r.status_code == 413

    r = await http.post("/produce", json=produce_body(topic, *(["r"] * 1001)))
    assert r.status_code == 413 and "1001 records" in r.json()["error"]
    r = await http.post("/produce", json=produce_body(topic, "y" * 65537))
    assert r.status_code == 413 and "65537 bytes" in r.json()["error"]
    assert await high_watermark(http, topic) == 0


async def test_unknown_paths_and_methods(http: httpx.AsyncClient) -> None:
    r = await http.get("/nope")
    assert r.status_code == 404 and r.json()["error_type"] == "NotFound"
    r = await http.post("/produce/extra", json={})
    assert r.status_code == 404
    r = await http.get("/produce")
    assert r.status_code == 405


async def test_consume_errors(http: httpx.AsyncClient, topic: str) -> None:
    await http.post("/produce", json=produce_body(topic, "a", "b"))
    await http.post("/produce", json=produce_body(topic, "a", "b", partition=1))
    r = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 4},
        {"topic": topic, "partition": 1, "fetch_offset": 3},
    ], "max_wait_ms": 0})
    assert r.status_code == 200
    beyond, tail = r.json()["results"]
    assert beyond["ok"] is False and beyond["error_type"] == "OffsetOutOfRange"
    assert tail["ok"] is True and tail["records"] == [] and tail["next_offset"] == 3

    bad = [
        {"topic_partitions": []},
        {"topic_partitions": [{"topic": topic, "partition": 0}]},
        {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": -1}]},
        {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": "1"}]},
        consume_body(topic, max_wait_ms=20001),
        consume_body(topic, max_wait_ms=-1),
        consume_body(topic, max_bytes=0),
        consume_body(topic, encoding="hex"),
        {**consume_body(topic), "unknown": True},
        {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1}] * 2},
        consume_body(topic, max_bytes=64 * 1024 * 1024 + 1),
        {"topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1,
                               "partition_max_bytes": 64 * 1024 * 1024 + 1}]},
    ]
    for body in bad:
        r = await http.post("/consume", json=body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error_type"] == "InvalidRequest"
    many = {"topic_partitions": [{"topic": topic, "partition": p, "fetch_offset": 1}
                                 for p in range(1001)], "max_wait_ms": 0}
    r = await http.post("/consume", json=many)
    assert r.status_code == 413 and r.json()["error_type"] == "PayloadTooLarge"


async def test_consume_budgets_keep_the_first_record(http: httpx.AsyncClient, topic: str
                                                     ) -> None:
    await http.post("/produce", json=produce_body(topic, "a" * 100, "b" * 10, "c" * 10))
    r = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 1, "partition_max_bytes": 5}],
        "max_wait_ms": 0})
    (c,) = r.json()["results"]
    assert [rec["offset"] for rec in c["records"]] == [1] and c["next_offset"] == 2
    r = await http.post("/consume", json=consume_body(topic, 2, max_bytes=15))
    (c,) = r.json()["results"]
    assert [rec["offset"] for rec in c["records"]] == [2] and c["next_offset"] == 3


@pytest.fixture(scope="module")
def patient(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker that lets a long-poll wait longer than any test here does: a poll that
    answers within a test's bound was answered by an event, not by running out."""
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("patient"))
    yield factory.start(max_wait_ms_ceiling=str(NEVER_MS))
    factory.stop_all()


async def test_long_poll_wakes_on_a_write(patient: Broker, topic: str) -> None:
    # The poll parks, then the write lands, then the poll answers with it; had the write
    # not woken it, it would still be waiting when the bound (which only catches that
    # hang) ends it.
    async with httpx.AsyncClient(base_url=patient.url, timeout=60) as http:
        got = await woken_by_a_write(http, http, topic, "wake")
    assert without_times(got["records"]) == [{"offset": 1, "value": "wake"}]


async def test_min_bytes_zero_and_max_wait_zero_answer_at_once(patient: Broker,
                                                               topic: str) -> None:
    # Nothing to wait for: an answer within the bound (which only catches a wait to the
    # end of max_wait) is an answer at once.
    async with httpx.AsyncClient(base_url=patient.url, timeout=60) as http:
        with anyio.fail_after(60):
            r = await http.post("/consume", json=consume_body(topic, 1, max_wait_ms=NEVER_MS,
                                                              min_bytes=0))
            assert r.status_code == 200 and r.json()["results"][0]["records"] == []
            r = await http.post("/consume", json=consume_body(topic, 1, max_wait_ms=0))
            assert r.status_code == 200 and r.json()["results"][0]["records"] == []


async def test_health_metrics_and_openapi(http: httpx.AsyncClient, broker: Broker,
                                          topic: str) -> None:
    r = await http.get("/health")
    assert r.status_code == 200
    health = r.json()
    assert set(health) == {"status", "broker_id", "host", "port", "started_at_ms"}
    assert health["status"] == "ok" and health["broker_id"] == broker.env["LLOG_BROKER_ID"]
    assert health["port"] == int(broker.url.rsplit(":", 1)[1])

    await http.post("/produce", json=produce_body(topic, "m"))
    snapshot = (await http.get("/metrics")).json()
    assert snapshot["broker_id"] == broker.env["LLOG_BROKER_ID"]
    assert snapshot["roles"] == ["write", "read", "compact"]
    metrics = snapshot["metrics"]
    assert metrics["llog_produce_records_total"][""] >= 1
    assert metrics["llog_batcher_flushes_total"][""] >= 1
    assert metrics["llog_s3_requests_total"]["op=put,outcome=ok"] >= 1
    assert "llog_s3_estimated_request_cost_usd_total" in metrics
    # What compression saves: the bucket uncompressed, and its price (nothing stored
    # compressed yet: the same bytes, nothing saved).
    assert metrics["llog_s3_estimated_raw_bytes"][""] == metrics["llog_s3_stored_bytes"][""]
    assert metrics["llog_s3_estimated_storage_saved_usd_per_month"][""] == 0

    text = (await http.get("/metrics/prometheus")).text
    for name in ("llog_broker_info", "llog_produce_records_total", "llog_oxia_requests_total",
                 "llog_oxia_request_seconds_bucket", "llog_batcher_flush_seconds_bucket",
                 "llog_s3_stored_bytes", "llog_http_requests_total"):
        assert name in text, name

    spec = (await http.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    for name in ("ProduceRequest", "ProduceResults", "ConsumeRequest", "ConsumeResults",
                 "ErrorResponse", "HealthResponse", "Base64Record"):
        assert name in schemas, name
    produce_op = spec["paths"]["/produce"]["post"]
    assert set(produce_op["responses"]) >= {"200", "400", "409", "413", "503"}
    assert "422" not in produce_op["responses"]



async def test_too_many_produce_entries_are_413(http: httpx.AsyncClient, topic: str) -> None:
    body = {"topic_partitions": [{"topic": topic, "partition": p % 4, "records": ["x"]}
                                 for p in range(1001)]}
    r = await http.post("/produce", json=body)
    assert r.status_code == 413 and r.json()["error_type"] == "PayloadTooLarge"
    assert "1001 entries" in r.json()["error"]
    assert await high_watermark(http, topic) == 0


async def test_the_total_budget_is_shared_in_request_order(http: httpx.AsyncClient,
                                                           topic: str) -> None:
    for p in (0, 1):
        r = await http.post("/produce", json=produce_body(topic, *["v" * 100] * 10,
                                                          partition=p))
        assert r.status_code == 200
    r = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "fetch_offset": 1},
        {"topic": topic, "partition": 1, "fetch_offset": 1}],
        "max_wait_ms": 0, "max_bytes": 550})
    first, second = r.json()["results"]
    assert [x["offset"] for x in first["records"]] == [1, 2, 3, 4, 5]
    assert second["records"] == [] and second["next_offset"] == 1  # left for next time
    # A record larger than the whole budget still comes, when it is the first.
    r = await http.post("/consume", json={"topic_partitions": [
        {"topic": topic, "partition": 1, "fetch_offset": 1},
        {"topic": topic, "partition": 0, "fetch_offset": 6}],
        "max_wait_ms": 0, "max_bytes": 50})
    second, first = r.json()["results"]
    assert [x["offset"] for x in second["records"]] == [1] and first["records"] == []


async def test_records_with_keys_headers_and_timestamps(http: httpx.AsyncClient,
                                                       topic: str) -> None:
    records = [
        "plain",
        {"value": "order created", "key": "customer-17",
         "headers": [{"name": "trace", "value": "abc"}, {"name": "bin", "base64": "AAE="}],
         "timestamp_ms": 1_700_000_000_000},
        {"value": {"base64": "AAE="}, "key": {"base64": "AP8="}},
        {"value": "just a value"},
    ]
    r = await http.post("/produce", json={"topic_partitions": [
        {"topic": topic, "partition": 0, "records": records}]})
    assert r.status_code == 200, r.text
    r = await http.post("/consume", json=consume_body(topic, 1, max_wait_ms=0))
    got = without_times(r.json()["results"][0]["records"])
    assert got == [
        {"offset": 1, "value": "plain"},
        {"offset": 2, "value": "order created", "key": "customer-17",
         "headers": [{"name": "trace", "value": "abc"}, {"name": "bin", "base64": "AAE="}],
         "timestamp_ms": 1_700_000_000_000},
        {"offset": 3, "base64": "AAE=", "key_base64": "AP8="},
        {"offset": 4, "value": "just a value"},
    ]


async def test_oversized_or_malformed_keys_and_headers_write_nothing(
        http: httpx.AsyncClient, topic: str) -> None:
    def entry(record: Any) -> dict[str, Any]:
        return {"topic_partitions": [{"topic": topic, "partition": 0, "records": [record]}]}

    too_big = [
        {"value": "v", "key": "k" * (16 * 1024 + 1)},
        {"value": "v", "headers": [{"name": f"h{i}", "value": "x"} for i in range(65)]},
    ]
    for record in too_big:
        r = await http.post("/produce", json=entry(record))
        assert r.status_code == 413 and r.json()["error_type"] == "PayloadTooLarge", r.text
    bad = [
        {"value": "v", "headers": [{"name": "h", "value": "x", "base64": "AAE="}]},
        {"value": "v", "headers": [{"name": "h"}]},
        {"value": "v", "headers": [{"name": "", "value": "x"}]},
        {"value": "v", "timestamp_ms": -1},
        {"value": "v", "key": "\ud800"},
        {"key": "k"},
        {"value": "v", "unknown": 1},
    ]
    for record in bad:
        r = await http.post("/produce", content=json.dumps(entry(record)),
                            headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error_type"] == "InvalidRequest", record
    assert await high_watermark(http, topic) == 0
