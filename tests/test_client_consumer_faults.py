"""Consumer and AsyncConsumer under faults and interleavings: hostile LLR1 answers, the
hand-written HTTP of the fast lane against a fake broker on a local socket, and a real
broker for seeks, iterations and group commits. Each test guards a promise: no record
skipped or stale, no waiter stranded, a close bounded, a malformed answer an error."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from app.storage.log_record import LogRecord
from app.wire import records as wire_records
from llog_client import Consumer, LlogClient, ProduceLimits, RetryPolicy
from llog_client import _rawhttp as rawhttp
from llog_client._errors import UnexpectedResponse
from llog_client._fastlane import Lane
from llog_client._records import PartitionBatch, PartitionFailure, parse
from llog_client._wire import Broken
from tests.helpers.raw_http import read_request
from tests.helpers.stack import Broker

LIMITS = ProduceLimits(max_request_bytes=200_000, max_records_per_request=1000)
FAST = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5)
WAIT_S = 20


def _client(url: str, timeout_s: float = 30) -> LlogClient:
    return LlogClient(url, limits=LIMITS, retry=FAST, timeout_s=timeout_s)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


# -- a fake broker on a local socket ------------------------------------------------------


def _read_request(conn: socket.socket) -> bytes | None:
    """One HTTP request's body (None: the client closed the connection)."""
    request = read_request(conn)
    return None if request is None else request.body


class FakeBroker:
    """Accepts connections and hands each to ``serve(conn, index)`` on a thread."""

    def __init__(self, serve: Callable[[socket.socket, int], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.serve = serve
        self.connections = 0
        self.requests = 0
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            index = self.connections
            self.connections += 1
            thread = threading.Thread(target=self._run, args=(conn, index), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            self.serve(conn, index)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=5)


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[socket.socket, int], None]], FakeBroker]]:
    made: list[FakeBroker] = []

    def make(serve: Callable[[socket.socket, int], None]) -> FakeBroker:
        made.append(FakeBroker(serve))
        return made[-1]

    yield make
    for broker in made:
        broker.close()


