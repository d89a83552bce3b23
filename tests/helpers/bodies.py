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


def without_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consumed records without ``append_time_ms`` (checked to be there), for comparing
    the rest exactly."""
    out = []
    for record in records:
        rest = dict(record)
        assert isinstance(rest.pop("append_time_ms"), int), record
        out.append(rest)
    return out
