"""The batching producer (llog_client.Producer, AsyncProducer) under interleavings and
faults: a fake broker behind ``httpx.MockTransport`` keeps the produce contract of
docs/http-api.md (offsets from 1, a window of 64 idempotency keys per partition,
placement by key, whole refusals, per-entry failures) and lets a test hold, cut, refuse or
garble any request. A few tests use real brokers.

Each guards a promise: no record stored twice or out of order, no waiter stranded, no
callback or odd answer that stops the producer."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import anyio
import anyio.lowlevel
import httpx
import pytest

from app.wire import produce as wire_produce
from llog_client import (
    AsyncProducer,
    BufferFull,
    DeliveryTimeout,
    LlogClient,
    LlogError,
    PayloadTooLarge,
    Producer,
    ProducerClosed,
    RecordFuture,
    RecordMetadata,
    UnknownTopic,
)
from llog_client import _topic_meta as topic_meta
from llog_client._accumulator import Accumulator
from llog_client._partitioner import partition_for_key
from tests.helpers.stack import Broker, BrokerFactory

pytestmark = pytest.mark.timeout(60)

A = "http://a.test"
B = "http://b.test"
WINDOW = 64  # idempotency keys a partition remembers (docs/http-api.md)
REMEMBERED_SEQUENCES = 5  # where a producer's last sequences went, per partition
# Compression given: a record with a partition needs no topic lookup. Short backoffs.
PLAIN: dict[str, Any] = {"compression": "none", "retry_backoff_ms": 10,
                         "retry_backoff_max_ms": 50}


@dataclass
class Attempt:
    """One entry of one produce request, as the fake broker read it."""

    url: str
    topic: str
    partition: int  # as sent: -1 when the broker places it by key
    key: str  # the idempotency key, or the producer id and sequence
    values: list[bytes]
    record_keys: list[bytes | None]
    number: int  # the how-manieth attempt of this idempotency key
    deadline_ms: int | None  # Llog-Commit-Deadline-Ms
    producer: tuple[str, int] | None = None  # producer id and sequence


Hook = Callable[["FakeBroker", httpx.Request, list[Attempt]], Awaitable[httpx.Response | None]]
After = Callable[["FakeBroker", httpx.Request, list[Attempt], httpx.Response],
                 Awaitable[httpx.Response]]


def error_response(status: int, error_type: str, retry_after: float | None = None
                   ) -> httpx.Response:
    headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
    return httpx.Response(status, json={"error_type": error_type, "error": error_type},
                          headers=headers)


def failed(error_type: str, *, retriable: bool, maybe_written: bool = False
           ) -> dict[str, Any]:
    return {"ok": False, "outcome": "failure", "error_type": error_type, "error": error_type,
            "retriable": retriable, "maybe_written": maybe_written}


class FakeBroker:
    """Brokers (any number of URLs, one shared log) that keep the produce contract.

    ``before`` sees each produce request first and may answer it instead (a whole
    refusal), wait, or raise an httpx error (nothing written); ``fault`` may fail an
    entry instead of appending it; ``after`` sees the answer once the entries are
    appended and may replace it or raise (a cut answer: written, not acknowledged)."""

    def __init__(self, topics: dict[str, int] | None = None, *, auto_create: bool = True,
                 auto_partitions: int = 1) -> None:
        self.topics: dict[str, int] = dict(topics or {})
        self.auto_create = auto_create
        self.auto_partitions = auto_partitions
        self.logs: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        self.windows: dict[tuple[str, int], OrderedDict[str, tuple[int, int]]] = (
            defaultdict(OrderedDict))
        self.numbers: dict[str, int] = defaultdict(int)
        # (topic, partition, producer id): its last sequence, and where each went.
        self.producers: dict[tuple[str, int, str], tuple[int, dict[int, tuple[int, int]]]] = {}
        self.requests: list[list[Attempt]] = []
        self.lookups: list[str] = []
        self.before: Hook | None = None
        self.after: After | None = None
        self.fault: Callable[[Attempt], dict[str, Any] | None] | None = None
        self.lookup: Callable[[httpx.Request], Awaitable[httpx.Response | None]] | None = None
        self.cluster: Callable[[], Awaitable[None]] | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path.startswith("/topics/"):
            return await self._describe(request, unquote(path.removeprefix("/topics/")))
        if request.method == "GET" and path == "/cluster":
            if self.cluster is not None:
                await self.cluster()
            return httpx.Response(200, json={"algorithm": "rendezvous-sha256", "members": []})
        assert request.method == "POST" and path == "/produce", path
        deadline = request.headers.get("llog-commit-deadline-ms")
        attempts = []
        for entry in wire_produce.parse(request.content, 1000):
            records = entry.records.decoded()
            # What makes a retry the same entry: its producer sequence, or (placed by
            # key) its idempotency key; the fake dedupes either by its key window.
            key = (f"{entry.topic}:{entry.partition}:{entry.producer.producer_id}#"
                   f"{entry.producer.sequence}"
                   if entry.producer is not None else entry.idempotency_key or "")
            self.numbers[key] += 1
            attempts.append(Attempt(
                f"{request.url.scheme}://{request.url.host}", entry.topic,
                -1 if entry.partition is None else entry.partition, key,
                [r if isinstance(r, bytes) else r.value for r in records],
                [None if isinstance(r, bytes) else r.key for r in records],
                self.numbers[key], None if deadline is None else int(deadline),
                None if entry.producer is None else (entry.producer.producer_id,
                                                     entry.producer.sequence)))
        self.requests.append(attempts)
        if self.before is not None:
            answer = await self.before(self, request, attempts)
            if answer is not None:
                return answer
        if not self.auto_create and any(a.topic not in self.topics for a in attempts):
            return error_response(404, "UnknownTopic")
        results = [self.fault(a) if self.fault else None for a in attempts]
        results = [r if r is not None else self.append(a) for a, r in zip(
            attempts, results, strict=True)]
        ok = sum(1 for r in results if r["ok"])
        status = 200 if ok == len(results) else 409
        response = httpx.Response(status, json={
            "results": results, "success_count": ok, "error_count": len(results) - ok})
        if self.after is not None:
            response = await self.after(self, request, attempts, response)
        return response

    async def _describe(self, request: httpx.Request, topic: str) -> httpx.Response:
        self.lookups.append(topic)
        if self.lookup is not None:
            answer = await self.lookup(request)
            if answer is not None:
                return answer
        if topic not in self.topics:
            return error_response(404, "UnknownTopic")
        return httpx.Response(200, json={"topic": topic, "partitions": self.topics[topic],
                                         "compression": "none"})

    def append(self, attempt: Attempt) -> dict[str, Any]:
        """The entry appended (or answered as a duplicate within the key window)."""
        topic = attempt.topic
        if topic not in self.topics:
            self.topics[topic] = max(self.auto_partitions, attempt.partition + 1)
        partition = attempt.partition
        if partition < 0:
            keys = set(attempt.record_keys)
            assert len(keys) == 1 and None not in keys, "by key: one key per entry"
            partition = partition_for_key(keys.pop() or b"", self.topics[topic])
        if attempt.producer is not None:
            return self._append_sequenced(attempt, topic, partition, attempt.producer)
        window = self.windows[(topic, partition)]
        if attempt.key and attempt.key in window:
            start, count = window[attempt.key]
            return {"topic": topic, "partition": partition, "ok": True, "outcome": "success",
                    "start_offset": start, "end_offset": start + count - 1, "count": count,
                    "duplicate": True}
        log = self.logs[(topic, partition)]
        start = len(log) + 1
        log.extend(attempt.values)
        if attempt.key:
            window[attempt.key] = (start, len(attempt.values))
            while len(window) > WINDOW:
                window.popitem(last=False)
        return {"topic": topic, "partition": partition, "ok": True, "outcome": "success",
                "start_offset": start, "end_offset": len(log), "count": len(attempt.values)}

    def _append_sequenced(self, attempt: Attempt, topic: str, partition: int,
                          producer: tuple[str, int]) -> dict[str, Any]:
        """As the broker judges a producer's entry (docs/http-api.md, Idempotent
        producers): a repeat, the next, a gap, or a producer it does not know."""
        pid, seq = producer
        state = self.producers.get((topic, partition, pid))
        if state is not None and seq in state[1]:
            start, count = state[1][seq]
            return {"topic": topic, "partition": partition, "ok": True, "outcome": "success",
                    "start_offset": start, "end_offset": start + count - 1, "count": count,
                    "duplicate": True}
        if state is None and seq != 0:
            return failed("UnknownProducer", retriable=False)
        if state is not None and seq > state[0] + 1:
            return failed("OutOfOrderSequence", retriable=True)
        if state is not None and seq <= state[0]:
            return failed("DuplicateSequence", retriable=False, maybe_written=True)
        log = self.logs[(topic, partition)]
        start = len(log) + 1
        log.extend(attempt.values)
        ranges = {} if state is None else state[1]
        ranges[seq] = (start, len(attempt.values))
        ranges.pop(seq - REMEMBERED_SEQUENCES, None)  # the broker keeps the last 5
        self.producers[(topic, partition, pid)] = (seq, ranges)
        return {"topic": topic, "partition": partition, "ok": True, "outcome": "success",
                "start_offset": start, "end_offset": len(log), "count": len(attempt.values)}


def run(main: Callable[[], Awaitable[Any]], seconds: float = 20) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(seconds):
            return await main()

    return anyio.run(bounded)


async def _wait(event: asyncio.Event, seconds: float = 5) -> None:
    with anyio.fail_after(seconds):
        await event.wait()




def cut_first_answer(values: list[bytes]) -> After:
    """An ``after`` hook: the first attempt of the entry holding ``values`` is appended,
    and its answer is lost (the connection cut)."""

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if any(a.values == values and a.number == 1 for a in attempts):
            raise httpx.ReadError("the answer was cut")
        return response

    return after


def _raise(*_: object) -> None:
    raise RuntimeError("a caller's callback failed")


# == Bugs: each test fails now; it passes once the bug is fixed ===========================

# -- 3. no failure path strands a waiter --------------------------------------------------


def test_a_raising_done_callback_strands_the_other_batches_waiters() -> None:
    fake = FakeBroker({"t": 2})

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                 **PLAIN) as producer:
            first = await producer.send("t", b"a", partition=0)
            second = await producer.send("t", b"b", partition=1)  # the same request
            first.add_done_callback(_raise)
            with anyio.fail_after(3):
                assert (await second).offset == 1
            later = await producer.send("t", b"c", partition=1)
            with anyio.fail_after(3):
                assert (await later).offset == 2  # and the producer still works

    run(main)


def test_a_raising_on_delivery_callback_neither_hangs_flush_nor_kills_the_producer() -> None:
    fake = FakeBroker({"t": 2})

    def on_delivery(meta: RecordMetadata | None, error: LlogError | None) -> None:
        if meta is not None and meta.partition == 0:
            _raise()

    with Producer(A, transport=fake.transport(), linger_ms=60_000, on_delivery=on_delivery,
                  **PLAIN) as producer:
        producer.send("t", b"a", partition=0)
        second = producer.send("t", b"b", partition=1)
        producer.flush(timeout=3)
        assert second.result(0).offset == 1
        third = producer.send("t", b"c", partition=1)
        producer.flush(timeout=3)
        assert third.result(0).offset == 2


def test_an_answer_outside_the_contract_settles_the_batch() -> None:
    fake = FakeBroker({"t": 1})

    async def garble(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                     response: httpx.Response) -> httpx.Response:
        return httpx.Response(200, json={"results": [{"ok": True, "partition": 0}]})

    fake.after = garble
    with Producer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        future = producer.send("t", b"a", partition=0)
        assert isinstance(future.exception(3), LlogError)


def test_an_answer_that_does_not_decode_is_retried() -> None:
    fake = FakeBroker({"t": 1})

    async def garble(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                     response: httpx.Response) -> httpx.Response:
        if attempts[0].number == 1:  # written; the answer's gzip stream is broken
            return httpx.Response(200, content=b"not gzip",
                                  headers={"content-encoding": "gzip"})
        return response

    fake.after = garble
    with Producer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        future = producer.send("t", b"a", partition=0)
        assert future.result(3) == RecordMetadata("t", 0, 1, True)
        assert producer.send("t", b"b", partition=0).result(3).offset == 2


def test_an_out_of_range_timestamp_fails_only_its_own_record() -> None:
    fake = FakeBroker({"t": 2})
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        good = producer.send("t", b"ok", partition=0)
        with contextlib.suppress(ValueError, OverflowError):  # refused at once: fine
            producer.send("t", b"bad", partition=1, timestamp_ms=2**63)
        with contextlib.suppress(LlogError):
            producer.flush(3)
        assert good.result(0).offset == 1
        more = producer.send("t", b"more", partition=0)
        producer.flush(3)
        assert more.result(0).offset == 2


def test_close_timeout_says_an_abandoned_request_may_have_been_written() -> None:
    fake = FakeBroker({"t": 1})

    async def hang(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                   response: httpx.Response) -> httpx.Response:
        await anyio.sleep_forever()  # appended; the answer never comes
        return response

    fake.after = hang
    producer = Producer(A, transport=fake.transport(), linger_ms=0, **PLAIN)
    future = producer.send("t", b"a", partition=0)
    producer.close(timeout=0.3)
    error = future.exception(0)
    assert isinstance(error, ProducerClosed)
    assert fake.logs[("t", 0)] == [b"a"]  # it was written
    assert error.maybe_written


def test_leaving_the_async_producer_while_cancelled() -> None:
    fake = FakeBroker({"t": 1})

    async def stall(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                    ) -> httpx.Response | None:
        await anyio.sleep_forever()
        return None

    fake.before = stall

    async def main() -> None:
        future = None
        with anyio.move_on_after(0.3):
            async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                     **PLAIN) as producer:
                future = await producer.send("t", b"a", partition=0)
                await future
        assert future is not None
        with anyio.fail_after(3):
            with pytest.raises(LlogError):
                await future

    run(main)


def test_an_async_send_after_close_raises_producer_closed() -> None:
    fake = FakeBroker({"t": 1})

    async def main() -> None:
        producer = AsyncProducer(A, transport=fake.transport(), **PLAIN)
        await producer.start()
        await producer.close()
        with pytest.raises(ProducerClosed):
            await producer.send("other", b"x")

    run(main)


def test_close_during_a_first_lookup_raises_producer_closed() -> None:
    fake = FakeBroker({"t": 1})
    asked = threading.Event()

    async def stall(request: httpx.Request) -> httpx.Response | None:
        asked.set()
        await anyio.sleep_forever()
        return None

    fake.lookup = stall
    producer = Producer(A, transport=fake.transport(), linger_ms=0, max_block_ms=5000)
    outcome: list[BaseException | object] = []

    def send() -> None:
        try:
            outcome.append(producer.send("t", b"a"))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    assert asked.wait(5)
    producer.close(timeout=1)
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(outcome[0], ProducerClosed), outcome


def test_a_delivery_callback_may_send_to_a_topic_not_used_yet() -> None:
    fake = FakeBroker({"t": 1, "audit": 1})
    holder: list[Producer] = []
    chained: list[object] = []
    done = threading.Event()

    def on_delivery(meta: RecordMetadata | None, error: LlogError | None) -> None:
        if meta is not None and meta.topic == "t":
            try:
                chained.append(holder[0].send("audit", b"copy"))
            except LlogError as exc:
                chained.append(exc)
            done.set()

    with Producer(A, transport=fake.transport(), linger_ms=0, max_block_ms=300,
                  request_timeout_s=1, delivery_timeout_ms=2000, on_delivery=on_delivery,
                  compression="none") as producer:
        holder.append(producer)
        producer.send("t", b"a", partition=0)
        assert done.wait(10)
        assert isinstance(chained[0], RecordFuture), chained
        assert chained[0].result(3).topic == "audit"


def test_a_delivery_callback_never_waits_for_buffer_space() -> None:
    fake = FakeBroker({"t": 2})
    seen, release, returned = threading.Event(), threading.Event(), threading.Event()
    holder: list[Producer] = []

    async def hold(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                   ) -> httpx.Response | None:
        if attempts[0].partition == 1:
            seen.set()
            await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return None

    def on_delivery(meta: RecordMetadata | None, error: LlogError | None) -> None:
        if meta is not None and meta.partition == 0:
            with contextlib.suppress(LlogError):
                holder[0].send("t", b"c" * 100, partition=0)  # does not fit now
            returned.set()

    fake.before = hold
    with Producer(A, transport=fake.transport(), linger_ms=0, buffer_bytes=200,
                  max_block_ms=3000, on_delivery=on_delivery, **PLAIN) as producer:
        holder.append(producer)
        try:
            held = producer.send("t", b"b" * 100, partition=1)  # 116 bytes, held in flight
            assert seen.wait(5)
            producer.send("t", b"a", partition=0)
            assert returned.wait(1), "the sender is stuck in a callback's send"
        finally:
            release.set()
        assert held.result(5).offset == 1


# -- 1. a record is stored once ----------------------------------------------------------


def test_a_retried_by_key_batch_of_a_new_topic_is_stored_once() -> None:
    fake = FakeBroker()  # the topic is created on use, with one partition
    cut = asyncio.Event()
    overtaken = asyncio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if attempts[0].values == [b"first"] and attempts[0].number == 2:
            with anyio.move_on_after(1):  # the retry is slower than the other keys'
                await overtaken.wait()    # batches, if they may pass it at all
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if attempts[0].values == [b"first"] and attempts[0].number == 1:
            cut.set()
            raise httpx.ReadError("the answer was cut")
        if len(fake.logs[("t", 0)]) > WINDOW:
            overtaken.set()
        return response

    fake.before, fake.after = before, after

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                 **PLAIN) as producer:
            first = await producer.send("t", b"first", key=b"k")
            await _wait(cut)
            for i in range(WINDOW + 1):
                await producer.send("t", b"r%d" % i, key=b"k%d" % i)
            await producer.flush()
            await first

    run(main)
    assert fake.logs[("t", 0)].count(b"first") == 1


def test_unordered_retries_stay_within_the_key_window() -> None:
    fake = FakeBroker({"t": 1})
    overtaken = asyncio.Event()

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if attempts[0].values == [b"first"] and attempts[0].number == 1:
            with anyio.move_on_after(1):  # appended; the answer is slow while others
                await overtaken.wait()    # pass it, if they may, then cut
            raise httpx.ReadError("the answer was cut")
        if len(fake.logs[("t", 0)]) > WINDOW:
            overtaken.set()
        return response

    fake.after = after

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, ordered=False,
                                 max_in_flight=WINDOW + 2, **PLAIN) as producer:
            first = await producer.send("t", b"first", partition=0)
            for i in range(WINDOW):
                await anyio.lowlevel.checkpoint()  # each its own batch and request
                await producer.send("t", b"r%d" % i, partition=0)
            await producer.flush()
            await first

    run(main)
    assert fake.logs[("t", 0)].count(b"first") == 1


# -- 2. ordered: a partition's records stored in the order sent -------------------------


def test_by_key_records_of_a_new_topic_keep_their_order_without_faults() -> None:
    fake = FakeBroker()  # created on use, one partition: every key lands on 0

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=60_000,
                                 **PLAIN) as producer:
            for value, key in ((b"a", b"k1"), (b"b", b"k2"), (b"c", b"k1")):
                await producer.send("t", value, key=key)
            await producer.flush()

    run(main)
    assert fake.logs[("t", 0)] == [b"a", b"b", b"c"]


def test_by_key_records_of_a_new_topic_keep_their_order_across_a_retry() -> None:
    fake = FakeBroker()
    held = asyncio.Event()
    later_stored = asyncio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if attempts[0].values == [b"a"] and attempts[0].number == 1:
            held.set()
            with anyio.move_on_after(1):  # b is stored meanwhile, if it may pass a
                await later_stored.wait()
            return error_response(503, "BackPressureRejected", retry_after=0)
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if attempts[0].values == [b"b"]:
            later_stored.set()
        return response

    fake.before, fake.after = before, after

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                 **PLAIN) as producer:
            first = await producer.send("t", b"a", key=b"k1")
            await _wait(held)
            second = await producer.send("t", b"b", key=b"k2")
            await first
            await second

    run(main)
    assert fake.logs[("t", 0)] == [b"a", b"b"]


def cut_then_landing_late(*, arrival_s: float = 0.0, creates: str | None = None,
                          lands_with: bytes | None = None) -> tuple[Hook, After]:
    """A fake broker's hooks: record ``a``'s first attempt is taken in (``arrival_s``
    after it was sent: a busy broker, a slow network; creating topic ``creates``) and
    its answer cut; each later attempt is refused with a Retry-After past its delivery
    timeout, so it fails at once, maybe written. The first copy then lands at the next
    request (only one of ``lands_with``, when given) while within its commit deadline,
    counted from its arrival."""
    pending: list[tuple[Attempt, float]] = []

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        attempt = attempts[0]
        if attempt.values == [b"a"]:
            if attempt.number == 1:  # taken into the broker's batcher; the answer is cut
                assert attempt.deadline_ms is not None
                await anyio.sleep(arrival_s)
                if creates is not None:
                    fake.topics.setdefault(creates, 1)
                pending.append((attempt, time.monotonic() + attempt.deadline_ms / 1000))
                raise httpx.ReadError("the answer was cut")
            return error_response(503, "BackPressureRejected", retry_after=5)
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if lands_with is None or attempts[0].values == [lands_with]:
            for attempt, deadline in pending:
                if time.monotonic() < deadline:  # within its commit deadline: it lands
                    fake.append(attempt)
            pending.clear()
        return response

    return before, after


# Short timeouts: a batch refused with Retry-After 5 s fails at once.
QUICK_FAIL: dict[str, Any] = {"linger_ms": 0, "compression": "none", "request_timeout_s": 3,
                              "delivery_timeout_ms": 3000, "retry_backoff_ms": 50,
                              "retry_backoff_max_ms": 5000}


@pytest.mark.parametrize("arrival_s", [0.0, 0.5])
def test_a_maybe_written_batch_that_timed_out_does_not_land_after_its_successor(
        arrival_s: float) -> None:
    """``arrival_s``: how long after the client sent it the broker read the first
    attempt, and so started counting its commit deadline (a busy broker, a slow
    network): the partition is held past that deadline all the same."""
    fake = FakeBroker({"t": 1})
    fake.before, fake.after = cut_then_landing_late(arrival_s=arrival_s)
    with Producer(A, transport=fake.transport(), **QUICK_FAIL) as producer:
        first = producer.send("t", b"a", partition=0)
        error = first.exception(10)
        assert isinstance(error, DeliveryTimeout) and error.maybe_written
        assert producer.send("t", b"b", partition=0).result(10).offset >= 1
    assert fake.logs[("t", 0)] in ([b"b"], [b"a", b"b"])


def test_a_held_lane_of_keyed_records_holds_their_key_once_the_topic_is_known(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Records placed by the broker by key (the topic's partition count not known yet):
    one fails that may still commit, and their lane is held. The count becomes known
    meanwhile; the next record of the key still waits behind the hold, and is not sent
    to its partition straight away, where it could land before the earlier one."""
    monkeypatch.setattr(topic_meta, "UNKNOWN_AGE_S", 0.0)  # looked up again at each use
    fake = FakeBroker()  # "t" does not exist: the first attempt creates it
    fake.before, fake.after = cut_then_landing_late(creates="t", lands_with=b"b")
    with Producer(A, transport=fake.transport(), **QUICK_FAIL) as producer:
        error = producer.send("t", b"a", key=b"k").exception(10)
        assert isinstance(error, DeliveryTimeout) and error.maybe_written
        known = time.monotonic() + 10
        while producer.send("t", b"x").result(10).partition is not None and (
                producer._core.topics["t"].partitions is None):  # read again meanwhile
            assert time.monotonic() < known, "the topic was never read again"
        producer.send("t", b"b", key=b"k").result(10)
    stored = [v for v in fake.logs[("t", 0)] if v != b"x"]
    assert stored in ([b"b"], [b"a", b"b"]), fake.logs