def _ok(body: bytes = b"hello", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def _lane_post(lane: Lane, url: str, read_s: float = 2.0) -> tuple[int, bytes] | Broken:
    got = lane.post(url + "/consume", b"{}", {}, connect_s=2.0, read_s=read_s)
    if isinstance(got, Broken):
        return got
    return got[0], got[2]


# -- LLR1: lazy decode against the broker's own encoder and decoder -------------------------


def _edge_answer() -> bytes:
    v3 = [b"", LogRecord(b"", key=b""), LogRecord(b"\x00\xff", key=b"k", timestamp_ms=0),
          LogRecord(b"x" * 70_000, timestamp_ms=1_000), b"\xc3\x28",
          LogRecord(b"", key=None, timestamp_ms=2**62)]
    v2 = [LogRecord(b"", headers=(("", b""),)), LogRecord(b"v", key=b"",
                                                           headers=(("a", b"\xff"), ("a", b""))),
          b"", LogRecord(b"", key=b"kk", timestamp_ms=7)]
    return wire_records.build([
        wire_records.Records("t", 0, 10, 0, 6, 0, v3, [1, 2, 3, 4, 5, 6]),
        wire_records.Failed("t", 1, {"error_type": "NotLeader", "retriable": True}),
        wire_records.Records("t\u00e9", 2, 4, 0, 4, 0, v2, [9, 0, 9, 9]),
        wire_records.Records("t", 3, 0, 0, 0, 0, [], []),
    ])


def _fields(batch: PartitionBatch) -> list[tuple[object, ...]]:
    cols = list(zip(batch.offsets, batch.values, batch.keys, batch.headers,
                    batch.timestamps, batch.append_times, strict=True))
    views = [(r.offset, r.value, r.key, r.headers, r.timestamp_ms, r.append_time_ms)
             for r in batch]
    assert cols == views
    assert [bytes(v) for v in batch.value_views()] == batch.values
    return views


def test_lazy_decode_equals_the_brokers_decoder_on_edge_records() -> None:
    answer = _edge_answer()
    eager = wire_records.parse(answer)
    lazy = parse(answer)
    assert len(lazy) == len(eager)
    for mine, theirs in zip(lazy, eager, strict=True):
        if isinstance(theirs, wire_records.Failed):
            assert isinstance(mine, PartitionFailure) and mine.error == theirs.error
            continue
        assert isinstance(mine, PartitionBatch)
        assert (mine.topic, mine.partition, mine.high_watermark, mine.next_offset) == (
            theirs.topic, theirs.partition, theirs.high_watermark, theirs.next_offset)
        expected = []
        for i, p in enumerate(theirs.records):
            rec = LogRecord(p) if isinstance(p, bytes) else p
            expected.append((theirs.first_offset + i, rec.value, rec.key,
                             tuple((n, bytes(v)) for n, v in rec.headers),
                             rec.timestamp_ms, theirs.append_times[i]))
        assert _fields(mine) == expected


def _touch(results: list[PartitionBatch | PartitionFailure]) -> None:
    for r in results:
        if isinstance(r, PartitionBatch):
            _fields(r)
            for r_ in r:
                assert 0 <= r_.batch._vs[r_._i] <= r_.batch._ve[r_._i] <= len(r.buffer)


def test_every_truncation_of_an_answer_is_refused() -> None:
    answer = _edge_answer()
    for cut in range(len(answer)):
        with pytest.raises(UnexpectedResponse, match="malformed LLR1"):
            parse(answer[:cut])
    with pytest.raises(UnexpectedResponse):
        parse(answer + b"\x00")


def test_corrupt_answers_raise_a_clear_error_or_decode_within_the_body() -> None:
    """Flipped bytes: parse raises UnexpectedResponse, or every record it gives reads
    (lazily) within the answer, with no other exception."""
    answer = bytearray(_edge_answer())
    rng = random.Random(1)
    small = [i for i in range(len(answer)) if not 200 < i < 70_000]  # not the big value
    for _ in range(3000):
        bad = bytearray(answer)
        for _ in range(rng.randint(1, 3)):
            bad[rng.choice(small)] = rng.randrange(256)
        try:
            results = parse(bytes(bad))
        except UnexpectedResponse:
            continue
        _touch(results)


# -- the fast lane's HTTP -------------------------------------------------------------------


def test_a_kept_alive_connection_the_broker_closed_is_opened_again(fake) -> None:
    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is not None:
            conn.sendall(_ok(f"c{index}".encode()))  # kept alive, then let go

    broker = fake(serve)
    lane = Lane()
    try:
        assert _lane_post(lane, broker.url) == (200, b"c0")
        assert _lane_post(lane, broker.url) == (200, b"c1")  # once more, on a new one
    finally:
        lane.close()


def test_connection_close_and_an_answer_to_the_end_of_the_connection(fake) -> None:
    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is None:
            return
        if index == 0:
            conn.sendall(_ok(b"closing", b"connection: close\r\n"))
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nto the end")
            conn.shutdown(socket.SHUT_WR)

    broker = fake(serve)
    lane = Lane()
    try:
        assert _lane_post(lane, broker.url) == (200, b"closing")
        assert _lane_post(lane, broker.url) == (200, b"to the end")
    finally:
        lane.close()
    assert broker.connections == 2


def test_an_answer_over_the_bound_is_refused_before_it_is_read(fake) -> None:
    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is not None:
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: "
                         + str(rawhttp.MAX_BODY + 1).encode() + b"\r\n\r\nxx")
            conn.recv(1)

    lane = Lane()
    try:
        got = _lane_post(lane, fake(serve).url)
    finally:
        lane.close()
    assert isinstance(got, Broken) and "at most" in got.reason


def _chunked_split(conn: socket.socket, index: int) -> None:
    """A chunked answer whose size lines come in pieces (TCP may cut them anywhere)."""
    if _read_request(conn) is None:
        return
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    for piece in (b"5", b"\r\n", b"hello\r\n", b"0", b"\r\n\r\n"):
        time.sleep(0.05)  # each piece in a segment of its own
        conn.sendall(piece)
    conn.recv(1)


