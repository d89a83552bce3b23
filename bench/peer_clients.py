"""The Python clients of the peer comparison (bench/peer.py), one process per run, each
printing one JSON object: what a Python user of each system gets, and what the client
costs: its CPU (``time.process_time()``: every thread of the process, a client's I/O
threads included) from the first record to the last, per record.

    peer_clients.py KIND TARGET TOPIC [--seconds S] [--mib N] [--record-bytes B]
                    [--rate R] [--tasks N] [--fetch-bytes N] [--linger-ms MS]

Producers write records of --record-bytes (1 KiB of text) round-robin over the topic's 4
partitions, each to a partition named in the send, for --seconds or until --mib MiB are
sent. With --rate they are paced: record i is due at start + i/R, and its latency is from
then to its acknowledgement, so a record the client could not take on time counts its
wait too (no coordinated omission); the records due in the first --warmup seconds are
sent but not timed (the first records wait for the topic's metadata and connections).

    confluent-produce BOOTSTRAP TOPIC  confluent-kafka, acks=all, linger 5 ms
    aiokafka-produce BOOTSTRAP TOPIC   aiokafka, acks=all, linger 5 ms, 256 KiB batches
    llog-produce URL TOPIC             llog_client.AsyncLlogClient.produce (the client
                                       before Producer): --tasks calls in flight, each 100
                                       records to one partition; not paced
    llog-producer URL TOPIC            llog_client.Producer, its defaults (--linger-ms)
    llog-async-producer URL TOPIC      llog_client.AsyncProducer, its defaults

Consumers read the 4 partitions from the start until --mib MiB of values are read, every
value's length taken:

    confluent-consume BOOTSTRAP TOPIC  confluent-kafka, assigned, 4 MiB fetches
    aiokafka-consume BOOTSTRAP TOPIC   aiokafka, assigned, 4 MiB fetches
    llog-consume URL TOPIC             one httpx client, all 4 partitions in every request
                                       from offset 1, binary answers, --fetch-bytes per
                                       request, decoded by app.wire.records (before
                                       Consumer, which llog_client did not have)
    llog-consumer URL TOPIC            llog_client.Consumer, given the 4 partitions, to
                                       their end, record by record
    llog-consumer-batches URL TOPIC    the same, an answer at a time (poll_batch: each
                                       partition's values as one list)
    llog-async-consumer URL TOPIC      llog_client.AsyncConsumer, record by record

    kafka-topic BOOTSTRAP TOPIC        creates the topic, 4 partitions (no JVM start)
"""

from __future__ import annotations

import argparse
import array
import asyncio
import functools
import inspect
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
PARTITIONS = 4
FETCH_BYTES = 4 * MiB
BINARY = "application/vnd.llog.records"
KAFKA_LINGER_MS = 5
KAFKA_BATCH_BYTES = 262144
# Records sent between two looks at the clock when not paced: a clock read per record
# would be the bench's CPU, not the client's.
BURST = 64
# Paced, the shortest wait between bursts: a record due sooner waits with the next
# burst (its latency counts the wait). Shorter waits would spin the client's thread (a
# sleep of microseconds, librdkafka's poll rounds them to 0 ms) and take the cores the
# brokers need on a small machine.
TICK_S = 0.001
# A consumer that gets nothing for this long has read all there is.
IDLE_S = 30.0
# Paced, one record in this many is timed (the others are counted only), every client
# alike. A timed record costs the program a callback of its own, a clock read and a
# sample, about 1 µs of CPU a record in all on this machine's producers: at 145,000
# records/s, 0.15 of a core taken from the two the broker, MinIO and Oxia share, which
# lengthens the very latency measured (docs/performance.md, A strict paced comparison).
# 17, prime to the 4 partitions the records go round: every partition's are timed.
TIME_EVERY = 17


@dataclass
class Options:
    seconds: float = 10.0
    mib: float | None = None
    record_bytes: int = 1024
    rate: float | None = None  # records/s; None: back to back
    tasks: int = 32
    fetch_bytes: int = FETCH_BYTES
    linger_ms: float | None = None  # llog producers; None: the client's default
    # Paced: seconds sent at the rate before the measured ones, their records untimed:
    # the first records wait for the topic's metadata and new connections.
    warmup: float = 0.0
    time_every: int = TIME_EVERY  # paced: one record in this many is timed