@pytest.mark.parametrize("options", [
    {"request_timeout_s": 0}, {"request_timeout_s": -1}, {"batch_bytes": 0},
    {"linger_ms": -1}, {"batch_bytes": 8 << 20, "max_request_bytes": 4 << 20},
    {"delivery_timeout_ms": 1000, "request_timeout_s": 30},
], ids=["timeout-zero", "timeout-negative", "no-batch", "negative-linger",
        "batch-over-request", "delivery-under-request"])
def test_settings_that_cannot_work_are_refused_at_once(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Producer(A, transport=FakeBroker().transport(), **options)


# -- 7. errors, retries, brokers ---------------------------------------------------------


def test_an_unknown_topic_fails_only_its_own_batches() -> None:
    fake = FakeBroker({"known": 1}, auto_create=False)
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        good = producer.send("known", b"a", partition=0)
        bad = producer.send("missing", b"b", partition=0)  # the same request
        with contextlib.suppress(LlogError):
            producer.flush(5)
        assert isinstance(bad.exception(0), UnknownTopic)
        assert good.result(0).offset == 1


def test_a_draining_broker_is_left_for_the_next() -> None:
    fake = FakeBroker({"t": 1})

    async def draining(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                       ) -> httpx.Response | None:
        if attempts[0].url == A:
            return error_response(503, "ShuttingDown", retry_after=0)
        return None

    fake.before = draining
    with Producer([A, B], transport=fake.transport(), linger_ms=0, request_timeout_s=1,
                  delivery_timeout_ms=1000, **PLAIN) as producer:
        future = producer.send("t", b"a", partition=0)
        assert future.result(5).offset == 1


def test_a_topic_lookup_moves_to_the_next_broker() -> None:
    fake = FakeBroker({"t": 1})

    async def lookup(request: httpx.Request) -> httpx.Response | None:
        if request.url.host == "a.test":  # a broker without the read role
            return error_response(503, "RoleDisabled", retry_after=0)
        return None

    fake.lookup = lookup
    with Producer([A, B], transport=fake.transport(), linger_ms=0, max_block_ms=500,
                  request_timeout_s=1, delivery_timeout_ms=1000, **PLAIN) as producer:
        assert producer.send("t", b"a").result(5).offset == 1


def test_retry_after_is_waited_out() -> None:
    fake = FakeBroker({"t": 1})
    times: list[float] = []

    async def quota(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                    ) -> httpx.Response | None:
        times.append(time.monotonic())
        if attempts[0].number == 1:
            return error_response(429, "QuotaExceeded", retry_after=1)
        return None

    fake.before = quota
    with Producer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        assert producer.send("t", b"a", partition=0).result(5).offset == 1
    assert times[1] - times[0] >= 0.9


def test_the_sender_does_not_spin_while_max_in_flight_requests_travel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    checks = [0]
    spun = asyncio.Event()
    original = Accumulator.next_check_s

    def counted(self: Accumulator, now: float, *args: Any) -> float:
        checks[0] += 1
        if checks[0] > 200:
            spun.set()
        return original(self, now, *args)

    monkeypatch.setattr(Accumulator, "next_check_s", counted)
    fake = FakeBroker({"t": 2})
    release = asyncio.Event()

    async def slow(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                   ) -> httpx.Response | None:
        if attempts[0].partition == 0:
            await release.wait()
        return None

    fake.before = slow

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, max_in_flight=1,
                                 **PLAIN) as producer:
            first = await producer.send("t", b"a", partition=0)
            await anyio.lowlevel.checkpoint()  # the one request in flight
            second = await producer.send("t", b"b", partition=1)  # ready, must wait
            checks[0] = 0
            with anyio.move_on_after(0.5):
                await spun.wait()
            release.set()
            await first
            await second
            assert not spun.is_set(), f"{checks[0]} checks while one request travelled"

    run(main)


