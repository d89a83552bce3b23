"""The Python clients of the peer comparison (bench/peer.py), one process per run, each
printing one JSON object: what a Python user of each system gets.

    kafka-produce BOOTSTRAP TOPIC SECONDS [--mib N]
        confluent-kafka, acks=all, linger 5 ms, 1 KiB records round-robin over the
        topic's 4 partitions (as ../shared/peers/kafka/py_produce.py); for SECONDS, or
        until N MiB are acknowledged.
    kafka-consume BOOTSTRAP TOPIC MIB
        confluent-kafka consumer assigned all 4 partitions from offset 0, 4 MiB fetches
        (as py_consume.py), until MIB of record values are read.
    kafka-topic BOOTSTRAP TOPIC
        creates the topic with 4 partitions (the admin client: no JVM start).
    llog-produce URL TOPIC SECONDS TASKS
        the project's Python client (llog_client.AsyncLlogClient): TASKS produce calls in
        flight, each 100 records of 1 KiB (the Go load generator's bytes per request) to
        one partition, round-robin over 4 (the client sends one partition per call
        without keys), for SECONDS: what a Python user of llog gets.
    llog-consume URL TOPIC MIB [FETCH_BYTES]
        one httpx client, all 4 partitions in every request from offset 1, binary answers
        (Accept: application/vnd.llog.records), FETCH_BYTES (4 MiB) per request, every
        answer decoded to records with app.wire.records.parse, until MIB of values or
        every high watermark.

The project's Python client (llog_client) reads one partition per request and JSON
answers only, so the llog consumer here is what it would be with binary answers: the
same HTTP client (httpx) and the project's own decoder.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
PARTITIONS = 4
RECORD_BYTES = 1024
FETCH_BYTES = 4 * MiB
BINARY = "application/vnd.llog.records"


def kafka_topic(bootstrap: str, topic: str) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS,
                                            replication_factor=1)])
    futures[topic].result(timeout=60)
    return {"topic": topic, "partitions": PARTITIONS}


def kafka_produce(bootstrap: str, topic: str, seconds: float, mib: float | None
                  ) -> dict[str, Any]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.size": 262144, "queue.buffering.max.messages": 200000,
                         "compression.type": "none"})
    value = os.urandom(RECORD_BYTES // 2).hex().encode()  # 1 KiB
    acked = [0]

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    want = int(mib * MiB / RECORD_BYTES) if mib else None
    t0 = time.monotonic()
    end = t0 + seconds
    i = 0
    while (time.monotonic() < end) if want is None else (i < want):
        try:
            producer.produce(topic, value, partition=i % PARTITIONS, on_delivery=delivered)
            i += 1
        except BufferError:
            producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)
    left = producer.flush(60)
    wall = time.monotonic() - t0
    return {"records": acked[0], "sent": i, "unflushed": left, "seconds": wall,
            "records_per_s": acked[0] / wall,
            "mib_per_s": acked[0] * RECORD_BYTES / wall / MiB}


def kafka_consume(bootstrap: str, topic: str, mib: float) -> dict[str, Any]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peer-{time.time()}",
                         "enable.auto.commit": False, "fetch.max.bytes": FETCH_BYTES})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    target = int(mib * MiB)
    records = size = 0
    t0 = time.monotonic()
    idle_until = t0 + 30
    try:
        while size < target and time.monotonic() < idle_until:
            batch = consumer.consume(1000, 0.5)
            for m in batch:
                if m.error() is None:
                    records += 1
                    size += len(m.value() or b"")
            if batch:
                idle_until = time.monotonic() + 30
    finally:
        wall = time.monotonic() - t0
        consumer.close()
    return {"records": records, "mib": size / MiB, "seconds": wall,
            "records_per_s": records / wall, "mib_per_s": size / wall / MiB,
            "complete": size >= target}


def llog_produce(url: str, topic: str, seconds: float, tasks: int) -> dict[str, Any]:
    import asyncio

    from llog_client import AsyncLlogClient

    values = [os.urandom(RECORD_BYTES // 2).hex()] * 100  # 1 KiB each, JSON text values

    async def run() -> tuple[int, int, float]:
        acked = errors = 0
        async with AsyncLlogClient(url) as client:
            t0 = time.monotonic()
            end = t0 + seconds

            async def task(k: int) -> None:
                nonlocal acked, errors
                i = k
                while time.monotonic() < end:
                    try:
                        result = await client.produce(topic, values, partition=i % PARTITIONS)
                        acked += result.count
                    except Exception:  # counted; the run goes on as a producer's would
                        errors += 1
                    i += tasks

            await asyncio.gather(*(task(k) for k in range(tasks)))
            return acked, errors, time.monotonic() - t0

    acked, errors, wall = asyncio.run(run())
    return {"records": acked, "errors": errors, "seconds": wall,
            "records_per_s": acked / wall, "mib_per_s": acked * RECORD_BYTES / wall / MiB}


def llog_consume(url: str, topic: str, mib: float, fetch_bytes: int = FETCH_BYTES
                 ) -> dict[str, Any]:
    import httpx

    from app.wire import records as llr1

    offsets = dict.fromkeys(range(PARTITIONS), 1)
    target = int(mib * MiB)
    records = size = requests = 0
    t0 = time.monotonic()
    with httpx.Client(timeout=60) as client:
        while offsets and size < target:
            body = {"topic_partitions": [{"topic": topic, "partition": p, "fetch_offset": o}
                                         for p, o in sorted(offsets.items())],
                    "max_wait_ms": 0, "max_bytes": fetch_bytes}
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
    wall = time.monotonic() - t0
    return {"records": records, "mib": size / MiB, "seconds": wall, "requests": requests,
            "records_per_s": records / wall, "mib_per_s": size / wall / MiB,
            "complete": size >= target or not offsets}


def main(argv: list[str]) -> int:
    kind, *rest = argv
    if kind == "kafka-topic":
        out = kafka_topic(rest[0], rest[1])
    elif kind == "kafka-produce":
        mib = float(rest[4]) if len(rest) > 4 and rest[3] == "--mib" else None
        out = kafka_produce(rest[0], rest[1], float(rest[2]), mib)
    elif kind == "kafka-consume":
        out = kafka_consume(rest[0], rest[1], float(rest[2]))
    elif kind == "llog-produce":
        out = llog_produce(rest[0], rest[1], float(rest[2]), int(rest[3]))
    elif kind == "llog-consume":
        out = llog_consume(rest[0], rest[1], float(rest[2]),
                           int(rest[3]) if len(rest) > 3 else FETCH_BYTES)
    else:
        print(f"unknown client {kind!r}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