def values_of(size: int) -> list[bytes]:
    """Distinct values of ``size`` bytes of printable text (the JSON produce of
    ``llog-produce`` takes text), about 16 MiB of them, sent in turn: one value sent over
    and over would compress to nothing in a client that compresses its batches."""
    count = min(65536, max(256, 16 * MiB // size))
    text = os.urandom(count * size // 2 + 1).hex().encode()
    return [text[i * size:(i + 1) * size] for i in range(count)]


# -- what a run measures ---------------------------------------------------------------


class Schedule:
    """Which records to send when: bursts of ``BURST`` for ``seconds`` (or until ``mib``
    MiB), or with a rate every record due by now, then a pause until the next is due."""

    def __init__(self, o: Options, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.rate = o.rate
        self.t0 = clock()
        self.timed_from = self.t0 + (o.warmup if o.rate else 0.0)
        self.end = self.timed_from + o.seconds
        self.want = None if o.mib is None else math.ceil(o.mib * MiB / o.record_bytes)
        self.every = o.time_every
        self.next = 0

    def burst(self) -> range | None:
        """The records to send now (maybe none yet); None once the run is over."""
        first = self.next
        if self.want is not None and self.rate is None:
            if first >= self.want:
                return None
            self.next = min(first + BURST, self.want)
            return range(first, self.next)
        now = self.clock()
        if now >= self.end:
            return None
        self.next = first + BURST if self.rate is None else int((now - self.t0) * self.rate) + 1
        self.next = max(self.next, first)
        return range(first, self.next)

    def due(self, i: int) -> float | None:
        """When record ``i`` was due, if paced, past the warm-up and one of those timed
        (one in ``time_every``); None for a record only counted."""
        if self.rate is None or i % self.every:
            return None
        at = self.t0 + i / self.rate
        return at if at >= self.timed_from else None

    def pause(self) -> float:
        """Seconds until the next record is due, at least a tick (0 when not paced, or
        when it is due already)."""
        if self.rate is None:
            return 0.0
        wait = self.t0 + self.next / self.rate - self.clock()
        return 0.0 if wait <= 0 else max(wait, TICK_S)


def percentiles(seconds: Sequence[float]) -> dict[str, Any]:
    """Nearest-rank percentiles of latencies given in seconds, in milliseconds."""
    xs = sorted(seconds)
    if not xs:
        return {"count": 0}

    def at(q: float) -> float:
        return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))] * 1e3

    return {"count": len(xs), "p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99),
            "p999_ms": at(0.999), "max_ms": xs[-1] * 1e3}


class Tally:
    """A producer run's outcomes, counted by the delivery callbacks (in whichever thread
    or task the client runs them): acknowledged records, failures, and the latency of
    each paced record."""

    def __init__(self) -> None:
        self.acked = self.errors = 0
        # An array, not a list: a list of a million floats is walked by every full
        # collection of Python's garbage collector (about 10 ms each), a pause that
        # would fall on whichever client's thread allocates and count in its latency.
        self.latencies = array.array("d")
        self.error_sample: str | None = None
        self._counted = functools.partial(self.of_future, None)

    def outcome(self, error: object, due: float | None) -> None:
        if error is None:
            self.acked += 1
            if due is not None:
                self.latencies.append(time.monotonic() - due)
            return
        self.errors += 1
        self.error_sample = self.error_sample or repr(error)[:300]

    def of_future(self, due: float | None, fut: Any) -> None:
        """A done callback's future (asyncio's, concurrent.futures' or llog_client's
        record futures): its ``result()`` raises the record's error."""
        try:
            fut.result()
        except (Exception, asyncio.CancelledError) as exc:  # counted, as a user would
            self.outcome(exc, due)
        else:
            self.outcome(None, due)

    def of_kafka(self, due: float | None, err: Any, _msg: Any) -> None:
        self.outcome(err, due)

    def callback(self, due: float | None) -> Callable[[Any], None]:
        """A done-callback for a record's future; one shared by every untimed record."""
        if due is None:
            return self._counted
        return functools.partial(self.of_future, due)


class Meter:
    """Wall and CPU time from the first record on."""

    def __init__(self) -> None:
        self.t0, self.cpu0 = time.monotonic(), time.process_time()

    def figures(self, records: int, value_bytes: float) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        cpu = time.process_time() - self.cpu0
        return {"records": records, "mib": value_bytes / MiB, "seconds": wall,
                "records_per_s": records / wall, "mib_per_s": value_bytes / wall / MiB,
                "client_cpu_s": cpu,
                "cpu_us_per_record": cpu / records * 1e6 if records else None}


def produced(meter: Meter, tally: Tally, sent: int, o: Options, **extra: Any
             ) -> dict[str, Any]:
    out = {**meter.figures(tally.acked, tally.acked * o.record_bytes), "sent": sent,
           "errors": tally.errors, "record_bytes": o.record_bytes, **extra}
    if tally.error_sample:
        out["error_sample"] = tally.error_sample
    if o.rate:
        out["rate_records_per_s"] = o.rate
        out["latency_ms"] = percentiles(tally.latencies)
    return out


def pump(send: Callable[[int, float | None], None], schedule: Schedule,
         idle: Callable[[float], Any]) -> int:
    """Sends records through ``send(i, due)`` as ``schedule`` says, ``idle(seconds)``
    between paced bursts; how many were sent."""
    while (burst := schedule.burst()) is not None:
        for i in burst:
            send(i, schedule.due(i))
        if (wait := schedule.pause()) > 0:
            idle(wait)
    return schedule.next


async def apump(send: Callable[[int, float | None], Awaitable[None]], schedule: Schedule
                ) -> int:
    """``pump`` for an asyncio producer: ``await send(i, due)``, asyncio.sleep between."""
    while (burst := schedule.burst()) is not None:
        for i in burst:
            await send(i, schedule.due(i))
        await asyncio.sleep(schedule.pause())  # also lets the client's tasks run
    return schedule.next


# -- producers -------------------------------------------------------------------------


def confluent_produce(bootstrap: str, topic: str, o: Options) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "linger.ms": KAFKA_LINGER_MS, "batch.size": KAFKA_BATCH_BYTES,
                         "queue.buffering.max.messages": 200000,
                         "compression.type": "none"})
    values, tally = values_of(o.record_bytes), Tally()
    # Delivery callbacks run only inside poll(): paced, it is polled between bursts so
    # each acknowledgement is seen when it comes; back to back, every 1,000 records.
    counted = functools.partial(tally.of_kafka, None)

    def send(i: int, due: float | None) -> None:
        done = counted if due is None else functools.partial(tally.of_kafka, due)
        while True:
            try:
                producer.produce(topic, values[i % len(values)], partition=i % PARTITIONS,
                                 on_delivery=done)
                break
            except BufferError:  # its queue is full: serve callbacks, then again
                producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)

    meter = Meter()
    sent = pump(send, Schedule(o), producer.poll)
    left = producer.flush(60)
    return produced(meter, tally, sent, o, unflushed=left, linger_ms=KAFKA_LINGER_MS)


