"""The client's logic without a broker: how records become requests, how answers become
results and errors, and how long it waits before a retry."""

from __future__ import annotations

import base64
import json

import pytest

from llog_client import _errors as errors
from llog_client import _ops as ops
from llog_client import _wire as wire
from llog_client._batching import KeySource, plan_requests, request_body
from llog_client._models import Record, TopicDescription, TopicInfo
from llog_client._retry import ProduceLimits, RetryPolicy
from llog_client._wire import Broken, Reply


def _bodies(records: list[object], partition: int | None = 0, **limits: int) -> list[dict]:
    plan = plan_requests("t", records, partition, ProduceLimits(**limits),  # type: ignore[arg-type]
                         KeySource("k"))
    return [json.loads(request_body(entries)) for entries in plan]


def test_records_fill_requests_up_to_the_record_limit_with_one_key_per_entry() -> None:
    bodies = _bodies([f"r{i}" for i in range(25)], max_records_per_request=10)
    assert [len(b["topic_partitions"][0]["records"]) for b in bodies] == [10, 10, 5]
    keys = [b["topic_partitions"][0]["idempotency_key"] for b in bodies]
    assert keys == ["k.0", "k.1", "k.2"]
    assert bodies[2]["topic_partitions"][0]["records"][-1] == "r24"


def test_requests_stay_under_the_byte_limit_and_a_huge_record_goes_alone() -> None:
    records = ["x" * 300] * 10 + ["y" * 5000] + ["z"]
    bodies = _bodies(records, max_request_bytes=1500)
    for body in bodies:
        size = len(json.dumps(body, separators=(",", ":")))
        assert size <= 1500 or body["topic_partitions"][0]["records"] == ["y" * 5000]
    flat = [r for b in bodies for e in b["topic_partitions"] for r in e["records"]]
    assert flat == records


def test_records_are_text_when_utf8_and_base64_otherwise() -> None:
    (body,) = _bodies(["héllo", b"\xff\x00",
                       Record(b"v", key=b"\x80", headers=[("h", "x"), ("b", b"\xfe")],
                              timestamp_ms=5)])
    first, binary, full = body["topic_partitions"][0]["records"]
    assert first == "héllo"
    assert binary == {"base64": base64.b64encode(b"\xff\x00").decode()}
    assert full == {"value": "v", "key": {"base64": "gA=="}, "timestamp_ms": 5,
                    "headers": [{"name": "h", "value": "x"}, {"name": "b", "base64": "/g=="}]}


def test_without_a_partition_consecutive_records_of_one_key_share_an_entry() -> None:
    records = [Record("a", key="k1"), Record("b", key="k1"), Record("c", key="k2"), "plain"]
    (body,) = _bodies(records, partition=None)
    entries = body["topic_partitions"]
    assert [len(e["records"]) for e in entries] == [2, 1, 1]
    assert "partition" not in entries[0] and "partition" not in entries[1]
    assert entries[2]["partition"] == 0  # keyless records need a partition


def test_entry_limit_starts_a_new_request() -> None:
    records = [Record(str(i), key=str(i)) for i in range(5)]
    bodies = _bodies(records, partition=None, max_entries_per_request=2)
    assert [len(b["topic_partitions"]) for b in bodies] == [2, 2, 1]


def test_idempotency_key_prefix_is_checked() -> None:
    with pytest.raises(ValueError, match="printable"):
        KeySource("has space")
    assert KeySource().next() != KeySource().next()  # random prefixes differ


def test_retry_delay_grows_is_capped_and_honours_retry_after() -> None:
    policy = RetryPolicy(initial_backoff_s=0.1, multiplier=2, max_backoff_s=1.0,
                         max_retry_after_s=10)
    assert 0.05 <= policy.delay_s(0) < 0.1
    assert 0.4 <= policy.delay_s(3) < 0.8
    assert 0.5 <= policy.delay_s(30) < 1.0
    assert policy.delay_s(0, retry_after_s=3) == 3
    assert policy.delay_s(0, retry_after_s=3600) == 10
    assert wire.parse_retry_after("2") == 2 and wire.parse_retry_after("soon") is None


def test_every_error_type_of_the_broker_has_its_class_in_the_client() -> None:
    from app.errors import error_types
    from app.routes.error_types import ERROR_TYPE_NAMES as ERROR_TYPES

    assert {c.__name__ for c in error_types()} <= set(errors.ERROR_CLASSES)
    assert set(ERROR_TYPES) <= set(errors.ERROR_CLASSES)
    conflict = wire.reply_error(Reply(409, {"error_type": "StaleGeneration", "error": "g"}))
    assert isinstance(conflict, errors.GroupConflict) and not conflict.retriable


def test_error_bodies_map_to_their_classes() -> None:
    reply = Reply(400, {"error_type": "InvalidRequest", "error": "bad",
                        "details": [{"loc": "topic_partitions.0.topic", "msg": "no"}]})
    exc = wire.reply_error(reply)
    assert type(exc) is errors.InvalidRequest and not exc.retriable
    assert exc.details == (("topic_partitions.0.topic", "no"),) and exc.status == 400
    later = wire.reply_error(Reply(503, {"error_type": "SomethingNew", "error": "x"}))
    assert type(later) is errors.Unavailable and later.error_type == "SomethingNew"
    assert later.retriable
    proxy = wire.reply_error(Reply(502, None, text="<html>bad gateway</html>"))
    assert isinstance(proxy, errors.UnexpectedResponse) and proxy.retriable


