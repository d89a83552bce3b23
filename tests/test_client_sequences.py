"""The producers' sequences (docs/http-api.md, Idempotent producers): an ordered producer
sends each partition's batches as its sequence, so a retry is answered, not written
again, however many keyed appends came meanwhile; a broken or forgotten sequence starts
again under a new producer id."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.storage.appends import ProducerSeq
from app.wire import produce as wire_produce
from llog_client import AsyncProducer, InvalidRequest, PartitionFenced, RecordMetadata
from tests.helpers.bodies import consume_body
from tests.helpers.stack import make_settings
from tests.test_client_producer_faults import (
    PLAIN,
    Attempt,
    FakeBroker,
    error_response,
    failed,
)

A = "http://a.test"


class _CutFirstAnswer(httpx.AsyncBaseTransport):
    """The app, whose first produce answer is lost after it was written: other clients
    make ``others`` keyed appends to the partition meanwhile."""

    def __init__(self, app: Any, topic: str, others: int) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self._topic, self._others, self.cut = topic, others, 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if request.url.path != "/produce" or self.cut:
            return response
        await response.aread()
        assert response.status_code == 200, response.text
        self.cut += 1
        for i in range(self._others):
            other = await self._inner.handle_async_request(httpx.Request(
                "POST", "http://broker/produce", json={"topic_partitions": [
                    {"topic": self._topic, "partition": 0, "records": ["other"],
                     "idempotency_key": f"other-{i}"}]}))
            await other.aread()
            assert other.status_code == 200
        raise httpx.ReadError("the answer was cut")


async def test_a_retry_after_many_keyed_appends_is_not_written_twice(
        stack: LocalStack, topic: str) -> None:
    """The first answer is lost after the broker wrote the batch; 100 keyed appends
    follow (more than the idempotency window's 64); the producer's retry is answered
    as a duplicate, and the log holds one copy."""
    app = create_app(make_settings(stack))
    async with app.router.lifespan_context(app):
        transport = _CutFirstAnswer(app, topic, 100)
        async with AsyncProducer("http://broker", transport=transport, linger_ms=0,
                                 **PLAIN) as producer:
            first = await (await producer.send(topic, b"once", partition=0))
            second = await (await producer.send(topic, b"next", partition=0))
        assert transport.cut == 1
        assert first == RecordMetadata(topic, 0, 1, True)  # answered by the retry
        assert second.offset == 102 and not second.duplicate
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://broker") as http:
            r = await http.post("/consume", json=consume_body(topic, 1, 0))
            values = [x["value"] for x in r.json()["results"][0]["records"]]
        assert values.count("once") == 1 and values[-1] == "next" and len(values) == 102


async def test_a_failed_batch_starts_a_new_sequence_and_a_forgotten_one_restarts() -> None:
    """Partition 0: the second batch fails for good, so the third goes under a new
    producer id from 0. Partition 1: the broker answers UnknownProducer once; nothing of
    the batch was written, so it is sent again at once as 0 of a new id, and succeeds."""
    fake = FakeBroker({"t": 2})
    forgotten: list[Attempt] = []

    def fault(attempt: Attempt) -> dict[str, Any] | None:
        if attempt.partition == 0 and attempt.values == [b"b"]:
            return failed("PartitionFenced", retriable=False)
        if attempt.partition == 1 and not forgotten:
            forgotten.append(attempt)
            return failed("UnknownProducer", retriable=False)
        return None

    fake.fault = fault
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        assert (await (await producer.send("t", b"a", partition=0))).offset == 1
        with pytest.raises(PartitionFenced):
            await (await producer.send("t", b"b", partition=0))
        assert (await (await producer.send("t", b"c", partition=0))).offset == 2
        assert (await (await producer.send("t", b"x", partition=1))).offset == 1
    sent = [(a.partition, a.key) for r in fake.requests for a in r]
    zero = [key.split(":", 2)[2] for p, key in sent if p == 0]
    base = zero[0].split(".")[0]
    assert zero == [f"{base}.0#0", f"{base}.0#1", f"{base}.1#0"]
    one = [key.split(":", 2)[2] for p, key in sent if p == 1]
    assert one == [f"{base}.0#0", f"{base}.1#0"]


async def test_batches_placed_by_key_keep_idempotency_keys() -> None:
    """A topic the client does not know yet: the broker places its keyed records."""
    fake = FakeBroker()
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        await (await producer.send("new", b"v", key=b"k"))
    (attempt,), = fake.requests
    assert ":" not in attempt.key and attempt.key  # an idempotency key, not a sequence


def test_the_envelope_the_client_writes_is_the_brokers() -> None:
    """The client's LLP2 bytes read back by the broker's parser."""
    from llog_client import _codec as codec
    body = codec.envelope([(b"t", 3, b"", codec.V3, codec.v3_parts([b"a"], None, None)),
                           (b"t", -1, b"key-1", codec.V3, codec.v3_parts([b"b"], None, None))],
                          [(b"p.0", 2**40), None])
    first, second = wire_produce.parse(body, 10)
    assert (first.partition, first.producer, first.idempotency_key) == (
        3, ProducerSeq("p.0", 2**40), None)
    assert (second.partition, second.producer, second.idempotency_key) == (None, None, "key-1")


def _values(fake: FakeBroker, partition: int = 0) -> list[bytes]:
    return fake.logs[("t", partition)]


async def _requests(fake: FakeBroker, n: int) -> None:
    """Until the fake has seen ``n`` produce requests (its hooks see them as they
    come; checked each millisecond, for at most 5 s)."""
    with anyio.fail_after(5):
        while len(fake.requests) < n:  # noqa: ASYNC110 (the fake has no event to wait on)
            await anyio.sleep(0.001)


async def _send_two_in_flight(fake: FakeBroker) -> None:
    """``a`` to partition 0, then, once its request is out, ``b``: stored in that order
    at offsets 1 and 2."""
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        first = await producer.send("t", b"a", partition=0)
        await _requests(fake, 1)
        second = await producer.send("t", b"b", partition=0)
        assert (await first).offset == 1 and (await second).offset == 2
    assert _values(fake) == [b"a", b"b"]


async def test_a_partitions_batches_travel_together_in_order() -> None:
    """The first batch's request is held until the second one's arrives: both are in
    flight at once (one at a time, the second would never come and the test would time
    out), and the log holds them in the order sent."""
    fake = FakeBroker({"t": 1})
    second_came = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if attempts[0].values == [b"a"]:
            with anyio.fail_after(5):
                await second_came.wait()
        elif attempts[0].values == [b"b"]:
            second_came.set()
        return None

    fake.before = before
    await _send_two_in_flight(fake)


async def test_a_batch_behind_one_that_failed_waits_for_it_and_keeps_the_order() -> None:
    """The first batch's first attempt is held until the second's arrives and is then
    refused (503); the second, read first, is "unknown" (its producer's 0 is not in): it
    goes again only once the first is retried and in, and both are stored once, in
    order."""
    fake = FakeBroker({"t": 1})
    second_came = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        attempt = attempts[0]
        if attempt.values == [b"b"] and attempt.number == 1:
            second_came.set()
        if attempt.values == [b"a"] and attempt.number == 1:
            with anyio.fail_after(5):
                await second_came.wait()
            await anyio.sleep(0.05)  # the second's answer comes back first
            return error_response(503, "StorageUnavailable")
        return None

    fake.before = before
    await _send_two_in_flight(fake)
    sent = [(a.values, a.producer) for r in fake.requests for a in r]
    assert sent[-2:] == [([b"a"], sent[0][1]), ([b"b"], sent[1][1])]


async def test_batches_behind_one_that_fails_for_good_go_on_in_a_new_sequence() -> None:
    """Three batches in flight; the first is refused for good. The two behind it were not
    written (its 0 is missing, so they are refused too): they are sent again as 0 and 1
    of a new sequence, after the first's failure, and stored in order."""
    fake = FakeBroker({"t": 1})
    all_came = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        values = attempts[0].values
        if values == [b"c"]:
            all_came.set()
        if values in ([b"a"], [b"b"]) and attempts[0].number == 1:
            with anyio.fail_after(5):
                await all_came.wait()  # all three in flight
            if values == [b"a"]:
                await anyio.sleep(0.05)  # answered after the two behind it
                return error_response(400, "InvalidRequest")
        return None

    fake.before = before
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        futures = []
        for value in (b"a", b"b", b"c"):
            futures.append(await producer.send("t", value, partition=0))
            await _requests(fake, len(futures))
        with pytest.raises(InvalidRequest):
            await futures[0]
        assert (await futures[1]).offset == 1 and (await futures[2]).offset == 2
    assert _values(fake) == [b"b", b"c"]
    last_two = [a.producer for r in fake.requests[-2:] for a in r]
    assert [seq for _, seq in last_two] == [0, 1]  # type: ignore[misc]
    assert last_two[0][0] != fake.requests[0][0].producer[0]  # type: ignore[index]


def _sent(fake: FakeBroker, value: bytes) -> int:
    """How many times ``value``'s batch was sent."""
    return sum(1 for r in fake.requests for a in r if a.values == [value])


async def _until_sent(fake: FakeBroker, value: bytes, times: int = 1) -> None:
    with anyio.fail_after(5):
        while _sent(fake, value) < times:  # noqa: ASYNC110 (the fake has no event to wait on)
            await anyio.sleep(0.001)


async def test_batches_answered_out_of_order_after_a_break_keep_the_send_order() -> None:
    """a, b, c in flight; a is refused for good, then c is answered (unknown: its
    sequence's 0 never went in) before b. c must not go again under the left sequence
    beside a later d: b, c, d are stored in that order."""
    fake = FakeBroker({"t": 1})
    answered = {v: anyio.Event() for v in (b"a", b"c")}
    d_judged = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        at = attempts[0]
        if at.number == 1 and at.values in ([b"a"], [b"b"], [b"c"]):
            await _until_sent(fake, b"c")  # all three out
            if at.values == [b"a"]:
                answered[b"a"].set()
                return error_response(400, "InvalidRequest")
            with anyio.fail_after(5):
                await answered[b"a" if at.values == [b"c"] else b"c"].wait()
            await anyio.sleep(0.05)
            if at.values == [b"c"]:
                answered[b"c"].set()
            return None
        if at.values == [b"c"] and _sent(fake, b"c") >= 2:
            with anyio.fail_after(5):
                await d_judged.wait()  # a later batch judged before c's second attempt
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        if attempts[0].values == [b"d"]:
            d_judged.set()
        return response

    fake.before, fake.after = before, after
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        futures = []
        for value in (b"a", b"b", b"c"):
            futures.append(await producer.send("t", value, partition=0))
            await _requests(fake, len(futures))
        await _until_sent(fake, b"c", 2)
        futures.append(await producer.send("t", b"d", partition=0))
        with pytest.raises(InvalidRequest):
            await futures[0]
        assert [(await f).offset for f in futures[1:]] == [1, 2, 3]
    assert _values(fake) == [b"b", b"c", b"d"]


async def test_no_batch_goes_past_the_sequences_a_partition_remembers() -> None:
    """a is written and its answer lost; b..e are written, their answers held until a's
    retry is out. f must not be sent (and committed) before a's retry is answered: five
    sequences past a, a's retry would no longer be found (DuplicateSequence)."""
    fake = FakeBroker({"t": 1})
    retry_out = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        if attempts[0].values == [b"a"] and _sent(fake, b"a") == 2:
            retry_out.set()
            await anyio.sleep(0.05)  # anything sent beside it would be judged first
        return None

    async def after(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt],
                    response: httpx.Response) -> httpx.Response:
        at = attempts[0]
        if at.values == [b"a"] and at.number == 1:
            await _until_sent(fake, b"e")
            raise httpx.ReadError("the answer was cut")  # written, not acknowledged
        if at.values in ([b"b"], [b"c"], [b"d"], [b"e"]):
            with anyio.fail_after(5):
                await retry_out.wait()
        return response

    fake.before, fake.after = before, after
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0, **PLAIN) as producer:
        futures = []
        for value in (b"a", b"b", b"c", b"d", b"e"):
            futures.append(await producer.send("t", value, partition=0))
            await _requests(fake, len(futures))
        futures.append(await producer.send("t", b"f", partition=0))
        assert [(await f).offset for f in futures] == [1, 2, 3, 4, 5, 6]
    assert _values(fake) == [b"a", b"b", b"c", b"d", b"e", b"f"]