def test_a_chunked_answer_whose_size_line_comes_in_pieces(fake) -> None:
    lane = Lane()
    try:
        assert _lane_post(lane, fake(_chunked_split).url) == (200, b"hello")
    finally:
        lane.close()


def _status_then_hold(status: bytes) -> Callable[[socket.socket, int], None]:
    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is not None:
            conn.sendall(status)
            conn.recv(1)  # keeps the connection open until the client lets it go
    return serve


def test_a_204_answer_on_a_kept_alive_connection_comes_at_once(fake) -> None:
    lane = Lane()
    started = time.monotonic()
    try:
        got = _lane_post(lane, fake(_status_then_hold(b"HTTP/1.1 204 No Content\r\n\r\n")).url,
                         read_s=1.5)
    finally:
        lane.close()
    assert got == (204, b"") and time.monotonic() - started < 1.0


def test_an_interim_100_answer_is_skipped(fake) -> None:
    lane = Lane()
    try:
        got = _lane_post(lane, fake(_status_then_hold(
            b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(b"final"))).url, read_s=1.5)
    finally:
        lane.close()
    assert got == (200, b"final")


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\ncontent-length: twelve\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
])
def test_a_malformed_head_is_a_broken_connection(fake, answer: bytes) -> None:
    lane = Lane()
    try:
        got = _lane_post(lane, fake(_status_then_hold(answer)).url, read_s=1.5)
    finally:
        lane.close()
    assert isinstance(got, Broken)


def test_a_trickling_answer_is_bounded_by_the_read_timeout(fake) -> None:
    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is None:
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n")
        for _ in range(12):
            time.sleep(0.15)  # each byte within the timeout, the whole far past it
            conn.sendall(b"x")
        conn.recv(1)

    lane = Lane()
    started = time.monotonic()
    try:
        got = _lane_post(lane, fake(serve).url, read_s=0.5)
    finally:
        lane.close()
    assert isinstance(got, Broken) and time.monotonic() - started < 1.2


def test_a_silent_broker_times_out_with_the_read_timeout(fake) -> None:
    lane = Lane()
    started = time.monotonic()
    try:
        got = _lane_post(lane, fake(_status_then_hold(b"")).url, read_s=0.5)
    finally:
        lane.close()
    assert isinstance(got, Broken) and "TimeoutError" in got.reason
    assert time.monotonic() - started < 3


def test_close_while_a_fetch_hangs_on_a_silent_broker(fake) -> None:
    arrived = threading.Event()

    def serve(conn: socket.socket, index: int) -> None:
        if _read_request(conn) is not None:
            arrived.set()
            conn.recv(1)

    broker = fake(serve)
    with LlogClient(broker.url, timeout_s=1, retry=RetryPolicy(
            max_attempts=3, initial_backoff_s=0.05, max_backoff_s=0.1)) as llog:
        consumer = Consumer(llog, partitions=[("t", 0)], max_wait_ms=100)
        consumer.start()
        assert arrived.wait(WAIT_S)
        started = time.monotonic()
        consumer.close()
        took = time.monotonic() - started
        assert consumer._worker is not None and not consumer._worker.thread.is_alive()
    assert took < 1.5, f"close took {took:.1f} s"


# -- a real broker: seeks, iterations, commits ------------------------------------------------


def _produce_two(llog: LlogClient, topic: str, n: int = 10) -> None:
    llog.create_topic(topic, 2)
    for p in (0, 1):
        llog.produce(topic, [f"{p}-{i}" for i in range(n)], partition=p)


def test_no_stale_record_after_a_seek_of_another_partition(broker: Broker, topic: str) -> None:
    with _client(broker.url) as llog:
        _produce_two(llog, topic)
        with Consumer(llog, topic, follow=False) as consumer:
            _until_fetched(consumer)
            seen: list[tuple[int, int]] = []
            other = None
            for record in consumer:
                seen.append((record.partition, record.offset))
                if other is None:
                    other = 1 - record.partition
                    consumer.seek(topic, other, "latest")  # nothing more from it
                if len(seen) == 20:
                    break
    assert other is not None
    assert [o for p, o in seen if p == other] == [], seen


