"""Structured logs (LLOG_LOG_FORMAT=json), request ids, and S3 credentials that never
show in logs, metrics or error bodies."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.localstack.stack import LocalStack
from app.telemetry.logs import REDACTED, REQUEST_FIELDS, AccessFields, RequestFields, formatter
from app.telemetry.request_id import accepted_id
from tests.helpers.bodies import produce_body
from tests.helpers.stack import Broker, BrokerFactory

SECRET = 'se"cret\\key'


def _record(message: str, *args: Any, name: str = "app.x") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)


def test_a_json_line_has_the_fields_and_the_request() -> None:
    token = REQUEST_FIELDS.set({"request_id": "r-1", "method": "POST", "path": "/produce"})
    try:
        record = _record("hello %s", "world")
        RequestFields().filter(record)
    finally:
        REQUEST_FIELDS.reset(token)
    line = json.loads(formatter("json").format(record))
    assert line["message"] == "hello world" and line["level"] == "WARNING"
    assert line["logger"] == "app.x" and line["time"].endswith("+00:00")
    assert (line["request_id"], line["method"], line["path"]) == ("r-1", "POST", "/produce")
    outside = _record("no request")
    RequestFields().filter(outside)
    assert "request_id" not in json.loads(formatter("json").format(outside))


def test_access_lines_have_their_own_fields() -> None:
    record = _record('%s - "%s %s HTTP/%s" %d', "1.2.3.4:5", "GET", "/health", "1.1", 200,
                     name="uvicorn.access")
    AccessFields().filter(record)
    line = json.loads(formatter("json").format(record))
    assert (line["client"], line["method"], line["path"], line["status"]) == (
        "1.2.3.4:5", "GET", "/health", 200)


@pytest.mark.parametrize("kind", ["json", "text", "uvicorn"])
def test_secrets_are_redacted_in_every_format(kind: str) -> None:
    text = formatter(kind, [SECRET, "AKIA-ACCESS"]).format(
        _record("key %s and %s", SECRET, "AKIA-ACCESS"))
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text
    assert "AKIA-ACCESS" not in text and text.count(REDACTED) == 2


@pytest.mark.parametrize(("given", "accepted"), [
    (b"4bf92f35-77b3-4da6-a3ce-929d0e0e4736", True),
    (b"Root=1-67891233-abcdef012345678912345678;Parent=53995c3f42cd8ad8", True),
    (b"", False),
    (b"x" * 129, False),
    (b"has space", False),
    (b'quote"', False),
    (b"line\nbreak", False),
    ("caf\u00e9".encode(), False),
])
def test_request_ids_are_validated(given: bytes, accepted: bool) -> None:
    assert (accepted_id(given, 128) == given.decode("latin-1")) is accepted


# -- a live broker ----------------------------------------------------------------------


def _lines(broker: Broker, logs: Path) -> list[dict[str, Any]]:
    text = (logs / f"{broker.env['LLOG_BROKER_ID']}.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_a_json_logging_broker_tags_every_line_of_a_request(
        brokers: BrokerFactory, topic: str, tmp_path: Path) -> None:
    broker = brokers.start(log_level="info", log_format="json", max_records_per_request="2")
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        refused = await client.post("/produce", json=produce_body(topic, "a", "b", "c"),
                                    headers={"X-Request-ID": "req-413"})
        long_id = await client.get("/health", headers={"X-Request-ID": "x" * 300})
        generated = await client.get("/health")
    assert refused.status_code == 413 and refused.headers["x-request-id"] == "req-413"
    assert len(long_id.headers["x-request-id"]) == 32  # replaced by a generated one
    assert generated.headers["x-request-id"] != long_id.headers["x-request-id"]
    broker.process.stop()  # every line is written

    lines = _lines(broker, tmp_path / "logs")  # each one JSON, or this fails
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    of_request = [line for line in lines if line.get("request_id") == "req-413"]
    assert {line["logger"] for line in of_request} == {"app.routes.errors", "uvicorn.access"}
    assert all(line["method"] == "POST" and line["path"] == "/produce" for line in of_request)
    access = next(line for line in of_request if line["logger"] == "uvicorn.access")
    assert access["status"] == 413 and access["client"].startswith("127.0.0.1:")
    assert any(line.get("request_id") == generated.headers["x-request-id"] for line in lines)


async def test_s3_credentials_never_show(brokers: BrokerFactory, stack: LocalStack,
                                         topic: str, tmp_path: Path) -> None:
    secrets = (stack.config.secret_key, stack.config.access_key)
    broker = brokers.start(log_level="debug", log_format="json")
    shown: list[str] = []
    async with httpx.AsyncClient(base_url=broker.url, timeout=30) as client:
        for method, path, body in (
                ("POST", "/produce", produce_body(topic, "a")),
                ("POST", "/produce", {"topic_partitions": "nope"}),
                ("POST", "/consume", {"topic_partitions": [{"topic": topic}]}),
                ("GET", "/nowhere", None), ("DELETE", "/produce", None),
                ("GET", "/health", None), ("GET", "/metrics", None),
                ("GET", "/metrics/prometheus", None), ("GET", "/openapi.json", None)):
            r = await client.request(method, path, json=body)
            shown.append(f"{r.status_code} {r.headers} {r.text}")
        shown.append((await client.post("/produce", content=b"{not json",
                                         headers={"content-type": "application/json"})).text)
    broker.process.stop()
    shown.append((tmp_path / "logs" / f"{broker.env['LLOG_BROKER_ID']}.log").read_text())
    assert any(" 400 " in s or s.startswith("400") for s in shown)
    for text in shown:
        for secret in secrets:
            assert secret not in text