def test_a_slow_cluster_map_does_not_stall_produce() -> None:
    fake = FakeBroker({"t": 1})
    answer_map = threading.Event()

    async def slow_map() -> None:
        await anyio.to_thread.run_sync(answer_map.wait, abandon_on_cancel=True)

    fake.cluster = slow_map
    with Producer(A, transport=fake.transport(), route="preferred", linger_ms=0,
                  **PLAIN) as producer:
        try:
            future = producer.send("t", b"a", partition=0)
            assert future.result(3).offset == 1
        finally:
            answer_map.set()


def test_a_partition_is_not_passed_over_while_another_keeps_a_backlog() -> None:
    fake = FakeBroker({"t": 2})
    with Producer(A, transport=fake.transport(), linger_ms=60_000, max_in_flight=1,
                  batch_bytes=100, max_request_bytes=100, **PLAIN) as producer:
        for i in range(100):
            producer.send("t", b"%03d" % i + b"x" * 10, partition=0)  # about 30 batches
        lone = producer.send("t", b"lone", partition=1)
        # Full batches of partition 0 leave while they are appended: count from here.
        before = len(fake.requests)
        producer.flush(10)
        assert lone.result(0).offset == 1
    position = next(i for i, r in enumerate(fake.requests) if r[0].partition == 1)
    assert position - before <= 2, (f"partition 1 went in request {position} of "
                                    f"{len(fake.requests)}, queued after {before}")