def _until_fetched(consumer: Consumer) -> None:
    """Both partitions came in the first answer (a request covers every partition)."""
    with consumer._cond:
        assert consumer._cond.wait_for(lambda: bool(consumer._core.prefetch.queue),
                                       timeout=WAIT_S)
        first = consumer._core.prefetch.queue[0]
        assert not isinstance(first, Exception) and len(first.batches) == 2


def test_a_new_iteration_goes_on_where_the_last_one_stopped(broker: Broker, topic: str,
                                                             group: str) -> None:
    with _client(broker.url) as llog:
        llog.create_topic(topic, 1)
        llog.produce(topic, [f"r{i}" for i in range(20)], partition=0)
        seen: list[int] = []
        with Consumer(llog, topic, group=group, commit_interval_ms=3_600_000) as consumer:
            for record in consumer:
                seen.append(record.offset)
                if len(seen) == 3:
                    break
            llog.produce(topic, ["later"], partition=0)  # a next answer to go on with
            for record in consumer:
                seen.append(record.offset)
                if record.value == b"later":
                    break
    assert seen == list(range(seen[0], seen[0] + 21)), seen


def test_an_exception_while_processing_a_poll_commits_nothing_unprocessed(
        broker: Broker, topic: str, group: str) -> None:
    with _client(broker.url) as llog:
        llog.create_topic(topic, 1)
        llog.produce(topic, [f"r{i}" for i in range(10)], partition=0)
        with pytest.raises(RuntimeError, match="processing failed"), \
                Consumer(llog, topic, group=group, commit_interval_ms=3_600_000) as consumer:
            records = consumer.poll(timeout_s=WAIT_S)
            assert records
            raise RuntimeError("processing failed")  # at the first record
        committed = [p.committed_offset for p in llog.describe_group(group).partitions]
    assert committed in ([], [None]), committed


def test_background_commits_never_commit_the_last_poll(broker: Broker, topic: str,
                                                       group: str) -> None:
    """Commits every 20 ms while the program holds a poll's records: none of them is
    committed until the program polls again; then they all are."""
    with _client(broker.url) as llog:
        llog.create_topic(topic, 1)
        llog.produce(topic, [f"r{i}" for i in range(10)], partition=0)
        consumer = Consumer(llog, topic, group=group, commit_interval_ms=20)
        try:
            records = consumer.poll(timeout_s=WAIT_S)
            assert records
            core = consumer._core
            start = core.next_commit
            with consumer._cond:  # several background commits came due meanwhile
                assert consumer._cond.wait_for(lambda: core.next_commit > start + 0.1,
                                               timeout=WAIT_S)
            assert [p.committed_offset for p in llog.describe_group(group).partitions
                    ] in ([], [None])
            consumer.poll(timeout_s=0.2)
            assert consumer.commit() in ({}, {(topic, 0): records[-1].offset})
            assert [p.committed_offset for p in llog.describe_group(group).partitions
                    ] == [records[-1].offset]
        finally:
            consumer.close()
        assert consumer._worker is not None and not consumer._worker.thread.is_alive()


def test_at_most_once_never_delivers_a_record_twice_across_members(
        broker: Broker, topic: str, group: str) -> None:
    with _client(broker.url) as llog:
        _produce_two(llog, topic, 20)
        seen: list[tuple[int, int]] = []
        first = Consumer(llog, topic, group=group, delivery="at-most-once",
                         max_wait_ms=100, prefetch_bytes=1)
        try:
            seen += [(r.partition, r.offset) for r in first.poll(timeout_s=WAIT_S)]
        finally:
            first.close()  # what it fetched ahead is lost, never handed again
        with Consumer(llog, topic, group=group, delivery="at-most-once",
                      max_wait_ms=100) as second:
            while batch := second.poll(timeout_s=1.0):
                seen += [(r.partition, r.offset) for r in batch]
    assert seen and len(seen) == len(set(seen))
