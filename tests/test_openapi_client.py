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
        assert produced.results[0].ok and produced.results[0].end_offset == 2

        consume = m.ConsumeRequest(topic_partitions=[m.ConsumeTopicPartition(
            topic=topic, partition=0, fetch_offset=1)], max_wait_ms=0)
        r = http.post("/consume", content=consume.model_dump_json(exclude_none=True),
                      headers={"content-type": "application/json"})
        consumed = m.ConsumeResponse.model_validate(r.json())
        records = consumed.results[0].records
        assert [(x.offset, x.value, x.base64) for x in records] == [
            (1, "alpha", None), (2, None, "AAE=")]

        r = http.post("/produce", json={"topic_partitions": []})
        error = m.ErrorResponse.model_validate(r.json())
        assert r.status_code == 400 and error.error_type.value == "InvalidRequest"
