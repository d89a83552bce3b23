"""A real broker keeps the bytes of its consume answers in flight within
LLOG_MAX_ANSWER_BYTES_IN_FLIGHT: an answer holds its share until it has been sent, a
read that finds no room waits for it (and goes on once an answer is sent) or, past
LLOG_ANSWER_BYTES_WAIT_MS, is refused with 503 and Retry-After; and many concurrent
large reads never hold more than the budget (its own figures say so, not timing)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.wire import records as wire
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import Broker, BrokerFactory

MiB = 1024 * 1024
BUDGET = 32 * MiB
# 32 records that together fill the budget but for the answer's framing: a binary
# answer of all of them is larger than any socket buffers, and fits the budget.
RECORD = MiB - 1024
RECORDS = 32
BINARY = {"accept": wire.CONTENT_TYPE}
# Answers as large as they are: compressed, these records would fit the socket buffers.
RAW = {"accept-encoding": "identity"}


async def _figures(http: httpx.AsyncClient) -> dict[str, float]:
    r = await http.get("/metrics/prometheus")
    r.raise_for_status()
    return {s.name: s.value for f in text_string_to_metric_families(r.text)
            for s in f.samples if s.name.startswith("llog_answer_")}


async def _until(http: httpx.AsyncClient, name: str, value: float) -> dict[str, float]:
    """The answer figures once ``name`` reads ``value`` (they change as answers are
    sent: the client may see a body before the server has finished sending it)."""
    for _ in range(600):
        figures = await _figures(http)
        if figures[name] == value:
            return figures
        await anyio.sleep(0.05)
    raise AssertionError(f"{name} is {figures[name]}, not {value}")


async def _at_least(http: httpx.AsyncClient, name: str, value: float) -> None:
    """Until the answer figure ``name`` reaches ``value`` (the caller bounds the wait:
    a metric has no event to wait on, so it is read again every 50 ms)."""
    for _ in range(1200):
        if (await _figures(http))[name] >= value:
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"{name} never reached {value}")


async def _fill(broker: Broker, topic: str) -> None:
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http:
        for _ in range(RECORDS // 8):
            r = await http.post("/produce", json=produce_body(topic, *["r" * RECORD] * 8))
            assert r.status_code == 200 and all(e["ok"] for e in r.json()["results"]), r.text


def _whole(topic: str, **extra: Any) -> dict[str, Any]:
    return consume_body(topic, max_bytes=BUDGET, **extra)


async def test_an_answer_holds_the_budget_until_sent_then_the_next_goes_in(
        brokers: BrokerFactory, topic: str) -> None:
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET),
                           answer_bytes_wait_ms="60000")
    await _fill(broker, topic)
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http, \
            httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as other:
        async with http.stream("POST", "/consume", json=_whole(topic), headers=BINARY) as big:
            assert big.status_code == 200
            # Not reading: the broker cannot send it all, and the answer holds its bytes.
            held = await _figures(other)
            assert held["llog_answer_bytes_in_flight"] >= RECORD * (RECORDS - 1)
            async with anyio.create_task_group() as tg:
                answers: list[httpx.Response] = []

                async def second() -> None:
                    answers.append(await other.post("/consume", json=_whole(topic),
                                                    headers=BINARY))

                tg.start_soon(second)
                async with httpx.AsyncClient(base_url=broker.url, headers=RAW,
                                             timeout=60) as watcher:
                    await _until(watcher, "llog_answer_waiting", 1)  # waits for room
                    assert not answers
                    body = await big.aread()  # sent: its bytes are given back ...
            # ... and the waiting read went in.
        (answer,) = answers
        assert answer.status_code == 200
        assert len(answer.content) == len(body) > RECORD * RECORDS
        figures = await _until(http, "llog_answer_bytes_in_flight", 0)
        assert figures["llog_answer_peak_bytes_in_flight"] <= BUDGET
        assert figures["llog_answer_refused_total"] == 0


async def test_past_the_wait_a_read_is_refused_with_503_and_retry_after(
        brokers: BrokerFactory, topic: str) -> None:
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET),
                           answer_bytes_wait_ms="200")
    await _fill(broker, topic)
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http, \
            httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as other:
        async with http.stream("POST", "/consume", json=_whole(topic), headers=BINARY) as big:
            assert big.status_code == 200
            for headers in (BINARY, {}):  # either format, the same refusal
                refused = await other.post("/consume", json=_whole(topic), headers=headers)
                assert refused.status_code == 503, refused.text[:300]
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error_type"] == "Unavailable"
                assert "LLOG_MAX_ANSWER_BYTES_IN_FLIGHT" in refused.json()["error"]
            await big.aread()
        again = await other.post("/consume", json=_whole(topic), headers=BINARY)
        assert again.status_code == 200
        figures = await _until(http, "llog_answer_bytes_in_flight", 0)
        assert figures["llog_answer_refused_total"] == 2
        assert figures["llog_answer_peak_bytes_in_flight"] <= BUDGET


async def test_concurrent_large_reads_stay_within_the_budget(
        brokers: BrokerFactory, topic: str) -> None:
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET),
                           answer_bytes_wait_ms="100")
    await _fill(broker, topic)
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60,
                                 limits=limits) as http:

        async def read(i: int) -> None:
            # Binary reads of the whole budget, JSON ones of a fifth of it (what their
            # encoding adds is reserved too), from different offsets.
            if i % 2:
                r = await http.post("/consume", headers=BINARY, json=_whole(
                    topic, topic_partitions=[{"topic": topic, "partition": 0,
                                              "fetch_offset": 1 + i % RECORDS}]))
            else:
                r = await http.post("/consume", json=consume_body(
                    topic, 1 + i % RECORDS, max_bytes=BUDGET // 5))
            if r.status_code == 503:
                assert r.headers["retry-after"] == "1"
            else:
                assert r.status_code == 200, r.text[:300]
            statuses.append(r.status_code)

        async with anyio.create_task_group() as tg:
            for i in range(48):
                tg.start_soon(read, i)
        figures = await _until(http, "llog_answer_bytes_in_flight", 0)
    assert len(statuses) == 48 and 200 in statuses
    assert figures["llog_answer_peak_bytes_in_flight"] <= BUDGET
    assert figures["llog_answer_refused_total"] == statuses.count(503)
    assert figures["llog_answer_waiting"] == 0


async def test_a_stream_batch_holds_the_budget_until_the_stream_ends(
        brokers: BrokerFactory, topic: str) -> None:
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET))
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http:
        r = await http.post("/produce", json=produce_body(topic, "s" * 100_000))
        assert r.status_code == 200
        async with http.stream("GET", f"/topics/{topic}/stream?from=earliest") as stream:
            assert stream.status_code == 200
            async for line in stream.aiter_lines():
                if line.startswith("event: records"):
                    break  # the batch was read (and reserved) and sent
        # Closed by the client: the slot and the batch's share are given back.
        figures = await _until(http, "llog_answer_bytes_in_flight", 0)
    assert figures["llog_answer_peak_bytes_in_flight"] >= 4 * 100_000


async def test_a_waiting_long_poll_holds_only_what_it_read(
        brokers: BrokerFactory, topic: str) -> None:
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET),
                           answer_bytes_wait_ms="200")
    await _fill(broker, topic)
    idle = f"{topic}-idle"
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http, \
            httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as other:
        r = await http.post("/produce", json=produce_body(idle, "first"))
        assert r.status_code == 200
        async with anyio.create_task_group() as tg:
            polled: list[httpx.Response] = []

            async def long_poll() -> None:  # the whole budget's max_bytes, nothing to read
                polled.append(await http.post("/consume", json=consume_body(
                    idle, 2, max_bytes=BUDGET, max_wait_ms=30_000)))

            tg.start_soon(long_poll)
            for _ in range(600):
                r = await other.get("/metrics/prometheus")
                if "llog_consume_long_polls 1.0" in r.text:
                    break
                await anyio.sleep(0.05)
            else:
                raise AssertionError("the long-poll never parked")
            # While it waits, a read of the whole budget goes in at once.
            whole = await other.post("/consume", json=_whole(topic), headers=BINARY)
            assert whole.status_code == 200, whole.text[:300]
            r = await other.post("/produce", json=produce_body(idle, "second"))
            assert r.status_code == 200
        (answer,) = polled
        assert answer.status_code == 200
        assert [x["value"] for x in answer.json()["results"][0]["records"]] == ["second"]
        figures = await _until(http, "llog_answer_bytes_in_flight", 0)
    assert figures["llog_answer_refused_total"] == 0


async def test_a_stream_refused_room_waits_with_heartbeats_instead_of_dying(
        brokers: BrokerFactory, topic: str) -> None:
    """An event stream whose read finds the budget full past the wait is not dropped
    (a browser stream opened with a ticket could not reconnect): it sends heartbeats,
    reads again, and delivers once room is given back."""
    broker = brokers.start(max_answer_bytes_in_flight=str(BUDGET),
                           answer_bytes_wait_ms="200")
    await _fill(broker, topic)
    async with httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as http, \
            httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as other, \
            httpx.AsyncClient(base_url=broker.url, headers=RAW, timeout=60) as watcher, \
            http.stream("POST", "/consume", json=_whole(topic), headers=BINARY) as big:
        assert big.status_code == 200  # not read: it holds the budget
        records = anyio.Event()
        lines: list[str] = []

        async def follow() -> None:
            async with other.stream(
                    "GET", f"/topics/{topic}/stream?from=earliest&max_bytes={MiB}"
                    ) as stream:
                assert stream.status_code == 200
                async for line in stream.aiter_lines():
                    lines.append(line)
                    if line.startswith("event: records"):
                        records.set()
                        return

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            with anyio.fail_after(60):  # refused twice: it read again once
                await _at_least(watcher, "llog_answer_refused_total", 2)
            assert not records.is_set()
            await big.aread()  # sent: room is given back
            with anyio.fail_after(60):
                await records.wait()
    assert ": heartbeat" in lines
