"""The Python client against real brokers on the real stack."""

from __future__ import annotations

import contextlib
import time
from urllib.parse import urlsplit

import anyio
import pytest

from app.localstack.processes import free_port
from app.storage.partitioner import partition_for_key
from llog_client import (
    NO_RETRIES,
    AsyncLlogClient,
    InvalidRequest,
    LlogClient,
    NotFound,
    OffsetOutOfRange,
    PayloadTooLarge,
    ProduceLimits,
    Record,
    RetryPolicy,
    RoleDisabled,
    TopicExists,
    TransportError,
    UnknownTopic,
)
from tests.helpers.cut_proxy import cutting_proxy, cutting_proxy_thread
from tests.helpers.stack import Broker, BrokerFactory

# The shared test broker refuses requests over 256 KiB and 1000 records.
LIMITS = ProduceLimits(max_request_bytes=200_000, max_records_per_request=1000)
FAST = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5)


def _client(url: str, **kwargs: object) -> LlogClient:
    return LlogClient(url, limits=LIMITS, retry=FAST, timeout_s=30, **kwargs)  # type: ignore[arg-type]


def test_produce_and_consume_round_trip(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        result = llog.produce(topic, ["alpha", b"\x00\x01", Record(
            "order created", key="customer-17", headers=[("trace", "4bf9"), ("bin", b"\xff")],
            timestamp_ms=1_700_000_000_000)], partition=0)
        assert [(b.partition, b.start_offset, b.end_offset) for b in result.batches] == [
            (0, 1, 3)]
        records = list(llog.iter_records(topic, 0, start="earliest", follow=False))
    assert [(r.offset, r.value) for r in records] == [
        (1, b"alpha"), (2, b"\x00\x01"), (3, b"order created")]
    last = records[2]
    assert last.key == b"customer-17" and last.timestamp_ms == 1_700_000_000_000
    assert last.headers == (("trace", b"4bf9"), ("bin", b"\xff"))
    assert records[0].key is None and records[0].append_time_ms is not None


def test_iteration_follows_next_offset_across_many_answers(broker: Broker, topic: str) -> None:
    values = [f"record-{i:05d}-{'x' * (i % 50)}" for i in range(2500)]
    with _client(broker.url) as llog:
        result = llog.produce(topic, values)
        assert len(result.batches) >= 3 and result.count == 2500
        assert [o for _, o in result.offsets()] == list(range(1, 2501))
        answers = list(llog.iter_batches(topic, 0, start=1, follow=False, max_bytes=4096))
        latest = list(llog.iter_records(topic, 0, start="latest", follow=False))
    assert len(answers) > 10
    got = [r for a in answers for r in a.records]
    assert [r.offset for r in got] == list(range(1, 2501))
    assert [r.text() for r in got] == values
    assert latest == []


def test_a_retry_after_a_cut_answer_writes_nothing_twice(broker: Broker, topic: str) -> None:
    where = urlsplit(broker.url)
    assert where.hostname is not None and where.port is not None
    with (cutting_proxy_thread(where.hostname, where.port, cut_first=1) as proxy,
          _client(proxy.url) as llog):
        result = llog.produce(topic, ["once", "only"])
    assert proxy.cuts == 1 and proxy.connections == 2
    (batch,) = result.batches
    assert batch.duplicate and (batch.start_offset, batch.end_offset) == (1, 2)
    with _client(broker.url) as llog:
        got = [r.value for r in llog.iter_records(topic, 0, follow=False)]
    assert got == [b"once", b"only"]


async def test_async_client_retries_a_cut_answer_and_follows_the_tail(
    broker: Broker, topic: str
) -> None:
    where = urlsplit(broker.url)
    assert where.hostname is not None and where.port is not None
    async with (cutting_proxy(where.hostname, where.port, cut_first=1) as proxy,
                AsyncLlogClient(proxy.url, limits=LIMITS, retry=FAST) as llog):
        first = await llog.produce(topic, [b"a", b"b"])
        assert first.batches[0].duplicate and proxy.cuts == 1

        seen: list[bytes] = []

        async def read_four() -> None:
            stream = llog.iter_records(topic, 0, start=1, max_wait_ms=5000)
            async with contextlib.aclosing(stream):
                async for record in stream:
                    seen.append(record.value)
                    if len(seen) == 4:
                        return

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_four)
                await llog.produce(topic, [b"c", b"d"])
    assert seen == [b"a", b"b", b"c", b"d"]


