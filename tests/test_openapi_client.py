"""A client generated from /openapi.json works against a real broker."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx

from tests.helpers.stack import Broker


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