def test_failed_entries_keep_the_brokers_flags() -> None:
    result = {"topic": "t", "partition": 3, "ok": False, "error_type": "CommitInDoubt",
              "error": "unsettled", "retriable": True, "maybe_written": True}
    exc = wire.entry_error(result, Reply(409, None))
    assert isinstance(exc, errors.CommitInDoubt) and exc.maybe_written
    assert (exc.topic, exc.partition) == ("t", 3)
    assert str(exc) == "CommitInDoubt: t/3: unsettled"


def _drive(op: ops.Op[object], answers: list[wire.Outcome]) -> tuple[object, list[object]]:
    """Run an operation against scripted answers; its result and the actions it took."""
    actions: list[object] = []
    answer: wire.Outcome | None = None
    while True:
        try:
            action = op.send(answer)
        except StopIteration as stop:
            return stop.value, actions
        actions.append(action)
        answer = answers.pop(0) if isinstance(action, ops.Send) else None


def test_produce_resends_only_failed_entries_with_their_keys() -> None:
    records = [Record("a", key="x"), Record("b", key="y")]
    op = ops.produce("t", records, None, ProduceLimits(), KeySource("p"),
                     RetryPolicy(initial_backoff_s=0))
    ok = {"topic": "t", "partition": 1, "ok": True, "start_offset": 1, "end_offset": 1,
          "count": 1}
    conflict = {"topic": "t", "partition": 2, "ok": False, "error_type": "CommitConflict",
                "error": "lost", "retriable": True}
    answers: list[wire.Outcome] = [
        Broken("cut", maybe_sent=True),
        Reply(409, {"results": [ok, conflict]}),
        Reply(200, {"results": [{**ok, "partition": 2, "duplicate": True}]}),
    ]
    result, actions = _drive(op, answers)
    sends = [json.loads(a.content) for a in actions if isinstance(a, ops.Send)]
    assert [e["idempotency_key"] for e in sends[0]["topic_partitions"]] == ["p.0", "p.1"]
    assert sends[1] == sends[0]
    assert [e["idempotency_key"] for e in sends[2]["topic_partitions"]] == ["p.1"]
    assert [(b.partition, b.first_index, b.duplicate) for b in result.batches] == [
        (1, 0, False), (2, 1, True)]


def test_produce_stops_at_a_failure_that_cannot_succeed_and_says_what_was_written() -> None:
    op = ops.produce("t", ["a"] * 3, 0, ProduceLimits(max_records_per_request=2),
                     KeySource("p"), RetryPolicy())
    ok = {"topic": "t", "partition": 0, "ok": True, "start_offset": 1, "end_offset": 2,
          "count": 2}
    fenced = {"topic": "t", "partition": 0, "ok": False, "error_type": "PartitionFenced",
              "error": "fenced", "retriable": False}
    with pytest.raises(errors.PartitionFenced) as caught:
        _drive(op, [Reply(200, {"results": [ok]}), Reply(409, {"results": [fenced]})])
    assert [b.count for b in caught.value.produced] == [2]


def test_attempts_are_bounded() -> None:
    op = ops.offsets("t", 0, None, RetryPolicy(max_attempts=3, initial_backoff_s=0))
    with pytest.raises(errors.TransportError) as caught:
        _drive(op, [Broken("refused", maybe_sent=False)] * 3)
    assert not caught.value.maybe_written


def test_a_request_that_may_have_arrived_is_not_repeated_when_that_would_act_twice() -> None:
    op = ops.delete_topic("t", RetryPolicy(initial_backoff_s=0))
    with pytest.raises(errors.TransportError) as caught:
        _drive(op, [Broken("cut", maybe_sent=True)])
    assert not caught.value.retriable and caught.value.maybe_written


_TOPIC = {"topic": "t", "partitions": 3, "retention_ms": None, "retention_bytes": None,
          "max_record_bytes": None, "created_at_ms": 1}


def _state(p: int) -> dict[str, object]:
    return {"partition": p, "log_start_offset": 1, "high_watermark": p, "retained_bytes": 0,
            "last_append_ms": None}


def test_describe_asks_for_every_page_of_partitions() -> None:
    op = ops.describe_topic("t", RetryPolicy(initial_backoff_s=0))
    result, actions = _drive(op, [
        Reply(200, {**_TOPIC, "partition_states": [_state(0), _state(1)],
                    "next_partition": 2}),
        Reply(200, {**_TOPIC, "partition_states": [_state(2)]})])
    paths = [a.path for a in actions if isinstance(a, ops.Send)]
    assert paths == ["/topics/t", "/topics/t?from_partition=2"]
    assert isinstance(result, TopicDescription) and result.status == "active"
    assert [s.high_watermark for s in result.partition_states] == [0, 1, 2]


def test_a_delete_that_goes_on_in_the_background_is_an_answer_not_an_error() -> None:
    op = ops.delete_topic("t", RetryPolicy(initial_backoff_s=0))
    result, _ = _drive(op, [Reply(202, {**_TOPIC, "status": "deleting"})])
    assert isinstance(result, TopicInfo) and result.status == "deleting"