@pytest.mark.parametrize("cut", ["before_read", "after_break"])
async def test_batches_behind_a_certain_failure_go_on_at_once(cut: str) -> None:
    """a is refused for good (certainly not written), so nothing after it in its
    sequence can have been, whatever became of b's request (cut before the broker read
    it, or cut after a's refusal): b and c are stored, in order, long before the
    delivery timeout, and b does not fail as maybe written."""
    fake = FakeBroker({"t": 1})
    a_refused = anyio.Event()

    async def before(fake: FakeBroker, request: httpx.Request, attempts: list[Attempt]
                     ) -> httpx.Response | None:
        at = attempts[0]
        if at.values == [b"a"] and at.number == 1:
            await _until_sent(fake, b"b")
            if cut == "before_read":
                await anyio.sleep(0.05)  # b's cut is seen first
            a_refused.set()
            return error_response(400, "InvalidRequest")
        if at.values == [b"b"] and at.number == 1:
            if cut == "after_break":
                with anyio.fail_after(5):
                    await a_refused.wait()
                await anyio.sleep(0.05)
            raise httpx.ReadError("the request was cut")
        return None

    fake.before = before
    async with AsyncProducer(A, transport=fake.transport(), linger_ms=0,
                             delivery_timeout_ms=60_000, **PLAIN) as producer:
        fa = await producer.send("t", b"a", partition=0)
        await _requests(fake, 1)
        fb = await producer.send("t", b"b", partition=0)
        await _requests(fake, 2)
        fc = await producer.send("t", b"c", partition=0)
        with pytest.raises(InvalidRequest):
            await fa
        with anyio.fail_after(10):  # the delivery timeout is 60 s
            assert [(await fb).offset, (await fc).offset] == [1, 2]
    assert _values(fake) == [b"b", b"c"]
