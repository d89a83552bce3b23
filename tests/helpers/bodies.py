"""Request bodies for the broker's HTTP API."""

from __future__ import annotations

from typing import Any


def produce_body(topic: str, *records: Any, partition: int = 0) -> dict[str, Any]:
    return {"topic_partitions": [{"topic": topic, "partition": partition,
                                  "records": list(records)}]}


def consume_body(topic: str, offset: int = 1, partition: int = 0, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"topic_partitions": [
        {"topic": topic, "partition": partition, "fetch_offset": offset}]}
    body.setdefault("max_wait_ms", 0)
    body.update(extra)
    return body
