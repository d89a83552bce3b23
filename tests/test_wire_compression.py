"""Compression on the wire against the real Oxia and MinIO: produce bodies with
``Content-Encoding`` zstd or gzip (JSON and binary, through the hot lane and through
the framework's route), refused bodies that write nothing (a decompression bomb, an
unknown coding, a corrupt stream), consume answers and event streams compressed for
``Accept-Encoding``; and the Python client and the CLI doing both by default."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import zstandard

from app.factory import create_app
from app.localstack.stack import LocalStack
from app.routes.hot_lane import HotLane
from app.storage import codec
from app.storage.log_record import payload_value
from app.wire import produce as llp1
from app.wire import records as llr1
from llog_client import AsyncLlogClient, LlogClient
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.stack import Broker, BrokerFactory, make_settings
from tests.test_stream import events

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
# Records that compress as logs do: repeated field names, varying values.
VALUES = [json.dumps({"user": f"u{i % 97}", "path": f"/api/items/{i}", "status": 200,
                      "ms": i % 13}) for i in range(300)]
RAW = {"accept-encoding": "identity"}


def _encoded(encoding: str, body: bytes) -> bytes:
    if encoding == "zstd":
        return zstandard.ZstdCompressor().compress(body)
    if encoding == "gzip":
        return gzip.compress(body)
    return body


@contextlib.asynccontextmanager
async def broker(stack: LocalStack, *, lane: bool = True, **overrides: Any
                 ) -> AsyncIterator[httpx.AsyncClient]:
    """A broker in process; without ``lane``, produce and consume go through the
    framework's routes instead of the hot lane (app/routes/hot_lane.py)."""
    app = create_app(make_settings(stack, **overrides))
    if not lane:
        kept = [m for m in app.user_middleware
                if not (isinstance(m.cls, type) and issubclass(m.cls, HotLane))]
        assert len(kept) == len(app.user_middleware) - 1
        app.user_middleware = kept
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


async def _values(http: httpx.AsyncClient, topic: str) -> list[str]:
    r = await http.post("/consume", headers=RAW, json=consume_body(
        topic, 1, max_bytes=16 * MiB))
    assert r.status_code == 200, r.text
    return [rec["value"] for rec in r.json()["results"][0]["records"]]


async def _high_watermark(http: httpx.AsyncClient, topic: str) -> int:
    r = await http.post("/offsets", json={"topic_partitions": [{"topic": topic,
                                                                 "partition": 0}]})
    assert r.status_code == 200, r.text
    return int(r.json()["results"][0]["high_watermark"])


@pytest.mark.parametrize("lane", [True, False], ids=["hot-lane", "route"])
@pytest.mark.parametrize("encoding", ["zstd", "gzip", "identity"])
async def test_compressed_json_and_binary_bodies_round_trip(
        stack: LocalStack, topic: str, lane: bool, encoding: str) -> None:
    json_body = json.dumps(produce_body(topic, *VALUES)).encode()
    binary_body = llp1.build([(topic, 0, None, codec.encode_batch(
        [v.encode() for v in VALUES]), codec.ENCODING_V1)])
    async with broker(stack, lane=lane) as http:
        for body, content_type in ((json_body, "application/json"),
                                   (binary_body, llp1.CONTENT_TYPE)):
            r = await http.post("/produce", content=_encoded(encoding, body), headers={
                "content-type": content_type, "content-encoding": encoding})
            assert r.status_code == 200, r.text
        assert await _values(http, topic) == VALUES * 2


