"""The Python client's Consumer and AsyncConsumer against a real broker: binary answers
decoded lazily and equal to the JSON ones, prefetch within its bound, seeks, a group's
at-least-once across a rebalance, at-most-once, close and errors."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from collections.abc import Callable

import anyio
import httpx
import pytest

from app.localstack.processes import free_port
from llog_client import (
    NO_RETRIES,
    AsyncConsumer,
    AsyncLlogClient,
    Consumer,
    LlogClient,
    PartitionBatch,
    ProduceLimits,
    Record,
    RecordView,
    RetryPolicy,
    TransportError,
    UnknownPartition,
)
from llog_client._fastlane import Lane
from llog_client._fetcher import FetchSend
from llog_client._wire import Broken
from tests.helpers.stack import Broker, BrokerFactory

# The shared test broker refuses requests over 256 KiB and 1000 records.
LIMITS = ProduceLimits(max_request_bytes=200_000, max_records_per_request=1000)
FAST = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5)
WAIT_S = 20  # the longest any wait below may take on a loaded machine


def _client(url: str) -> LlogClient:
    return LlogClient(url, limits=LIMITS, retry=FAST, timeout_s=30)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


def _until(consumer: Consumer, what: str, check: Callable[[], bool]) -> None:
    """Wait until ``check`` holds: the consumer's worker tells its condition at every
    step, so this wakes when something happened, not on a timer."""
    with consumer._cond:
        assert consumer._cond.wait_for(check, timeout=WAIT_S), f"timed out: {what}"


def _fields(r: object) -> tuple[object, ...]:
    return tuple(getattr(r, f) for f in ("topic", "partition", "offset", "value", "key",
                                         "headers", "timestamp_ms", "append_time_ms"))


# -- decoding --------------------------------------------------------------------------


def test_lazy_decode_equals_the_json_answers(broker: Broker, topic: str) -> None:
    """Partition 0 has keys and timestamps (bytes-batch-v3 columns), partition 1 has
    headers (bytes-batch-v2); both have empty values and bytes that are not UTF-8."""
    with _client(broker.url) as llog:
        llog.create_topic(topic, 2)
        llog.produce(topic, [b"", b"\x00\xff\xfe", "plain text", Record(b"", key=b""),
                             Record("keyed", key=b"\x80k", timestamp_ms=1_700_000_000_000),
                             Record(b"\xc3\x28", timestamp_ms=0)], partition=0)
        llog.produce(topic, [Record("h", headers=[("trace", "4bf9"), ("bin", b"\xff"),
                                                 ("trace", b"")]),
                             b"", Record(b"\x01", key="k", headers=[("empty", b"")],
                                         timestamp_ms=5)], partition=1)
        eager = [r for p in (0, 1) for r in llog.iter_records(topic, p, follow=False)]
        with Consumer(llog, topic, follow=False) as consumer:
            lazy = sorted(consumer, key=lambda r: (r.partition, r.offset))
        with Consumer(llog, topic, follow=False) as consumer:
            batches = _all_batches(consumer)
    assert len(eager) == 9 and {r.partition for r in eager} == {0, 1}
    assert [_fields(r) for r in lazy] == [_fields(r) for r in eager]
    assert [r.to_consumed() for r in lazy] == eager
    columns = [(b.topic, b.partition, o, v, k, h, t, a) for b in batches
               for o, v, k, h, t, a in zip(b.offsets, b.values, b.keys, b.headers,
                                           b.timestamps, b.append_times, strict=True)]
    assert sorted(columns, key=lambda c: (c[1], c[2])) == [_fields(r) for r in eager]
    view = lazy[1]
    assert bytes(view.value_view) == view.value == b"\x00\xff\xfe"
    assert view.value_view.obj is view.batch.buffer  # a slice of the answer, not a copy


def _all_batches(consumer: Consumer) -> list[PartitionBatch]:
    out: list[PartitionBatch] = []
    while not consumer.finished:
        out += consumer.poll_batch(timeout_s=WAIT_S)
    return out


# -- prefetch --------------------------------------------------------------------------


def test_prefetch_stays_within_prefetch_bytes_and_one_answer(broker: Broker, topic: str
                                                              ) -> None:
    value = b"v" * 4000
    with _client(broker.url) as llog:
        llog.create_topic(topic, 2)
        for p in (0, 1):
            llog.produce(topic, [value] * 400, partition=p)  # 1.6 MB each
        with Consumer(llog, topic, follow=False, max_bytes=64 * 1024,
                      prefetch_bytes=256 * 1024) as consumer:
            first = consumer.poll_batch(timeout_s=WAIT_S)
            # The program holds its answer: the worker fetches ahead until the bound.
            _until(consumer, "the queue filled",
                   lambda: consumer._core.prefetch.buffered >= 256 * 1024)
            waiting = consumer.metrics()
            fetches = waiting["fetches"]
            rest = _all_batches(consumer)
            done = consumer.metrics()
    assert waiting["fetches"] == fetches  # it stopped there
    assert done["max_buffered_bytes"] <= 256 * 1024 + done["max_answer_bytes"]
    assert done["max_answer_bytes"] <= 64 * 1024 + 4096  # an answer keeps its budget
    assert done["fetches"] > 2 * 1.6e6 / (64 * 1024)  # many answers came and went
    got = {(b.partition, o) for b in [*first, *rest] for o in b.offsets}
    assert got == {(p, o) for p in (0, 1) for o in range(1, 401)}
    assert all(v == value for b in [*first, *rest] for v in b.values)


def test_one_request_covers_every_partition_and_long_polls_at_the_end(
        broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        llog.create_topic(topic, 3)
        with Consumer(llog, topic, start="latest", max_wait_ms=5000) as consumer:
            assert sorted(consumer.assignment()) == [(topic, p) for p in range(3)]
            before = consumer.metrics()["fetches"]
            llog.produce(topic, ["a"], partition=2)
            llog.produce(topic, ["b"], partition=0)
            got: list[RecordView] = []
            deadline = time.monotonic() + WAIT_S
            while len(got) < 2 and time.monotonic() < deadline:
                got += consumer.poll(timeout_s=WAIT_S)
            fetches = consumer.metrics()["fetches"] - before
    assert sorted((r.partition, r.text()) for r in got) == [(0, "b"), (2, "a")]
    assert fetches <= 3  # long-polls that woke on the writes, not a request per partition


# -- seeking ---------------------------------------------------------------------------


def test_seek_by_offset_and_by_time(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        llog.create_topic(topic, 1)
        llog.produce(topic, [f"r{i}" for i in range(1, 11)], partition=0)
        llog.produce(topic, [f"s{i}" for i in range(11, 21)], partition=0)
        eager = list(llog.iter_records(topic, 0, follow=False))
        moment = eager[12].append_time_ms
        assert moment is not None
        first_at_moment = next(r.offset for r in eager if (r.append_time_ms or 0) >= moment)
        key = (topic, 0)
        with Consumer(llog, topic, follow=False) as consumer:
            seen = []
            for record in consumer:
                seen.append(record.offset)
                if record.offset == 5:
                    consumer.seek(topic, 0, 2)  # the next record is offset 2
                if len(seen) == 8:
                    break
            assert seen == [1, 2, 3, 4, 5, 2, 3, 4]
            assert consumer.seek_to_time(moment) == {key: first_at_moment}
            assert consumer.poll(timeout_s=WAIT_S)[0].offset == first_at_moment
            consumer.seek_to_beginning()
            assert consumer.poll(timeout_s=WAIT_S)[0].offset == 1
            consumer.seek_to_end()
            assert consumer.poll(timeout_s=0.5) == []
            later = int(time.time() * 1000) + 60_000
            assert consumer.seek_to_time(later) == {key: 21}  # past every record


# -- groups ----------------------------------------------------------------------------


def test_a_group_is_at_least_once_across_a_rebalance(broker: Broker, topic: str,
                                                     group: str) -> None:
    """The first member processes records without committing them; a second member
    joins and takes one of its partitions, and processes what was not committed there
    again: nothing is lost, and at the end everything is committed."""
    every = {(p, o) for p in (0, 1) for o in range(1, 31)}
    with _client(broker.url) as llog:
        llog.create_topic(topic, 2)
        for p in (0, 1):
            llog.produce(topic, [f"{p}-{i}" for i in range(1, 31)], partition=p)
        first = Consumer(llog, topic, group=group, auto_commit=False, max_wait_ms=200)
        second = Consumer(llog, topic, group=group, max_wait_ms=200)
        done: list[tuple[str, int, int]] = []
        try:
            first.start()
            done += [("first", r.partition, r.offset) for r in first.poll(timeout_s=WAIT_S)]
            assert done and {p.committed_offset for p in llog.describe_group(group).partitions
                             } == {None}  # processed, not committed
            second.start()
            assert second.membership is not None
            generation = second.membership.generation
            (moved,) = second.assignment()  # one partition moves to the second member
            _until(first, "the first member saw the rebalance", lambda: (
                first.membership is not None and first.membership.generation == generation))
            assert moved not in first.assignment()
            deadline = time.monotonic() + WAIT_S
            while (_union(done) != every or _read_by(done, "second", moved[1]) != 30) \
                    and time.monotonic() < deadline:
                done += [("first", r.partition, r.offset) for r in first.poll(0.2)]
                done += [("second", r.partition, r.offset) for r in second.poll(0.2)]
            first.commit()  # its own commits are asked for (the second's come by themselves)
        finally:
            first.close()
            second.close()
        final = llog.describe_group(group)
    assert _union(done) == every
    # Nothing was committed on the partition that moved: the second member read it all,
    # what the first had processed there included.
    assert sorted(o for who, p, o in done if who == "second" and p == moved[1]) == list(
        range(1, 31))
    assert final.members == ()
    assert {(p.partition, p.committed_offset) for p in final.partitions} == {(0, 30), (1, 30)}


def _union(done: list[tuple[str, int, int]]) -> set[tuple[int, int]]:
    return {(p, o) for _, p, o in done}


def _read_by(done: list[tuple[str, int, int]], who: str, partition: int) -> int:
    return len({o for w, p, o in done if w == who and p == partition})


def test_at_most_once_has_the_broker_commit_each_answer(broker: Broker, topic: str,
                                                        group: str) -> None:
    with _client(broker.url) as llog:
        llog.produce(topic, ["a", "b", "c"], partition=0)
        with Consumer(llog, topic, group=group, delivery="at-most-once") as consumer:
            records = consumer.poll(timeout_s=WAIT_S)
            # Committed before the program saw it: a crash here loses these records.
            committed = {p.partition: p.committed_offset
                         for p in llog.describe_group(group).partitions}
            assert consumer.commit() == {}  # nothing is left for the client to commit
    assert [r.offset for r in records] == [1, 2, 3]
    assert committed == {0: 3}
    with pytest.raises(ValueError, match="at-most-once"):
        Consumer(llog, topic, delivery="at-most-once")


def test_chosen_partitions_read_and_commit_a_groups_offsets(broker: Broker, topic: str,
                                                            group: str) -> None:
    """Partitions a consumer chose, with a group: read from the group's committed
    offsets, committed without a member (the group has none)."""
    with _client(broker.url) as llog:
        llog.produce(topic, ["a", "b", "c", "d"], partition=0)
        assert llog.reset_offsets(group, topic, partition=0, offset=2) == {(topic, 0): 2}
        with Consumer(llog, partitions=[(topic, 0)], group=group) as consumer:
            got = consumer.poll(timeout_s=WAIT_S)
        described = llog.describe_group(group)
    assert [r.offset for r in got] == [3, 4]
    assert [(p.partition, p.committed_offset) for p in described.partitions] == [(0, 4)]


def test_close_commits_what_was_processed_leaves_and_ends_the_thread(
        broker: Broker, topic: str, group: str) -> None:
    with _client(broker.url) as llog:
        llog.produce(topic, [f"r{i}" for i in range(10)], partition=0)
        consumer = llog.consumer(topic, group=group, commit_interval_ms=3_600_000)
        with consumer:
            worker = consumer._worker
            assert worker is not None and worker.thread.is_alive()
            for record in consumer:
                if record.offset == 4:
                    break  # the fourth was taken, not processed
        assert not worker.thread.is_alive()
        consumer.close()  # again: nothing to do
        described = llog.describe_group(group)
        with pytest.raises(RuntimeError, match="closed"):
            consumer.poll()
    assert described.members == ()
    assert [(p.partition, p.committed_offset) for p in described.partitions] == [(0, 3)]


def test_close_ends_an_iteration_waiting_in_another_thread(broker: Broker, topic: str
                                                            ) -> None:
    with _client(broker.url) as llog:
        llog.create_topic(topic, 1)
        consumer = Consumer(llog, topic, max_wait_ms=1000).start()
        ended = threading.Event()

        def iterate() -> None:
            for _ in consumer:
                pass
            ended.set()

        reader = threading.Thread(target=iterate)
        reader.start()
        _until(consumer, "a fetch went out", lambda: consumer._core.prefetch.fetches > 0)
        consumer.close()
        assert ended.wait(WAIT_S)
        reader.join(WAIT_S)
        assert not reader.is_alive()
        assert consumer._worker is not None and not consumer._worker.thread.is_alive()


# -- errors ----------------------------------------------------------------------------


def test_errors_of_the_background_fetch_reach_the_next_poll(brokers: BrokerFactory,
                                                            topic: str) -> None:
    strict = brokers.start(auto_create_topics="false")
    with _client(strict.url) as llog:
        llog.create_topic(topic, 1)
        llog.produce(topic, ["a"], partition=0)
        got: list[RecordView] = []
        errors: list[UnknownPartition] = []
        with Consumer(llog, partitions=[(topic, 0), (topic, 7)]) as consumer:
            deadline = time.monotonic() + WAIT_S
            while not (got and errors) and time.monotonic() < deadline:
                try:  # the error comes with the first answer, beside the records
                    got += consumer.poll(timeout_s=WAIT_S)
                except UnknownPartition as exc:
                    errors.append(exc)
        assert [r.value for r in got] == [b"a"]
        assert errors and errors[0].partition == 7
    nowhere = f"http://127.0.0.1:{free_port()}"
    with LlogClient(nowhere, retry=NO_RETRIES) as dead, \
            Consumer(dead, partitions=[(topic, 0)]) as consumer:
        with pytest.raises(TransportError):
            consumer.poll(timeout_s=WAIT_S)
        with pytest.raises(TransportError):  # and again, once the worker tried again
            consumer.poll(timeout_s=WAIT_S)


# -- async -----------------------------------------------------------------------------


async def test_the_async_consumer_reads_seeks_and_commits(broker: Broker, topic: str,
                                                          group: str) -> None:
    async with AsyncLlogClient(broker.url, limits=LIMITS, retry=FAST) as llog:
        await llog.create_topic(topic, 2)
        await llog.produce(topic, ["a", Record("b", key="k", headers=[("h", "v")])],
                           partition=0)
        await llog.produce(topic, ["c"], partition=1)
        async with AsyncConsumer(llog, topic, follow=False) as consumer:
            got = sorted([_fields(r) async for r in consumer], key=lambda f: (f[1], f[2]))
        eager = [r for p in (0, 1) async for r in llog.iter_records(topic, p, follow=False)]
        assert got == [_fields(r) for r in eager]
        async with AsyncConsumer(llog, topic, group=group, max_wait_ms=200) as member:
            seen = 0
            with anyio.fail_after(WAIT_S):
                while seen < 3:
                    seen += len(await member.poll())
            assert await member.commit() == {(topic, 0): 2, (topic, 1): 1}
            member.seek(topic, 0, 2)
            with anyio.fail_after(WAIT_S):
                again = await member.poll(timeout_s=WAIT_S)
        described = await llog.describe_group(group)
    assert [(r.partition, r.offset) for r in again] == [(0, 2)]
    assert described.members == ()


def test_answers_through_httpx_are_the_same(broker: Broker, topic: str) -> None:
    """Compressed answers, and a client given a transport of its own, go through httpx
    instead of the consumer's own connection: the same records come."""
    values = [f"record {i} " * 40 for i in range(300)]  # compressible, over 1 KiB a batch
    with _client(broker.url) as llog:
        llog.produce(topic, values, partition=0)
        with Consumer(llog, topic, follow=False, compressed=True) as consumer:
            zstd = [r.text() for r in consumer]
    with LlogClient(broker.url, transport=httpx.HTTPTransport(), retry=FAST) as own, \
            Consumer(own, topic, follow=False) as consumer:
        assert not consumer._worker or not consumer._worker.sender.uses_lane(
            FetchSend(b"", 0.0))
        through_httpx = [r.text() for r in consumer]
    assert zstd == through_httpx == values