def test_a_delivery_timeout_names_the_last_attempts_error() -> None:
    fake = FakeBroker({"t": 2})
    first_seen, second_sent, release = threading.Event(), threading.Event(), threading.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        assert len(attempts) == 1
        if attempts[0].partition == 0:
            if attempts[0].number == 1:
                first_seen.set()
                await anyio.to_thread.run_sync(second_sent.wait, abandon_on_cancel=True)
            return error_response(503, "BackPressureRejected", retry_after=0)
        await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)  # the slot
        return None

    fake.before = before
    with Producer(A, transport=fake.transport(), linger_ms=0, max_in_flight=1,
                  request_timeout_s=0.3, delivery_timeout_ms=300, compression="none",
                  retry_backoff_ms=50) as producer:
        try:
            first = producer.send("t", b"a", partition=0)
            assert first_seen.wait(5)
            producer.send("t", b"b", partition=1)  # takes the slot while "a" backs off
            second_sent.set()
            error = first.exception(5)
            assert isinstance(error, DeliveryTimeout)
            assert "BackPressureRejected" in str(error)
            assert isinstance(error.__cause__, LlogError)
        finally:
            release.set()


# == Guards: promises the producer keeps ==================================================


def _check_stored(fake: FakeBroker, placed: dict[bytes, RecordMetadata]) -> None:
    """Every acknowledged record is where its metadata says, and nothing is stored twice."""
    stored = [v for log in fake.logs.values() for v in log]
    assert len(stored) == len(set(stored)), "a record stored twice"
    for value, meta in placed.items():
        assert fake.logs[(meta.topic, meta.partition)][meta.offset - 1] == value