def test_blocking_follow_sees_records_produced_later(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        stream = llog.iter_records(topic, 0, start=1, max_wait_ms=5000)
        llog.produce(topic, ["early"])
        assert next(stream).value == b"early"
        llog.produce(topic, ["late"])
        assert next(stream).value == b"late"
        stream.close()


def test_offsets_and_keyed_partitions(broker: Broker, topic: str) -> None:
    # A key that does not land on partition 0, so "keyless goes to 0" is observable.
    key = next(k for k in (f"customer-{i}" for i in range(100))
               if partition_for_key(k.encode(), 4) != 0)
    with _client(broker.url) as llog:
        llog.create_topic(topic, partitions=4)
        keyed = llog.produce(topic, [Record("a", key=key), Record("b", key=key), "keyless"])
        assert [(b.partition, b.count) for b in keyed.batches] == [
            (partition_for_key(key.encode(), 4), 2), (0, 1)]
        partition = keyed.batches[0].partition
        where = llog.offsets(topic, partition, timestamp_ms=0)
        assert (where.log_start_offset, where.high_watermark, where.offset) == (1, 2, 1)
        future = llog.offsets(topic, partition, timestamp_ms=int(time.time() * 1000) + 3_600_000)
        assert future.offset == 3
        got = [(r.key, r.value) for r in llog.iter_records(topic, partition, follow=False)]
    assert got == [(key.encode(), b"a"), (key.encode(), b"b")]


def test_topic_administration(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        created = llog.create_topic(topic, partitions=2, retention_ms=86_400_000)
        assert (created.partitions, created.retention_ms) == (2, 86_400_000)
        assert topic in [t.topic for t in llog.list_topics()]
        updated = llog.update_topic(topic, partitions=3, retention_bytes=1 << 30)
        assert (updated.partitions, updated.retention_ms, updated.retention_bytes) == (
            3, 86_400_000, 1 << 30)
        cleared = llog.update_topic(topic, retention_ms=None)
        assert cleared.retention_ms is None and cleared.retention_bytes == 1 << 30
        llog.produce(topic, ["x"], partition=2)
        described = llog.describe_topic(topic)
        assert [(p.partition, p.high_watermark) for p in described.partition_states] == [
            (0, 0), (1, 0), (2, 1)]
        with pytest.raises(TopicExists):
            llog.create_topic(topic)
        assert llog.delete_topic(topic).topic == topic
        with pytest.raises(UnknownTopic) as caught:
            llog.describe_topic(topic)
    assert caught.value.status == 404 and not caught.value.retriable


def test_refusals_map_to_their_exception_classes(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        with pytest.raises(InvalidRequest) as invalid:
            llog.produce("no spaces allowed", ["x"])
        assert invalid.value.status == 400 and invalid.value.details
        with pytest.raises(PayloadTooLarge) as large:
            llog.produce(topic, [b"x" * 70_000])
        assert large.value.status == 413 and not large.value.maybe_written
        with pytest.raises(OffsetOutOfRange) as out_of_range:
            llog.fetch(topic, 0, 50)
        assert out_of_range.value.high_watermark == 0
        assert (out_of_range.value.topic, out_of_range.value.partition) == (topic, 0)
    with _client(broker.url + "/not-the-api") as elsewhere, pytest.raises(NotFound):
        elsewhere.list_topics()
    closed = LlogClient(f"http://127.0.0.1:{free_port()}", retry=NO_RETRIES)
    with closed, pytest.raises(TransportError) as refused:
        closed.produce(topic, ["x"])
    assert refused.value.retriable and not refused.value.maybe_written


def test_a_refusing_broker_is_retried_after_retry_after_then_left_for_another(
    brokers: BrokerFactory, topic: str
) -> None:
    reader = brokers.start(roles="read")
    writer = brokers.start()
    with (LlogClient(reader.url, retry=RetryPolicy(max_attempts=2)) as only_reader,
          pytest.raises(RoleDisabled) as refused):
        only_reader.produce(topic, ["x"])
    assert refused.value.status == 503 and refused.value.retry_after_s == 1
    started = time.monotonic()
    with LlogClient([reader.url, writer.url], retry=FAST) as both:
        (batch,) = both.produce(topic, ["x"]).batches
    assert time.monotonic() - started >= 1.0  # Retry-After: 1 was honoured
    assert (batch.start_offset, batch.duplicate) == (1, False)