async def test_a_cancelled_async_consumer_ends_at_once_and_leaves(
        broker: Broker, topic: str, group: str) -> None:
    async with AsyncLlogClient(broker.url, limits=LIMITS, retry=FAST) as llog:
        await llog.produce(topic, ["a"], partition=0)
        got = []
        started = time.monotonic()
        with anyio.CancelScope() as scope:
            async with llog.consumer(topic, group=group, max_wait_ms=10_000) as consumer:
                async for record in consumer:
                    got.append(record.value)
                    scope.cancel()  # while the next long-poll waits at the end
        elapsed = time.monotonic() - started
        described = await llog.describe_group(group)
    assert got == [b"a"] and scope.cancelled_caught
    assert elapsed < 10  # not a whole long-poll
    assert described.members == ()  # it left on its way out


# -- the consumer's own connection -----------------------------------------------------


class _Answers(http.server.BaseHTTPRequestHandler):
    """Answers the shapes a broker behind a proxy may give: chunked, to the end of the
    connection, kept alive, and one whose connection goes away unannounced (the request
    echoed in each)."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        echo = body + b"|" + self.headers.get("x-probe", "").encode()
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for part in (echo[:3], echo[3:]):
                self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nx-trailer: 1\r\n\r\n")
        elif self.path == "/to-close":
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(echo)
            self.close_connection = True
        else:
            self.send_header("content-length", str(len(echo)))
            self.end_headers()
            self.wfile.write(echo)
            # "/drop": let the connection go without saying so, as an idle one is
            self.close_connection = self.path == "/drop"

    def log_message(self, *args: object) -> None:
        pass


def test_the_fast_lane_reads_every_shape_of_answer() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    lane = Lane()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        got = [lane.post(f"{base}{path}", f"body-{i}".encode(), {"x-probe": path},
                         connect_s=5, read_s=WAIT_S)
               for i, path in enumerate(["/kept", "/chunked", "/kept", "/to-close", "/drop",
                                         "/kept"])]
    finally:
        lane.close()
        server.shutdown()
        server.server_close()
    assert [(a[0], a[2]) for a in got if not isinstance(a, Broken)] == [
        (200, b"body-0|/kept"), (200, b"body-1|/chunked"), (200, b"body-2|/kept"),
        (200, b"body-3|/to-close"), (200, b"body-4|/drop"), (200, b"body-5|/kept")]
    nowhere = Lane().post(f"http://127.0.0.1:{free_port()}/x", b"", {}, connect_s=5,
                          read_s=5)
    assert isinstance(nowhere, Broken) and not nowhere.maybe_sent