def test_threads_and_faults_store_each_record_once_in_order() -> None:
    """Threads send (by key, by partition, sticky) while the brokers refuse, cut answers
    after the commit, fail entries (in doubt after writing, too) and refuse connections,
    and another thread flushes: each record is stored once, where its future says, in
    the order its thread sent it within its partition; no bytes stay counted."""
    rng = random.Random(441257)
    lock = threading.Lock()
    fake = FakeBroker({"t": 3})

    def roll(p: float) -> bool:
        with lock:
            return rng.random() < p

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if roll(0.05):
            raise httpx.ConnectError("refused")
        if roll(0.05):
            return error_response(503, "BackPressureRejected", retry_after=0)
        return None

    def fault(attempt: Attempt) -> dict[str, Any] | None:
        if roll(0.05):
            return failed("CommitConflict", retriable=True)
        if roll(0.05):
            fake.append(attempt)
            return failed("CommitInDoubt", retriable=True, maybe_written=True)
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if roll(0.08):
            raise httpx.ReadError("the answer was cut")
        return response

    fake.before, fake.fault, fake.after = before, fault, after
    futures: dict[bytes, RecordFuture] = {}
    per_thread = 150

    def sender(producer: Producer, tid: int) -> None:
        for seq in range(per_thread):
            value = b"%d:%04d" % (tid, seq)
            if tid == 0:
                future = producer.send("t", value, key=b"k0")
            elif tid == 1:
                future = producer.send("t", value, partition=1)
            elif tid == 2:
                future = producer.send("t", value)  # sticky
            else:
                future = producer.send("t", value, key=b"k%d" % (seq % 5),
                                       headers=[("h", b"x")] if seq % 7 == 0 else None)
            with lock:
                futures[value] = future

    with Producer([A, B], transport=fake.transport(), linger_ms=1, batch_bytes=400,
                  max_in_flight=3, delivery_timeout_ms=60_000, **PLAIN) as producer:
        threads = [threading.Thread(target=sender, args=(producer, tid)) for tid in range(4)]
        for thread in threads:
            thread.start()
        for _ in range(3):
            producer.flush(30)
        for thread in threads:
            thread.join(30)
        producer.flush(30)
        metrics = producer.metrics()
    assert metrics["buffered_bytes"] == 0 and metrics["records_failed"] == 0
    assert metrics["records_sent"] == 4 * per_thread
    placed = {value: future.result(0) for value, future in futures.items()}
    _check_stored(fake, placed)
    for (_, partition), log in fake.logs.items():
        seen: dict[bytes, int] = {}
        for value in log:
            tid, seq = value.split(b":")
            assert seen.get(tid, -1) < int(seq), f"partition {partition} out of order"
            seen[tid] = int(seq)
    assert any(m.duplicate for m in placed.values())  # some retries met their first copy