async def drive_async(producer: Any, topic: str, o: Options, **extra: Any) -> dict[str, Any]:
    """A started asyncio producer (aiokafka's, llog_client's) run as ``o`` says: ``await
    producer.send(...)`` gives each record's future, a done-callback counts it."""
    values, tally = values_of(o.record_bytes), Tally()

    async def send(i: int, due: float | None) -> None:
        fut = await producer.send(topic, values[i % len(values)], partition=i % PARTITIONS)
        fut.add_done_callback(tally.callback(due))

    meter = Meter()
    sent = await apump(send, Schedule(o))
    await producer.flush()
    return produced(meter, tally, sent, o, **extra)


def aiokafka_produce(bootstrap: str, topic: str, o: Options) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    async def run() -> dict[str, Any]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    linger_ms=KAFKA_LINGER_MS,
                                    max_batch_size=KAFKA_BATCH_BYTES)
        await producer.start()
        try:
            return await drive_async(producer, topic, o, linger_ms=KAFKA_LINGER_MS)
        finally:
            await producer.stop()

    return asyncio.run(run())


def _producer_settings(o: Options) -> tuple[dict[str, Any], float | None]:
    """The settings given to llog_client's producer (its defaults but what is asked),
    and the linger it runs with, for the latency target (linger + the Go p99 + 10 ms)."""
    import llog_client

    if o.linger_ms is not None:
        return {"linger_ms": o.linger_ms}, o.linger_ms
    defaults = getattr(llog_client, "ProducerSettings", None)
    return {}, None if defaults is None else defaults().linger_ms


def _metrics(producer: Any) -> Any:
    """The producer's own metrics (batches, average batch size, retries...), if any."""
    try:
        return producer.metrics()
    except Exception as exc:  # a figure the run can go without
        return {"error": repr(exc)}


def llog_producer(url: str, topic: str, o: Options) -> dict[str, Any]:
    from llog_client import Producer

    settings, linger = _producer_settings(o)
    values, tally = values_of(o.record_bytes), Tally()
    with Producer(url, **settings) as producer:
        def send(i: int, due: float | None) -> None:
            fut = producer.send(topic, values[i % len(values)], partition=i % PARTITIONS)
            fut.add_done_callback(tally.callback(due))

        meter = Meter()
        sent = pump(send, Schedule(o), time.sleep)
        producer.flush()
        out = produced(meter, tally, sent, o, linger_ms=linger)
        out["producer_metrics"] = _metrics(producer)
    return out


