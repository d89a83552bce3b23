"""A client generated from /openapi.json works against a real broker."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from tests.helpers.auth import Keys
from tests.helpers.stack import Broker, BrokerFactory


def _generate(spec: dict[str, object], tmp_path: Path) -> ModuleType:
    source = tmp_path / "openapi.json"
    source.write_text(json.dumps(spec))
    target = tmp_path / "llog_client_models.py"
    subprocess.run(
        [sys.executable, "-m", "datamodel_code_generator", "--input", str(source),
         "--input-file-type", "openapi", "--output", str(target),
         "--output-model-type", "pydantic_v2.BaseModel", "--formatters", "builtin",
         "--set-default-enum-member"],
        check=True, capture_output=True, text=True, timeout=120,
    )
    spec_obj = importlib.util.spec_from_file_location("llog_client_models", target)
    assert spec_obj is not None and spec_obj.loader is not None
    module = importlib.util.module_from_spec(spec_obj)
    sys.modules["llog_client_models"] = module  # pydantic resolves annotations through it
    try:
        spec_obj.loader.exec_module(module)
    finally:
        del sys.modules["llog_client_models"]
    return module


def test_generated_models_round_trip_through_the_broker(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        request = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["alpha", m.Base64Record(base64="AAE=")])])
        r = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        produced = m.ProduceResponse.model_validate(r.json())
        # Results are a union discriminated on ok: success and failure are two classes.
        (written,) = [result.root for result in produced.results]
        assert isinstance(written, m.ProduceSuccess) and written.end_offset == 2

        consume = m.ConsumeRequest(topic_partitions=[m.ConsumeTopicPartition(
            topic=topic, partition=0, fetch_offset=1)], max_wait_ms=0)
        r = http.post("/consume", content=consume.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        consumed = m.ConsumeResponse.model_validate(r.json())
        records = consumed.results[0].root.records
        assert [(x.offset, x.value, x.base64) for x in records] == [
            (1, "alpha", None), (2, None, "AAE=")]

        r = http.post("/produce", json={"topic_partitions": []})
        error = m.ErrorResponse.model_validate(r.json())
        assert r.status_code == 400 and error.error_type.value == "InvalidRequest"


def test_generated_models_cover_records_topics_and_offsets(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        created = http.post("/topics", content=m.TopicCreateRequest(
            topic=topic, partitions=4, retention_ms=86_400_000).model_dump_json(
            exclude_none=True), headers={"content-type": "application/json"})
        assert created.status_code == 201, created.text
        assert m.TopicInfo.model_validate(created.json()).partitions == 4

        record = m.RecordObject(value="order created", key="customer-17",
                                headers=[m.Header(name="trace", value="abc")],
                                timestamp_ms=1_700_000_000_000)
        request = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, records=[record], idempotency_key="order-1")])
        r = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        (result,) = [x.root for x in m.ProduceResponse.model_validate(r.json()).results]
        again = http.post("/produce", content=request.model_dump_json(exclude_none=True),
                          headers={"content-type": "application/json"})
        (retried,) = [x.root for x in m.ProduceResponse.model_validate(again.json()).results]
        assert retried.duplicate and retried.start_offset == result.start_offset

        query = m.OffsetsRequest(topic_partitions=[m.OffsetsTopicPartition(
            topic=topic, partition=result.partition, timestamp_ms=0)])
        r = http.post("/offsets", content=query.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        (found,) = [x.root for x in m.OffsetsResponse.model_validate(r.json()).results]
        assert (found.log_start_offset, found.high_watermark, found.offset) == (1, 1, 1)

        consume = m.ConsumeRequest(topic_partitions=[m.ConsumeTopicPartition(
            topic=topic, partition=result.partition, fetch_offset="earliest")], max_wait_ms=0)
        r = http.post("/consume", content=consume.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        (got,) = m.ConsumeResponse.model_validate(r.json()).results[0].root.records
        assert (got.value, got.key, got.timestamp_ms) == ("order created", "customer-17",
                                                          1_700_000_000_000)
        assert got.headers[0].name == "trace" and got.append_time_ms > 0


def test_generated_models_join_a_group_consume_committed_and_commit(
    broker: Broker, tmp_path: Path, topic: str
) -> None:
    headers = {"content-type": "application/json"}
    group = f"g-{topic}"
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        m = _generate(http.get("/openapi.json").json(), tmp_path)
        produce = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["a", "b", "c"])])
        assert http.post("/produce", content=produce.model_dump_json(exclude_none=True),
                         headers=headers).status_code == 200
        r = http.post(f"/groups/{group}/join", headers=headers, content=m.JoinRequest(
            topics=[topic], client_id="generated").model_dump_json(exclude_none=True))
        assert r.status_code == 200, r.text
        member = m.MemberAssignment.model_validate(r.json())
        assert [(a.topic, a.partitions) for a in member.assignment] == [(topic, [0])]

        def consume() -> list[int]:
            request = m.ConsumeRequest(
                topic_partitions=[m.ConsumeTopicPartition(
                    topic=topic, partition=0, fetch_offset="committed")],
                group=group, max_wait_ms=0)
            r = http.post("/consume", content=request.model_dump_json(exclude_none=True),
                          headers=headers)
            assert r.status_code == 200, r.text
            (result,) = m.ConsumeResponse.model_validate(r.json()).results
            assert isinstance(result.root, m.ConsumeSuccess), result
            return [x.offset for x in result.root.records]

        assert consume() == [1, 2, 3]
        commit = m.CommitRequest(member_id=member.member_id, generation=member.generation,
                                 offsets=[m.CommitOffset(topic=topic, partition=0, offset=2)])
        r = http.post(f"/groups/{group}/commit", headers=headers,
                      content=commit.model_dump_json(exclude_none=True))
        assert r.status_code == 200, r.text
        (done,) = m.OffsetResults.model_validate(r.json()).results
        assert done.ok and done.offset == 2
        assert consume() == [3]

        described = m.GroupDescription.model_validate(http.get(f"/groups/{group}").json())
        (state,) = described.partitions
        assert (state.committed_offset, state.high_watermark, state.lag) == (2, 3, 1)
        assert described.members[0].client_id == "generated"
        r = http.post(f"/groups/{group}/heartbeat", headers=headers,
                      content=m.MemberRequest(member_id=member.member_id).model_dump_json())
        assert m.MemberAssignment.model_validate(r.json()).generation == member.generation
        r = http.post(f"/groups/{group}/leave", headers=headers,
                      content=m.MemberRequest(member_id=member.member_id).model_dump_json())
        assert m.LeaveResponse.model_validate(r.json()).left


def _credentials(spec: dict[str, Any], path: str, method: str, token: str) -> dict[str, str]:
    """What a generated client sends for an operation: for each HTTP bearer scheme the
    operation's security requirement names, ``Authorization: Bearer <token>``."""
    headers: dict[str, str] = {}
    schemes = spec.get("components", {}).get("securitySchemes", {})
    for requirement in spec["paths"][path][method].get("security", []):
        for name in requirement:
            if (schemes[name]["type"], schemes[name]["scheme"]) == ("http", "bearer"):
                headers["authorization"] = f"Bearer {token}"
    return headers


