"""Stored compression of WAL slices, on the real Oxia and MinIO: a topic's
``compression`` setting (the API, its checks, the broker's default), slices stored
compressed (the LLS1 header and the index entry say so) and read back by every reader
path, uncompressible records stored raw, a log that changes setting half-way, slices of
the previous encoding read by this code, corruption reported rather than served, and
compaction of compressed slices."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from app.broker.topic_view import TopicDirectory
from app.errors import CorruptData
from app.localstack.stack import LocalStack
from app.storage import codec, columnar
from app.storage.appends import AppendGroup, AppendResult
from app.storage.compression import Codec, Compression
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import IndexEntry
from app.storage.topic_catalog import TopicCatalog, TopicConfig
from app.wire import produce as llp1
from app.wire import records as llr1
from tests.helpers.asgi import in_process_broker
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.compaction import compaction_settings, make_compactor, read_all
from tests.helpers.stack import make_settings, open_engine

ZSTD = Compression(Codec.ZSTD)
# The fields of an LLS1 header entry and of an index entry before stored compression.
OLD_HEADER_FIELDS = {"topic", "partition", "msg_count", "encoding", "body_offset",
                     "body_length", "crc32c"}
OLD_ENTRY_FIELDS = {"type", "msg_count", "data_key", "encoding", "byte_offset",
                    "byte_length", "created_at_ms", "crc32c", "append_id", "end_bytes"}


def events(n: int, seed: int) -> list[str]:
    """JSON events as logs hold them: repeating field names, ids of some cardinality."""
    rng = random.Random(seed)
    return [json.dumps({"ts": 1_760_000_000_000 + i * 7, "user": f"user-{rng.randrange(500)}",
                        "method": rng.choice(["GET", "POST"]), "status": rng.choice([200, 404]),
                        "path": f"/api/v1/orders/{rng.randrange(10_000)}",
                        "agent": "Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0"})
            for i in range(n)]


async def produce(http: httpx.AsyncClient, topic: str, values: list[str]) -> dict[str, Any]:
    r = await http.post("/produce", json=produce_body(topic, *values))
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["results"][0]
    return result


async def consume_json(http: httpx.AsyncClient, topic: str) -> list[str]:
    """Every record of partition 0, in as many answers as it takes."""
    values: list[str] = []
    offset = 1
    while True:
        r = await http.post("/consume", json=consume_body(topic, offset, max_bytes=64 * 1024))
        assert r.status_code == 200, r.text
        result = r.json()["results"][0]
        assert "error_type" not in result, result
        values += [x["value"] for x in result["records"]]
        offset = result["next_offset"]
        if offset > result["high_watermark"]:
            return values
        assert result["records"]


async def consume_binary(http: httpx.AsyncClient, topic: str) -> list[bytes]:
    r = await http.post("/consume", json=consume_body(topic, 1, max_bytes=64 * 1024 * 1024),
                        headers={"accept": llr1.CONTENT_TYPE})
    assert r.status_code == 200 and r.headers["content-type"] == llr1.CONTENT_TYPE
    (answer,) = llr1.parse(r.content)
    assert isinstance(answer, llr1.Records)
    assert answer.next_offset == answer.high_watermark + 1
    return [p if isinstance(p, bytes) else p.value for p in answer.records]


def header_entries(s3_client: Any, stack: LocalStack, wal_uri: str) -> list[dict[str, Any]]:
    """The raw LLS1 header entries of a WAL object, fetched from MinIO."""
    _, key = KeyLayout.parse_uri(wal_uri)
    blob = s3_client.get_object(Bucket=stack.config.bucket, Key=key)["Body"].read()
    assert blob[:4] == codec.MAGIC
    size = int.from_bytes(blob[4:8], "big")
    entries: list[dict[str, Any]] = json.loads(blob[8:8 + size])["partitions"]
    return entries


async def index_entry(stack: LocalStack, tp: TopicPartition, end: int) -> dict[str, Any]:
    async with open_engine(make_settings(stack)) as e:
        found = await e.oxia.get(e.layout.index(tp, end), tp.partition_key)
        assert found is not None
        entry: dict[str, Any] = json.loads(found.value)
        return entry


# Whole WAL objects read into the object cache, or each slice with a ranged GET.
READ_PATHS = [pytest.param({}, id="whole-objects"),
              pytest.param({"read_wal_object_max_bytes": 0}, id="ranged-gets")]


@pytest.mark.parametrize("read_path", READ_PATHS)
async def test_a_zstd_topic_stores_compressed_slices_and_reads_them_back(
        stack: LocalStack, s3_client: Any, topic: str, read_path: dict[str, Any]) -> None:
    first, second = events(300, 1), events(300, 2)
    async with in_process_broker(stack) as http:
        r = await http.post("/topics", json={"topic": topic, "compression": "zstd",
                                             "compression_level": 5})
        assert r.status_code == 201, r.text
        assert (r.json()["compression"], r.json()["compression_level"]) == ("zstd", 5)
        one = await produce(http, topic, first)
        two = await produce(http, topic, second)

    (part,) = header_entries(s3_client, stack, one["wal_uri"])
    assert part["codec"] == "zstd" and part["body_length"] < part["raw_length"]
    entry = await index_entry(stack, TopicPartition(topic, 0), one["end_offset"])
    assert (entry["codec"], entry["raw_length"], entry["byte_length"]) == (
        "zstd", part["raw_length"], part["body_length"])
    async with open_engine(make_settings(stack)) as e:
        control = await e.reader.read_control(TopicPartition(topic, 0))
    assert control is not None and control.pending is not None
    assert control.pending.codec == "zstd" and control.pending.raw_length  # the second
    assert control.pending.end_offset == two["end_offset"]

    async with in_process_broker(stack, **read_path) as fresh:  # no tail cache: read from MinIO
        assert await consume_json(fresh, topic) == first + second
    async with in_process_broker(stack, **read_path) as fresh:
        assert await consume_binary(fresh, topic) == [v.encode() for v in first + second]


async def test_uncompressible_records_are_stored_raw(stack: LocalStack, s3_client: Any,
                                                     topic: str) -> None:
    rng = random.Random(7)
    records = [rng.randbytes(512) for _ in range(64)]
    envelope = llp1.build([(topic, 0, None, columnar.encode(records), codec.ENCODING_V3)])
    async with in_process_broker(stack) as http:
        assert (await http.post("/topics", json={"topic": topic, "compression": "zstd"})
                ).status_code == 201
        r = await http.post("/produce", content=envelope,
                            headers={"content-type": llp1.CONTENT_TYPE})
        assert r.status_code == 200, r.text
        result = r.json()["results"][0]
    (part,) = header_entries(s3_client, stack, result["wal_uri"])
    assert set(part) == OLD_HEADER_FIELDS  # no codec: zstd would not have saved a tenth
    async with in_process_broker(stack) as fresh:
        assert await consume_binary(fresh, topic) == records


async def test_a_topic_switched_to_zstd_half_way_reads_back_contiguously(
        stack: LocalStack, s3_client: Any, topic: str) -> None:
    batches = [events(100, seed) for seed in range(6)]
    async with in_process_broker(stack) as http:
        assert (await http.post("/topics", json={"topic": topic})).status_code == 201
        before = [await produce(http, topic, b) for b in batches[:3]]
        r = await http.patch(f"/topics/{topic}", json={"compression": "zstd"})
        assert r.status_code == 200, r.text
        assert (r.json()["compression"], r.json()["compression_level"]) == ("zstd", None)
        after = [await produce(http, topic, b) for b in batches[3:]]
    assert all("codec" not in header_entries(s3_client, stack, x["wal_uri"])[0]
               for x in before)
    assert all(header_entries(s3_client, stack, x["wal_uri"])[0]["codec"] == "zstd"
               for x in after)
    async with in_process_broker(stack, read_wal_object_max_bytes=0) as fresh:
        assert await consume_json(fresh, topic) == [v for b in batches for v in b]


async def test_slices_of_the_previous_encoding_read_with_this_code(
        stack: LocalStack, s3_client: Any, tp: TopicPartition) -> None:
    """Written as releases before stored compression wrote (no codec anywhere), read
    through the broker of this release."""
    values = [events(50, seed) for seed in range(3)]
    async with open_engine(make_settings(stack)) as e:
        written = []
        for batch in values:
            (result,) = await e.writer.append_shared([AppendGroup(tp, [v.encode()
                                                                        for v in batch])])
            assert isinstance(result, AppendResult)
            written.append(result)
        assert await e.writer.materialise_pending(tp)
    for result in written:
        assert set(header_entries(s3_client, stack, result.wal_uri)[0]) == OLD_HEADER_FIELDS
        assert set(await index_entry(stack, tp, result.end_offset)) == OLD_ENTRY_FIELDS
    for read_path in ({}, {"read_wal_object_max_bytes": 0}):
        async with in_process_broker(stack, **read_path) as fresh:
            assert await consume_json(fresh, tp.topic) == [v for b in values for v in b]


async def test_a_corrupt_compressed_slice_is_reported_never_served(
        stack: LocalStack, tp: TopicPartition) -> None:
    """A compressed slice whose CRC32C matches but whose zstd frame does not decode (a
    writer's defect): CorruptData, as for any slice that fails its checks."""
    async with open_engine(make_settings(stack)) as e:
        (result,) = await e.writer.append_shared([AppendGroup(
            tp, [v.encode() for v in events(200, 3)], compression=ZSTD)])
        assert isinstance(result, AppendResult)
        assert await e.writer.materialise_pending(tp)
        key = e.layout.index(tp, result.end_offset)
        found = await e.oxia.get(key, tp.partition_key)
        assert found is not None
        entry = IndexEntry.from_json(found.value)
        assert entry.codec == "zstd" and entry.byte_offset is not None
        _, object_key = e.layout.parse_uri(entry.data_key)
        blob = bytearray(await e.s3.get(object_key))
        start = entry.byte_offset
        assert entry.byte_length is not None
        end = start + entry.byte_length
        blob[start + 8:end] = bytes(end - start - 8)  # the frame's content zeroed
        entry.crc32c = codec.crc32c(blob[start:end])
        await e.s3.put(object_key, bytes(blob))
        await e.oxia.put(key, entry.to_json(), tp.partition_key)
        with pytest.raises(CorruptData, match="zstd"):
            await e.reader.read(tp, 1)
    async with in_process_broker(stack) as fresh:
        r = await fresh.post("/consume", json=consume_body(tp.topic, 1))
    result_json = r.json()["results"][0]
    assert result_json["error_type"] == "CorruptData" and "zstd" in result_json["error"]
    assert "Traceback" not in r.text


async def test_compaction_merges_compressed_slices(stack: LocalStack,
                                                   tp: TopicPartition) -> None:
    async with open_engine(compaction_settings(stack)) as e:
        acked: dict[int, bytes] = {}
        for seed in range(4):
            records = [v.encode() for v in events(100, seed)]
            (result,) = await e.writer.append_shared([AppendGroup(tp, records,
                                                                  compression=ZSTD)])
            assert isinstance(result, AppendResult)
            acked.update(zip(range(result.start_offset, result.end_offset + 1), records,
                             strict=True))
        assert await e.writer.materialise_pending(tp)
        sample = e.metrics.registry.get_sample_value
        stored = sample("llog_stored_bytes_total", {"kind": "wal"})
        raw = sample("llog_stored_raw_bytes_total", {"kind": "wal"})
        assert stored is not None and raw is not None and stored < raw / 3
        found = await e.oxia.get(e.layout.index(tp, 100), tp.partition_key)
        assert found is not None and IndexEntry.from_json(found.value).codec == "zstd"

        outcome = await make_compactor(e).compact_once(tp)
        assert outcome.action == "compacted", outcome
        assert await read_all(e, tp) == acked


# -- the topic setting -------------------------------------------------------------------


@pytest.mark.parametrize("body", [
    {"compression": "lz4"},
    {"compression": "zstd", "compression_level": 20},
    {"compression": "zstd", "compression_level": "3"},
    {"compression": "none", "compression_level": 3},
    {"compression_level": 3},
    {"compression": None},
])
async def test_invalid_compression_is_refused_and_nothing_is_written(
        stack: LocalStack, topic: str, body: dict[str, Any]) -> None:
    async with in_process_broker(stack) as http:
        r = await http.post("/topics", json={"topic": topic, **body})
        assert r.status_code == 400 and r.json()["error_type"] == "InvalidRequest", r.text
        assert (await http.get(f"/topics/{topic}")).status_code == 404
        assert (await http.post("/topics", json={"topic": topic})).status_code == 201
        r = await http.patch(f"/topics/{topic}", json=body)
        assert r.status_code == 400 and r.json()["error_type"] == "InvalidRequest", r.text
        shown = (await http.get(f"/topics/{topic}")).json()
        assert (shown["compression"], shown["compression_level"]) == ("none", None)


async def test_compression_on_create_update_and_the_broker_default(stack: LocalStack,
                                                                   topic: str) -> None:
    async with in_process_broker(stack, topic_default_compression="zstd:7") as http:
        r = await http.post("/topics", json={"topic": topic})
        assert (r.json()["compression"], r.json()["compression_level"]) == ("zstd", 7)
        r = await http.post("/topics", json={"topic": topic + "-raw", "compression": "none"})
        assert (r.json()["compression"], r.json()["compression_level"]) == ("none", None)
        await produce(http, topic + "-auto", ["made on use"])
        auto = (await http.get(f"/topics/{topic}-auto")).json()
        assert (auto["compression"], auto["compression_level"]) == ("zstd", 7)
        # compression sets the level with it (absent: the codec's default)
        r = await http.patch(f"/topics/{topic}", json={"compression": "zstd"})
        assert (r.json()["compression"], r.json()["compression_level"]) == ("zstd", None)
        r = await http.patch(f"/topics/{topic}", json={"compression": "zstd",
                                                       "compression_level": -3})
        assert r.json()["compression_level"] == -3
        r = await http.patch(f"/topics/{topic}", json={"retention_ms": 60_000})
        assert (r.json()["compression"], r.json()["compression_level"]) == ("zstd", -3)
        listed = {t["topic"]: t for t in (await http.get("/topics")).json()["topics"]}
        assert listed[topic + "-raw"]["compression"] == "none"
        r = await http.patch(f"/topics/{topic}", json={"compression": "none"})
        assert (r.json()["compression"], r.json()["compression_level"]) == ("none", None)


async def test_forwarded_appends_are_stored_as_the_receivers_catalog_says(
        stack: LocalStack, topic: str) -> None:
    """A forwarded APPEND carries no setting: the receiving broker takes it from its
    cached catalog record (and stores raw what it cannot look up)."""
    async with open_engine(make_settings(stack)) as e:
        directory = TopicDirectory(TopicCatalog(e.oxia, e.layout), auto_create=False,
                                   auto_partitions=1)
        await directory.catalog.create(topic, 1, TopicConfig(compression="zstd",
                                                             compression_level=4))
        groups = [AppendGroup(TopicPartition(topic, 0), [b"a"]),
                  AppendGroup(TopicPartition(topic + "-gone", 0), [b"b"])]
        stored = await directory.stored_as(groups)
    assert [g.compression for g in stored] == [Compression(Codec.ZSTD, 4),
                                               Compression(Codec.NONE)]
    assert [g.records for g in stored] == [[b"a"], [b"b"]]