def test_callbacks_added_while_batches_complete_run_once() -> None:
    fake = FakeBroker({"t": 4})
    calls: dict[RecordFuture, int] = defaultdict(int)
    lock = threading.Lock()

    def count(future: RecordFuture) -> None:
        # The future given equals (is not always) the one the callback was added to.
        with lock:
            calls[future] += 1

    with Producer(A, transport=fake.transport(), linger_ms=0, batch_bytes=100,
                  **PLAIN) as producer:
        futures = [producer.send("t", b"%05d" % i, partition=i % 4) for i in range(2000)]
        threads = [threading.Thread(target=lambda part=part: [
            f.add_done_callback(count) for f in futures[part::3]]) for part in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        producer.flush(30)
    assert len(calls) == len(futures) and set(calls.values()) == {1}
    assert set(calls) == set(futures)


def test_a_done_callback_holds_its_records_place_not_its_future() -> None:
    """A program that drops its futures frees them at once: the producer keeps a
    callback's function and its record's place, and gives the function a future equal
    to the one it was added to (same record, same outcome, same hash)."""
    fake = FakeBroker({"t": 2})
    got: list[RecordFuture] = []
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        first = producer.send("t", b"one", partition=0)
        second = producer.send("t", b"two", partition=0)
        held = sys.getrefcount(first)
        first.add_done_callback(got.append)
        assert sys.getrefcount(first) == held and not first.done()
        producer.flush(30)
    assert got == [first] and got[0] != second
    assert hash(got[0]) == hash(first) and got[0].result(0) == first.result(0)
    assert {got[0]: 1}[first] == 1


def test_a_request_refused_whole_is_sent_again_batch_by_batch() -> None:
    """413 for the request (one batch over the broker's record limit): each batch goes
    alone, the good ones are stored in order, the bad one fails; nothing stays counted."""
    fake = FakeBroker({"t": 3})

    async def limit(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                    ) -> httpx.Response | None:
        if any(len(v) > 100 for a in attempts for v in a.values):
            return error_response(413, "PayloadTooLarge")
        return None

    fake.before = limit
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        first = [producer.send("t", b"a%d" % i, partition=0) for i in range(3)]
        bad = producer.send("t", b"x" * 200, partition=1)
        other = producer.send("t", b"c", partition=2)
        with pytest.raises(PayloadTooLarge):
            producer.flush(10)
        later = [producer.send("t", b"b%d" % i, partition=0) for i in range(3)]
        producer.flush(10)
        assert isinstance(bad.exception(0), PayloadTooLarge)
        assert other.result(0).offset == 1
        assert [f.result(0).offset for f in first + later] == list(range(1, 7))
        assert producer.metrics()["buffered_bytes"] == 0
    assert fake.logs[("t", 0)] == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]


def test_a_retry_that_meets_its_first_copy_reports_that_copys_offsets() -> None:
    fake = FakeBroker({"t": 1})
    fake.after = cut_first_answer([b"v0", b"v1", b"v2"])
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        before = producer.send("t", b"before", partition=0)
        producer.flush(5)
        futures = [producer.send("t", b"v%d" % i, partition=0) for i in range(3)]
        producer.flush(5)
    assert before.result(0) == RecordMetadata("t", 0, 1, False)
    assert [f.result(0) for f in futures] == [RecordMetadata("t", 0, o, True)
                                              for o in (2, 3, 4)]
    assert fake.logs[("t", 0)] == [b"before", b"v0", b"v1", b"v2"]


