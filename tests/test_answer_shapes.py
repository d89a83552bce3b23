"""The answers built by hand (app/broker/answers.py builds produce and consume results as
dicts, not models, to answer fast) are byte for byte what the answer models dump: the
document describes the models, so a field added to one and not the other would be an
answer the document does not describe."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import TypeAdapter

from app.broker import answers
from app.errors import OffsetOutOfRange, PartitionFenced, UnknownPartition
from app.routes.models import (
    ConsumedRecord,
    ConsumeFailure,
    ConsumePartitionResult,
    ConsumeResults,
    ConsumeSuccess,
    ProduceFailure,
    ProducePartitionResult,
    ProduceResults,
    ProduceSuccess,
)
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord
from app.storage.reader import ReadResult

TP = TopicPartition("orders", 3)


def _as_dumped(adapter: TypeAdapter[Any], built: dict[str, Any]) -> Any:
    """The model ``built`` validates as, after checking it dumps to the same bytes."""
    model = adapter.validate_python(built)
    assert orjson.dumps(built) == adapter.dump_json(model, exclude_none=True)
    return model


@pytest.mark.parametrize(("located", "duplicate"), [(True, False), (False, True)])
def test_a_written_entry_is_the_json_of_produce_success(located: bool,
                                                        duplicate: bool) -> None:
    group = AppendGroup(TP, [b"alpha", b"beta"])
    written = AppendResult(TP, 7, 8, 2, "llog/orders/partitions/3/index/8",
                           "s3://bucket/wal/1", duplicate=duplicate)
    built = answers.produce_result(group, written, lambda _: located)
    model = _as_dumped(TypeAdapter(ProducePartitionResult), built)
    assert isinstance(model, ProduceSuccess)
    assert (built["ok"], built["outcome"]) == (True, "success")


def test_a_failed_entry_is_the_json_of_produce_failure() -> None:
    group = AppendGroup(TP, [b"alpha"])
    built = answers.produce_result(group, PartitionFenced("orders/3 is fenced"),
                                   lambda _: True)
    model = _as_dumped(TypeAdapter(ProducePartitionResult), built)
    assert isinstance(model, ProduceFailure)
    assert (built["ok"], built["outcome"]) == (False, "failure")


@pytest.mark.parametrize("committed", [None, 2])
def test_a_read_partition_is_the_json_of_consume_success(committed: int | None) -> None:
    read = ReadResult(TP, [(1, b"alpha"), (2, b"\x00\x01"),
                           (3, LogRecord(b"v", b"k", (("h", b"x"),), 1_700_000_000_000))],
                      high_watermark=3, next_offset=4, append_times=[10, 11, 12])
    built = answers.consume_result(TP, read, "auto", committed)
    model = _as_dumped(TypeAdapter(ConsumePartitionResult), built)
    assert isinstance(model, ConsumeSuccess) and len(model.records) == 3
    assert (built["ok"], built["outcome"]) == (True, "success")


@pytest.mark.parametrize("error", [
    OffsetOutOfRange("offset 9 is beyond", log_start=1, high_watermark=5),
    UnknownPartition("orders has 3 partitions"),
])
def test_a_failed_partition_is_the_json_of_consume_failure(error: Exception) -> None:
    built = answers.consume_result(TP, error, "auto")  # type: ignore[arg-type]
    model = _as_dumped(TypeAdapter(ConsumePartitionResult), built)
    assert isinstance(model, ConsumeFailure)
    assert (built["ok"], built["outcome"]) == (False, "failure")


def _read() -> ReadResult:
    return ReadResult(TP, [(1, b"alpha"), (2, b"\x00\x01"),
                           (3, LogRecord(b"v", b"\xff", (("h", b"x"), ("b", b"\x00")),
                                         1_700_000_000_000))],
                      high_watermark=3, next_offset=4, append_times=[10, 11, 12])


@pytest.mark.parametrize("encoding", ["auto", "base64"])
def test_the_records_of_a_stream_event_are_the_json_of_consumed_records(encoding: str
                                                                        ) -> None:
    """The event stream and POST /consume show a record alike (one function builds it)."""
    built = answers.records(_read(), encoding)
    models = _as_dumped(TypeAdapter(list[ConsumedRecord]), built)
    assert [m.offset for m in models] == [1, 2, 3]
    assert ("value" in built[0]) is (encoding == "auto")


def test_a_produce_answer_is_the_json_of_produce_results() -> None:
    group = AppendGroup(TP, [b"alpha"])
    results = [answers.produce_result(group, AppendResult(TP, 1, 1, 1, "k", "s3://b/w"),
                                      lambda _: False),
               answers.produce_result(group, PartitionFenced("fenced"), lambda _: False)]
    body = answers.produce_answer(results)
    model = ProduceResults.model_validate_json(body)
    assert body == model.model_dump_json(exclude_none=True).encode()
    assert (model.success_count, model.error_count) == (1, 1)


def test_a_consume_answer_is_the_json_of_consume_results() -> None:
    results = [answers.consume_result(TP, _read(), "auto", 3),
               answers.consume_result(TopicPartition("orders", 4),
                                      UnknownPartition("orders has 4 partitions"), "auto")]
    body = answers.consume_answer(results)
    model = ConsumeResults.model_validate_json(body)
    assert body == model.model_dump_json(exclude_none=True).encode()