def _json_bomb(topic: str, encoding: str, inflated: int) -> bytes:
    """A produce body whose one record is ``inflated`` bytes of "0": valid JSON if it
    were decoded whole."""
    head = f'{{"topic_partitions":[{{"topic":"{topic}","partition":0,"records":["'.encode()
    tail = b'"]}]}'
    zeros = b"0" * MiB
    if encoding == "gzip":  # deflate shrinks at most ~1000x: members of 1 MiB each
        member = gzip.compress(zeros, 9)
        return (gzip.compress(head) + member * (inflated // MiB) + gzip.compress(tail))
    writer = zstandard.ZstdCompressor(level=1).compressobj()  # no declared size
    return b"".join([writer.compress(head), *(writer.compress(zeros)
                                               for _ in range(inflated // MiB)),
                     writer.compress(tail), writer.flush()])


@pytest.mark.parametrize("lane", [True, False], ids=["hot-lane", "route"])
async def test_bombs_unknown_codings_and_corrupt_streams_are_refused_and_write_nothing(
        stack: LocalStack, topic: str, lane: bool) -> None:
    valid = json.dumps(produce_body(topic, *VALUES)).encode()
    refused: list[tuple[str, bytes, int, str]] = [
        # A few KiB of zstd, and 1 MiB of gzip, that inflate to 1 GiB.
        ("zstd", _json_bomb(topic, "zstd", 1024 * MiB), 413, "PayloadTooLarge"),
        ("gzip", _json_bomb(topic, "gzip", 1024 * MiB), 413, "PayloadTooLarge"),
        ("br", valid, 415, "UnsupportedEncoding"),
        ("gzip, zstd", _encoded("zstd", _encoded("gzip", valid)), 415,
         "UnsupportedEncoding"),
        ("zstd", _encoded("zstd", valid)[:-9], 400, "InvalidRequest"),
        ("gzip", _encoded("gzip", valid)[:-12], 400, "InvalidRequest"),
        ("zstd", valid, 400, "InvalidRequest"),
    ]
    assert len(refused[0][1]) < 64 * 1024
    async with broker(stack, lane=lane, max_request_bytes=4 * MiB) as http:
        r = await http.post("/produce", json=produce_body(topic, "first"))
        assert r.status_code == 200, r.text
        before = await _high_watermark(http, topic)
        for encoding, body, status, error_type in refused:
            r = await http.post("/produce", content=body, headers={
                "content-type": "application/json", "content-encoding": encoding})
            assert r.status_code == status, (encoding, r.text)
            assert r.json()["error_type"] == error_type, r.text
            assert encoding.split(",")[0] in r.json()["error"] or status == 413, r.text
            if status == 415:  # what it takes instead (RFC 9110 12.5.3)
                assert r.headers["accept-encoding"] == "zstd, gzip"
        assert await _high_watermark(http, topic) == before
        assert await _values(http, topic) == ["first"]


@pytest.mark.parametrize("lane", [True, False], ids=["hot-lane", "route"])
async def test_consume_answers_are_compressed_for_accept_encoding(
        stack: LocalStack, topic: str, lane: bool) -> None:
    async with broker(stack, lane=lane, answer_encodings=("zstd", "gzip")) as http:
        r = await http.post("/produce", json=produce_body(topic, *VALUES))
        assert r.status_code == 200, r.text
        request = consume_body(topic, 1, max_bytes=16 * MiB)
        plain = await http.post("/consume", json=request, headers=RAW)
        assert "content-encoding" not in plain.headers
        assert plain.headers["vary"] == "Accept-Encoding"
        for accept, chosen in (("zstd, gzip", "zstd"), ("gzip", "gzip"),
                               ("zstd;q=0.5, gzip", "gzip"), ("br, *;q=0.1", "zstd")):
            r = await http.post("/consume", json=request, headers={"accept-encoding": accept})
            assert r.headers["content-encoding"] == chosen, accept
            assert r.headers["vary"] == "Accept-Encoding"
            assert r.num_bytes_downloaded * 3 < len(plain.content), accept
            assert r.json() == plain.json(), accept
        binary = {"accept": llr1.CONTENT_TYPE}
        raw_binary = await http.post("/consume", json=request, headers={**binary, **RAW})
        packed = await http.post("/consume", json=request, headers={
            **binary, "accept-encoding": "zstd"})
        assert packed.headers["content-encoding"] == "zstd"
        assert packed.num_bytes_downloaded * 3 < len(raw_binary.content)
        assert packed.content == raw_binary.content
        (records,) = llr1.parse(packed.content)
        assert isinstance(records, llr1.Records)
        assert [payload_value(r) for r in records.records] == [v.encode() for v in VALUES]
        # An answer under 1 KiB goes raw, whatever the caller accepts.
        small = await http.post("/consume", json=consume_body(topic, len(VALUES),
                                                               max_bytes=1),
                                headers={"accept-encoding": "zstd"})
        assert len(small.content) < 1024 and "content-encoding" not in small.headers
        assert small.headers["vary"] == "Accept-Encoding"


async def test_gzip_answers_are_offered_only_when_the_operator_says_so(
        stack: LocalStack, topic: str) -> None:
    """By default only zstd: clients that accept gzip without asking (Go's) get raw."""
    async with broker(stack) as http:
        r = await http.post("/produce", json=produce_body(topic, *VALUES))
        assert r.status_code == 200, r.text
        request = consume_body(topic, 1, max_bytes=16 * MiB)
        gzip_only = await http.post("/consume", json=request,
                                    headers={"accept-encoding": "gzip"})
        assert "content-encoding" not in gzip_only.headers
        either = await http.post("/consume", json=request,
                                 headers={"accept-encoding": "gzip, zstd"})
        assert either.headers["content-encoding"] == "zstd"
    async with broker(stack, answer_encodings=()) as http:
        never = await http.post("/consume", json=request,
                                headers={"accept-encoding": "zstd"})
        assert "content-encoding" not in never.headers
        assert never.json() == either.json()


# -- a broker process: streams, the Python client and the CLI ------------------------

@pytest.fixture(scope="module")
def process(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    factory = BrokerFactory(stack, tmp_path_factory.mktemp("wire-broker"))
    yield factory.start()
    factory.stop_all()


async def test_an_event_stream_is_compressed_event_by_event(process: Broker,
                                                            topic: str) -> None:
    async with httpx.AsyncClient(base_url=process.url, timeout=30) as http:
        r = await http.post("/produce", json=produce_body(topic, *VALUES))
        assert r.status_code == 200, r.text
        with anyio.fail_after(60):
            async with http.stream("GET", f"/topics/{topic}/stream", params={
                    "from": "earliest"}, headers={"accept-encoding": "zstd"}) as stream:
                assert stream.headers["content-encoding"] == "zstd"
                assert stream.headers["vary"] == "Accept-Encoding"
                seen: list[str] = []
                live = False
                async for event in events(stream):
                    if event.kind != "records":
                        continue
                    seen.extend(rec["value"] for rec in event.json["records"])
                    if len(seen) == len(VALUES) and not live:
                        # Arrives while the stream runs: each event is flushed whole.
                        live = True
                        r = await http.post("/produce", json=produce_body(topic, "live"))
                        assert r.status_code == 200, r.text
                    if seen[-1] == "live":
                        break
        assert seen == [*VALUES, "live"]


class _Recording(httpx.HTTPTransport):
    """Notes each exchange's path and codings as they were on the wire."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str | None, str | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.seen.append((request.url.path, request.headers.get("content-encoding"),
                          response.headers.get("content-encoding")))
        return response


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_the_client_compresses_produce_bodies_and_accepts_compressed_answers(
        process: Broker, topic: str, compression: str) -> None:
    transport = _Recording()
    with LlogClient(process.url, transport=transport, compression=compression) as llog:  # type: ignore[arg-type]
        llog.produce(topic, VALUES, partition=0)
        llog.produce(topic, "tiny", partition=0)
        got = [r.value.decode() for r in llog.iter_records(topic, 0, follow=False)]
    assert got == [*VALUES, "tiny"]
    produced = [sent for path, sent, _ in transport.seen if path == "/produce"]
    assert produced == [None if compression == "none" else compression, None]
    answers = [answer for path, _, answer in transport.seen if path == "/consume"]
    assert answers[0] == "zstd"


async def test_the_async_client_compresses_with_gzip(process: Broker, topic: str) -> None:
    async with AsyncLlogClient(process.url, compression="gzip") as llog:
        await llog.produce(topic, VALUES * 40, partition=0)  # large: compressed off the loop
        got = [r.value.decode() async for r in llog.iter_records(topic, 0, follow=False)]
    assert got == VALUES * 40
    with pytest.raises(ValueError, match="compression must be one of"):
        LlogClient(process.url, compression="lz4")  # type: ignore[arg-type]


def _produce_request_bytes(broker: Broker) -> float:
    text = httpx.get(f"{broker.url}/metrics/prometheus", timeout=30).text
    for line in text.splitlines():
        if (line.startswith("llog_http_request_size_bytes_sum")
                and 'handler="/produce"' in line):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_the_cli_produces_compressed_and_consumes_compressed(
        process: Broker, topic: str, compression: str) -> None:
    env = {**os.environ, "LLOG_BROKER_URL": process.url}
    stdin = ("\n".join(VALUES) + "\n").encode()

    def llog(*args: str, data: bytes = b"") -> bytes:
        done = subprocess.run([sys.executable, "-m", "app.cli", *args], input=data,
                              capture_output=True, timeout=60, cwd=ROOT, env=env,
                              check=False)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout

    llog("topics", "create", topic, "--compression", "zstd")  # stored compressed
    before = _produce_request_bytes(process)
    llog("produce", topic, "--compression", "none", data=stdin)
    raw = _produce_request_bytes(process) - before
    llog("produce", topic, "--compression", compression, data=stdin)
    packed = _produce_request_bytes(process) - before - raw
    assert 0 < packed * 3 < raw
    if compression == "zstd":  # the default, auto: zstd for a topic stored compressed
        llog("produce", topic, data=stdin)
        assert 0 < (_produce_request_bytes(process) - before - raw - packed) * 3 < raw
    lines = llog("consume", topic).decode().splitlines()
    assert lines == VALUES * (3 if compression == "zstd" else 2)
