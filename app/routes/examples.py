"""Named examples of the produce and consume bodies for the OpenAPI document, one per
case a client meets (``{name: body}``); the models carry one example of each schema."""

from __future__ import annotations

from typing import Any

from app.routes.models import CONSUMED, FENCED, OUT_OF_RANGE, PRODUCED

KEYED_RECORD = {"value": "order created", "key": "customer-17",
                "headers": [{"name": "trace-id", "value": "4bf92f35"}],
                "timestamp_ms": 1760000000000}

PRODUCE_REQUESTS: dict[str, Any] = {
    "text and binary values to one partition": {"topic_partitions": [
        {"topic": "orders", "partition": 0, "records": ["alpha", {"base64": "AAE="}]}]},
    "a keyed record, its partition chosen by the key, sent idempotently": {
        "topic_partitions": [{"topic": "orders", "idempotency_key": "order-4711",
                              "records": [KEYED_RECORD]}]},
    "several partitions in one request": {"topic_partitions": [
        {"topic": "orders", "partition": 0, "records": ["a", "b"]},
        {"topic": "audit", "partition": 3, "records": ["x"]}]},
}
PRODUCE_WRITTEN: dict[str, Any] = {
    "written": {"results": [PRODUCED], "success_count": 1, "error_count": 0},
    "a retry answered from its idempotency key": {
        "results": [{**PRODUCED, "duplicate": True}], "success_count": 1, "error_count": 0},
}
PRODUCE_PARTLY: dict[str, Any] = {
    "one entry written, one refused": {"results": [PRODUCED, FENCED], "success_count": 1,
                                       "error_count": 1},
    "in doubt: retry with the same idempotency key": {"results": [{
        **FENCED, "error_type": "CommitInDoubt", "retriable": True, "maybe_written": True,
        "error": "audit/3: the commit's outcome could not be settled"}],
        "success_count": 0, "error_count": 1},
}
PRODUCE_REFUSED: dict[str, Any] = {
    "back-pressure: every entry refused": {"results": [{
        **FENCED, "error_type": "BackPressureRejected", "retriable": True,
        "error": "the produce buffer is full"}], "success_count": 0, "error_count": 1},
    "the topic catalog could not be read": {
        "error_type": "StorageUnavailable", "error": "Oxia get timed out"},
}

CONSUME_REQUESTS: dict[str, Any] = {
    "from the start, without waiting": {"topic_partitions": [
        {"topic": "orders", "partition": 0, "fetch_offset": "earliest"}], "max_wait_ms": 0},
    "long-poll the tail for up to 10 s": {"topic_partitions": [
        {"topic": "orders", "partition": 0, "fetch_offset": 3,
         "partition_max_bytes": 1048576}],
        "max_wait_ms": 10000, "min_bytes": 1, "max_bytes": 4194304},
    "every record as base64": {"topic_partitions": [
        {"topic": "orders", "partition": 0, "fetch_offset": 1}], "encoding": "base64"},
}
CONSUMED_ANSWERS: dict[str, Any] = {
    "records": {"results": [CONSUMED]},
    "at the tail: nothing new yet": {"results": [{
        **CONSUMED, "next_offset": 3, "records": []}]},
    "one partition read, one out of range": {"results": [CONSUMED, OUT_OF_RANGE]},
}