def test_a_generated_client_sends_its_token_to_a_broker_with_auth_on(
    brokers: BrokerFactory, tmp_path: Path, topic: str
) -> None:
    keys = Keys()
    token = keys.new("app")
    auth_file = tmp_path / "auth.toml"
    stored = keys.entries["app"]
    auth_file.write_text(f'[principals.app]\nkeys = ["{stored}"]\nproduce = ["{topic}"]\n')
    broker = brokers.start(auth="on", auth_file=str(auth_file))
    with httpx.Client(base_url=broker.url, timeout=30) as http:
        spec = http.get("/openapi.json").json()
        m = _generate(spec, tmp_path)
        body = m.ProduceRequest(topic_partitions=[m.ProduceTopicPartition(
            topic=topic, partition=0, records=["alpha"])]).model_dump_json(exclude_none=True)
        credentials = _credentials(spec, "/produce", "post", token)
        assert credentials, "the document declares no bearer scheme for /produce"
        r = http.post("/produce", content=body,
                      headers={"content-type": "application/json", **credentials})
        assert r.status_code == 200, r.text
        (written,) = m.ProduceResponse.model_validate(r.json()).results
        assert isinstance(written.root, m.ProduceSuccess) and written.root.end_offset == 1

        r = http.post("/produce", content=body, headers={"content-type": "application/json"})
        error = m.ErrorResponse.model_validate(r.json())
        assert r.status_code == 401 and error.error_type.value == "Unauthenticated"
        assert r.headers["www-authenticate"] == 'Bearer realm="llog"'