def test_failover_after_a_cut_answer_stores_once_and_in_order() -> None:
    fake = FakeBroker({"t": 1})

    async def dead_a(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if attempts[0].url == A and attempts[0].number > 1:
            raise httpx.ConnectError("A is gone")
        return None

    fake.before = dead_a
    fake.after = cut_first_answer([b"a"])
    with Producer([A, B], transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        first = producer.send("t", b"a", partition=0)
        assert first.result(5) == RecordMetadata("t", 0, 1, True)
        assert producer.send("t", b"b", partition=0).result(5).offset == 2
    assert fake.logs[("t", 0)] == [b"a", b"b"]
    assert {r[0].url for r in fake.requests[1:]} == {B}


def test_keyed_records_follow_a_grown_partition_count(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """The topic grows from 1 to 3 partitions while keyed records flow: every record once,
    each partition's in the order sent."""
    from llog_client import _aio_producer, _topic_meta

    monkeypatch.setattr(_topic_meta, "MAX_AGE_S", 0.0)  # read again at every use
    monkeypatch.setattr(_aio_producer, "MAX_AGE_S", 0.0)
    fake = FakeBroker({"t": 1})

    async def main() -> dict[bytes, RecordMetadata]:
        futures = {}
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                 **PLAIN) as producer:
            for i in range(300):
                if i == 100:
                    fake.topics["t"] = 3
                value = b"%04d" % i
                futures[value] = await producer.send("t", value, key=b"k%d" % (i % 7))
                if i % 10 == 0:
                    await anyio.lowlevel.checkpoint()
            await producer.flush()
            return {v: await f for v, f in futures.items()}

    placed = run(main)
    _check_stored(fake, placed)
    assert {m.partition for m in placed.values()} == {0, 1, 2}
    for log in fake.logs.values():
        assert log == sorted(log)
    assert all(m.partition == partition_for_key(b"k%d" % (int(v) % 7), 3)
               for v, m in placed.items() if int(v) >= 150)


def test_delivery_timeout_while_queued_and_in_flight() -> None:
    """Attempts that time out (maybe written) until the delivery timeout: every record
    fails with DeliveryTimeout, maybe_written, its cause the last attempt's error; the
    ones queued behind expire too; nothing stays counted."""
    fake = FakeBroker({"t": 1})

    async def timeout(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                      ) -> httpx.Response | None:
        raise httpx.ReadTimeout("no answer")

    fake.before = timeout
    with Producer(A, transport=fake.transport(), linger_ms=0, request_timeout_s=0.3,
                  delivery_timeout_ms=400, **PLAIN) as producer:
        futures = [producer.send("t", b"%d" % i, partition=0) for i in range(20)]
        errors = [f.exception(5) for f in futures]
        assert all(isinstance(e, DeliveryTimeout) for e in errors)
        assert errors[0].maybe_written and errors[0].__cause__ is not None
        assert producer.metrics()["buffered_bytes"] == 0


def test_flush_timeout_then_flush() -> None:
    fake = FakeBroker({"t": 1})
    release = threading.Event()

    async def slow(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                   ) -> httpx.Response | None:
        await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return None

    fake.before = slow
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        future = producer.send("t", b"a", partition=0)
        with pytest.raises(TimeoutError):
            producer.flush(timeout=0.2)
        assert producer._core.acc.flushing == 0
        release.set()
        producer.flush(5)
        assert future.result(0).offset == 1


def test_close_with_a_timeout_settles_every_future() -> None:
    fake = FakeBroker({"t": 3})

    async def stall(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                    ) -> httpx.Response | None:
        await anyio.sleep_forever()
        return None

    fake.before = stall
    producer = Producer(A, transport=fake.transport(), linger_ms=0, max_in_flight=1,
                        **PLAIN)
    futures = [producer.send("t", b"%d" % i, partition=i % 3) for i in range(30)]
    producer.close(timeout=0.3)
    assert all(isinstance(f.exception(0), ProducerClosed) for f in futures)
    assert producer.metrics()["buffered_bytes"] == 0
    with pytest.raises(ProducerClosed):
        producer.send("t", b"late", partition=0)
    producer.flush(1)  # returns: nothing is left


def test_a_full_buffer_blocks_raises_and_never_overflows() -> None:
    fake = FakeBroker({"t": 1})
    release = threading.Event()

    async def slow(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                   ) -> httpx.Response | None:
        await anyio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        return None

    fake.before = slow
    with Producer(A, transport=fake.transport(), linger_ms=0, buffer_bytes=1000,
                  max_block_ms=200, **PLAIN) as producer:
        futures = []
        with pytest.raises(BufferFull):
            for _ in range(100):
                futures.append(producer.send("t", b"x" * 84, partition=0))
                assert producer.metrics()["buffered_bytes"] <= 1000
        assert len(futures) == 10
        release.set()
        producer.flush(5)
        assert [f.result(0).offset for f in futures] == list(range(1, 11))
        assert producer.metrics()["buffered_bytes"] == 0


def test_a_sender_crash_settles_every_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever stops the sender (here: a bug building a request), every future settles,
    flush returns and sends are refused."""
    from llog_client import _batch_wire

    def broken(batches: Any) -> bytes:
        raise RuntimeError("a bug")

    monkeypatch.setattr(_batch_wire, "envelope", broken)
    fake = FakeBroker({"t": 3})
    with Producer(A, transport=fake.transport(), linger_ms=60_000, **PLAIN) as producer:
        futures = [producer.send("t", b"%d" % i, partition=i % 3) for i in range(31)]
        with contextlib.suppress(LlogError):
            producer.flush(5)
        assert all(f.done() for f in futures)
        assert producer.metrics()["buffered_bytes"] == 0
        with pytest.raises(ProducerClosed):
            producer.send("t", b"late", partition=0)


def test_a_cancelled_wait_leaves_the_record_and_flush_in_order() -> None:
    fake = FakeBroker({"t": 1})
    release = asyncio.Event()

    async def slow(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                   ) -> httpx.Response | None:
        await release.wait()
        return None

    fake.before = slow

    async def main() -> None:
        async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                                 **PLAIN) as producer:
            future = await producer.send("t", b"a", partition=0)
            with anyio.move_on_after(0.05):
                await future
            with anyio.move_on_after(0.05):
                await producer.flush()
            assert producer._core.acc.flushing == 0
            release.set()
            assert (await future).offset == 1

    run(main)


def test_topic_lookups_that_fail() -> None:
    """A refused lookup raises its error from send; one that keeps failing retriably
    raises within max_block_ms (and a request timeout); an unknown topic with auto-create
    off fails its records with UnknownTopic."""
    fake = FakeBroker({"t": 1}, auto_create=False)

    async def lookup(request: httpx.Request) -> httpx.Response | None:
        topic = request.url.path.rsplit("/", 1)[1]
        if topic == "secret":
            return error_response(401, "Unauthenticated")
        if topic == "busy":
            return error_response(503, "StorageUnavailable", retry_after=0)
        return None

    fake.lookup = lookup
    with Producer(A, transport=fake.transport(), linger_ms=0, max_block_ms=300,
                  request_timeout_s=1, delivery_timeout_ms=1000, **PLAIN) as producer:
        with pytest.raises(LlogError) as refused:
            producer.send("secret", b"a")
        assert refused.value.error_type == "Unauthenticated"
        started = time.monotonic()
        with pytest.raises(LlogError):
            producer.send("busy", b"a")
        assert time.monotonic() - started < 2
        assert isinstance(producer.send("missing", b"a").exception(5), UnknownTopic)
        assert isinstance(producer.send("missing", b"a", key=b"k").exception(5),
                          UnknownTopic)


def test_close_while_threads_send() -> None:
    """close() while threads send: each send either returns a future that settles
    (delivered) or raises ProducerClosed; nothing is lost or stored twice."""
    fake = FakeBroker({"t": 2})
    flowing = threading.Event()

    async def cut_some(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                       response: httpx.Response) -> httpx.Response:
        if len(fake.requests) >= 10:
            flowing.set()
        if len(fake.requests) % 5 == 0:
            raise httpx.ReadError("the answer was cut")
        return response

    fake.after = cut_some
    outcomes: dict[bytes, RecordFuture | BaseException] = {}
    lock = threading.Lock()
    started = threading.Barrier(4)

    def sender(producer: Producer, tid: int) -> None:
        started.wait(5)
        for seq in range(1_000_000):  # until refused
            value = b"%d:%07d" % (tid, seq)
            try:
                outcome: RecordFuture | BaseException = producer.send(
                    "t", value, partition=tid % 2)
            except BaseException as exc:
                outcome = exc
            with lock:
                outcomes[value] = outcome
            if isinstance(outcome, BaseException):
                return

    # A small buffer: the senders soon wait for room (close() must refuse them too), and
    # what close() delivers is bounded, not whatever the threads buffered on a fast
    # machine before it came (tens of seconds of small requests on a loaded one).
    producer = Producer(A, transport=fake.transport(), linger_ms=1, batch_bytes=300,
                        buffer_bytes=64 * 1024, **PLAIN)
    threads = [threading.Thread(target=sender, args=(producer, tid)) for tid in range(3)]
    for thread in threads:
        thread.start()
    started.wait(5)
    assert flowing.wait(10)  # records travel, some answers are cut
    producer.close()
    for thread in threads:
        thread.join(30)
    futures = {v: o for v, o in outcomes.items() if isinstance(o, RecordFuture)}
    refused = [o for o in outcomes.values() if not isinstance(o, RecordFuture)]
    assert all(isinstance(o, ProducerClosed) for o in refused), refused
    assert len(refused) == 3  # each thread stopped at its first refusal
    placed = {v: f.result(0) for v, f in futures.items()}
    _check_stored(fake, placed)
    assert sum(map(len, fake.logs.values())) == len(placed)


def test_how_errors_are_mapped() -> None:
    """A proxy's 502 page is retried; a cut attempt then a refusal fails maybe_written; a
    failed entry's own flags win over its class (retriable false: no retry); a
    non-retriable entry fails at once."""
    fake = FakeBroker({"t": 4})

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        attempt = attempts[0]
        if attempt.partition == 0 and attempt.number == 1:
            return httpx.Response(502, text="<html>Bad Gateway</html>")
        if attempt.partition == 1:
            if attempt.number == 1:
                raise httpx.ReadError("the answer was cut")
            return error_response(403, "Forbidden")
        return None

    def fault(attempt: Attempt) -> dict[str, Any] | None:
        if attempt.partition == 2:
            return failed("CommitConflict", retriable=False)
        if attempt.partition == 3:
            return failed("PartitionFenced", retriable=False)
        return None

    fake.before, fake.fault = before, fault
    with Producer(A, transport=fake.transport(), linger_ms=0, max_request_entries=1,
                  **PLAIN) as producer:
        futures = [producer.send("t", b"%d" % p, partition=p) for p in range(4)]
        assert futures[0].result(5).offset == 1
        forbidden = futures[1].exception(5)
        assert forbidden is not None and forbidden.error_type == "Forbidden"
        assert forbidden.maybe_written and not forbidden.retriable
        assert futures[2].exception(5).error_type == "CommitConflict"
        assert futures[3].exception(5).error_type == "PartitionFenced"
    assert [fake.numbers[a.key] for r in fake.requests for a in r
            if a.partition in (2, 3)] == [1, 1]


def test_a_delivery_callback_may_send_to_a_known_topic() -> None:
    fake = FakeBroker({"t": 1, "audit": 1})
    holder: list[Producer] = []
    chained: list[RecordFuture] = []
    done = threading.Event()

    def on_delivery(meta: RecordMetadata | None, error: LlogError | None) -> None:
        if meta is not None and meta.topic == "t":
            chained.append(holder[0].send("audit", b"copy", partition=0))
            done.set()

    with Producer(A, transport=fake.transport(), linger_ms=0, on_delivery=on_delivery,
                  **PLAIN) as producer:
        holder.append(producer)
        producer.send("t", b"a", partition=0)
        assert done.wait(5)
        assert chained[0].result(5) == RecordMetadata("audit", 0, 1, False)


# == Real brokers =========================================================================


def _partition_values(url: str, topic: str, partition: int) -> list[bytes]:
    with LlogClient(url) as llog:
        return [r.value for r in llog.iter_records(topic, partition, start="earliest",
                                                   follow=False)]


def test_real_broker_by_key_records_of_a_new_topic_keep_their_order(broker: Broker,
                                                                     topic: str) -> None:
    with Producer(broker.url, linger_ms=60_000, compression="none") as producer:
        for value, key in ((b"a", b"k1"), (b"b", b"k2"), (b"c", b"k1")):
            producer.send(topic, value, key=key)
        producer.flush(30)
    assert _partition_values(broker.url, topic, 0) == [b"a", b"b", b"c"]


def test_real_broker_unknown_topic_fails_only_its_own_batches(brokers: BrokerFactory,
                                                               topic: str) -> None:
    strict = brokers.start(auto_create_topics="false")
    with LlogClient(strict.url) as llog:
        llog.create_topic(topic, 1)
    with Producer(strict.url, linger_ms=60_000, compression="none") as producer:
        good = producer.send(topic, b"a", partition=0)
        bad = producer.send(f"{topic}-missing", b"b", partition=0)
        with contextlib.suppress(LlogError):
            producer.flush(30)
        assert isinstance(bad.exception(0), UnknownTopic)
        assert good.result(0).offset == 1