def llog_async_producer(url: str, topic: str, o: Options) -> dict[str, Any]:
    from llog_client import AsyncProducer

    settings, linger = _producer_settings(o)

    async def run() -> dict[str, Any]:
        async with AsyncProducer(url, **settings) as producer:
            out = await drive_async(producer, topic, o, linger_ms=linger)
            out["producer_metrics"] = _metrics(producer)
        return out

    return asyncio.run(run())


def llog_produce(url: str, topic: str, o: Options) -> dict[str, Any]:
    """The client before Producer: ``o.tasks`` produce() calls in flight, each 100 records
    (the Go load generator's 4 x 25 per request) to one partition, round-robin."""
    from llog_client import AsyncLlogClient

    pool = [v.decode() for v in values_of(o.record_bytes)]  # JSON text values
    calls = [pool[j:j + 100] for j in range(0, len(pool) - 99, 100)]

    async def run() -> dict[str, Any]:
        acked = errors = 0
        async with AsyncLlogClient(url) as client:
            meter = Meter()
            end = meter.t0 + o.seconds

            async def task(k: int) -> None:
                nonlocal acked, errors
                i = k
                while time.monotonic() < end:
                    try:
                        result = await client.produce(topic, calls[i % len(calls)],
                                                      partition=i % PARTITIONS)
                        acked += result.count
                    except Exception:  # counted; the run goes on as a producer's would
                        errors += 1
                    i += o.tasks

            await asyncio.gather(*(task(k) for k in range(o.tasks)))
            return {**meter.figures(acked, acked * o.record_bytes), "errors": errors,
                    "record_bytes": o.record_bytes, "tasks": o.tasks}

    return asyncio.run(run())


# -- consumers -------------------------------------------------------------------------


def consumed(meter: Meter, records: int, size: int, target: int, **extra: Any
             ) -> dict[str, Any]:
    return {**meter.figures(records, size), "complete": size >= target, **extra}


def confluent_consume(bootstrap: str, topic: str, o: Options) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-{time.time()}",
                         "enable.auto.commit": False, "fetch.max.bytes": FETCH_BYTES})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    target = int((o.mib or 0) * MiB)
    records = size = 0
    meter = Meter()
    idle_until = meter.t0 + IDLE_S
    try:
        while size < target and time.monotonic() < idle_until:
            batch = consumer.consume(1000, 0.5)
            for m in batch:
                if m.error() is None:
                    records += 1
                    size += len(m.value() or b"")
            if batch:
                idle_until = time.monotonic() + IDLE_S
        return consumed(meter, records, size, target)
    finally:
        consumer.close()


def aiokafka_consume(bootstrap: str, topic: str, o: Options) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict[str, Any]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest", fetch_max_bytes=FETCH_BYTES)
        await consumer.start()
        target = int((o.mib or 0) * MiB)
        records = size = 0
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            meter = Meter()
            idle_until = meter.t0 + IDLE_S
            while size < target and time.monotonic() < idle_until:
                batches = await consumer.getmany(timeout_ms=500)
                for batch in batches.values():
                    records += len(batch)
                    size += sum(len(m.value or b"") for m in batch)
                if batches:
                    idle_until = time.monotonic() + IDLE_S
            return consumed(meter, records, size, target)
        finally:
            await consumer.stop()

    return asyncio.run(run())


def llog_consume(url: str, topic: str, o: Options) -> dict[str, Any]:
    """Before Consumer: one httpx client, all 4 partitions in every request from offset
    1, binary answers decoded by the broker's own decoder."""
    import httpx

    from app.wire import records as llr1

    offsets = dict.fromkeys(range(PARTITIONS), 1)
    target = int((o.mib or 0) * MiB)
    records = size = requests = 0
    meter = Meter()
    with httpx.Client(timeout=60) as client:
        while offsets and size < target:
            body = {"topic_partitions": [{"topic": topic, "partition": p, "fetch_offset": at}
                                         for p, at in sorted(offsets.items())],
                    "max_wait_ms": 0, "max_bytes": o.fetch_bytes}
            resp = client.post(f"{url}/consume", json=body, headers={"Accept": BINARY})
            resp.raise_for_status()
            requests += 1
            for result in llr1.parse(resp.content):
                if isinstance(result, llr1.Failed):
                    raise RuntimeError(f"partition {result.partition}: {result.error}")
                for record in result.records:
                    records += 1
                    size += len(record if isinstance(record, bytes) else record.value)
                if result.next_offset > result.high_watermark:
                    del offsets[result.partition]
                else:
                    offsets[result.partition] = result.next_offset
    return consumed(meter, records, size, target, requests=requests) | {
        "complete": size >= target or not offsets}


def _llog_consumer_settings(topic: str) -> dict[str, Any]:
    """The 4 partitions from their start, to their end (``follow`` off), the consumer's
    defaults otherwise (``consumer_defaults``)."""
    return {"partitions": [(topic, p) for p in range(PARTITIONS)], "start": "earliest",
            "follow": False}


def consumer_defaults(cls: Any) -> dict[str, Any]:
    """What a consumer reads with unless told: its answer's budget and its prefetch."""
    params = inspect.signature(cls).parameters
    return {name: params[name].default for name in ("max_bytes", "prefetch_bytes")
            if name in params}


def llog_consumer(url: str, topic: str, o: Options) -> dict[str, Any]:
    """llog_client.Consumer, record by record: each record's value read."""
    from llog_client import Consumer

    target = int((o.mib or 0) * MiB)
    records = size = 0
    with Consumer(url, **_llog_consumer_settings(topic)) as consumer:
        meter = Meter()
        for record in consumer:
            records += 1
            size += len(record.value)
            if size >= target:
                break
        return consumed(meter, records, size, target, **consumer_defaults(Consumer))


def llog_consumer_batches(url: str, topic: str, o: Options) -> dict[str, Any]:
    """llog_client.Consumer, an answer at a time (``poll_batch``): each partition's
    values as one list, no object per record."""
    from llog_client import Consumer

    target = int((o.mib or 0) * MiB)
    records = size = 0
    with Consumer(url, **_llog_consumer_settings(topic)) as consumer:
        meter = Meter()
        while size < target and (batches := consumer.poll_batch(IDLE_S)):
            for batch in batches:
                values = batch.values
                records += len(values)
                size += sum(map(len, values))
        return consumed(meter, records, size, target, **consumer_defaults(Consumer))


def llog_async_consumer(url: str, topic: str, o: Options) -> dict[str, Any]:
    """llog_client.AsyncConsumer, record by record: each record's value read."""
    from llog_client import AsyncConsumer

    async def run() -> dict[str, Any]:
        target = int((o.mib or 0) * MiB)
        records = size = 0
        async with AsyncConsumer(url, **_llog_consumer_settings(topic)) as consumer:
            meter = Meter()
            async for record in consumer:
                records += 1
                size += len(record.value)
                if size >= target:
                    break
            return consumed(meter, records, size, target, **consumer_defaults(AsyncConsumer))

    return asyncio.run(run())


def kafka_topic(bootstrap: str, topic: str, _o: Options) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                            replication_factor=1)])
    futures[topic].result(timeout=60)
    return {"topic": topic, "partitions": PARTITIONS}


KINDS: dict[str, Callable[[str, str, Options], dict[str, Any]]] = {
    "confluent-produce": confluent_produce, "aiokafka-produce": aiokafka_produce,
    "llog-produce": llog_produce, "llog-producer": llog_producer,
    "llog-async-producer": llog_async_producer,
    "confluent-consume": confluent_consume, "aiokafka-consume": aiokafka_consume,
    "llog-consume": llog_consume, "llog-consumer": llog_consumer,
    "llog-consumer-batches": llog_consumer_batches,
    "llog-async-consumer": llog_async_consumer, "kafka-topic": kafka_topic,
}


def parse(argv: list[str]) -> tuple[str, str, str, Options]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("target", help="Kafka's bootstrap address or llog's URL")
    parser.add_argument("topic")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--mib", type=float, default=None)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=None, help="records/s")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--fetch-bytes", type=int, default=FETCH_BYTES)
    parser.add_argument("--linger-ms", type=float, default=None)
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="paced: seconds at the rate before the measured ones")
    parser.add_argument("--time-every", type=int, default=TIME_EVERY,
                        help="paced: one record in this many is timed")
    a = parser.parse_args(argv)
    if a.time_every < 1:
        parser.error("--time-every must be at least 1")
    return a.kind, a.target, a.topic, Options(
        seconds=a.seconds, mib=a.mib, record_bytes=a.record_bytes, rate=a.rate or None,
        tasks=a.tasks, fetch_bytes=a.fetch_bytes, linger_ms=a.linger_ms, warmup=a.warmup,
        time_every=a.time_every)


def main(argv: list[str]) -> int:
    kind, target, topic, options = parse(argv)
    print(json.dumps(KINDS[kind](target, topic, options), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
