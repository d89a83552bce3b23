"""Binary bodies of the HTTP API (app/wire/): the LLP1 produce envelope in, the LLR1
records answer out, on the real Oxia and MinIO; malformed envelopes are a 400 that
writes nothing; and the JSON fast path accepts exactly what the request model does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.errors import InvalidRequest
from app.factory import create_app
from app.localstack.stack import LocalStack
from app.routes import produce_body
from app.storage import codec, columnar
from app.storage.appends import ProducerSeq
from app.storage.log_record import LogRecord
from app.wire import produce as llp1
from app.wire import records as llr1
from tests.helpers.bodies import consume_body
from tests.helpers.bodies import produce_body as json_produce
from tests.helpers.stack import make_settings

BINARY = {"content-type": llp1.CONTENT_TYPE}
WANTS_BINARY = {"accept": llr1.CONTENT_TYPE}


@contextlib.asynccontextmanager
async def broker(stack: LocalStack, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_settings(stack, **overrides))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield client


async def _read(http: httpx.AsyncClient, topic: str, partition: int = 0
                ) -> list[dict[str, Any]]:
    r = await http.post("/consume", json=consume_body(topic, 1, partition,
                                                       max_bytes=16 * 1024 * 1024))
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()["results"][0]["records"]
    return records


async def test_a_binary_envelope_of_every_encoding_reads_back(stack: LocalStack,
                                                             topic: str) -> None:
    keyed = [LogRecord(b"k-value", b"key-1", (), 17), b"plain"]
    headed = [LogRecord(b"h-value", None, (("trace", b"t1"),))]
    envelope = llp1.build([
        (topic, 0, "once", columnar.encode([b"a", b"b"]), codec.ENCODING_V3),
        (topic, 0, None, codec.encode_batch([b"c"]), codec.ENCODING_V1),
        (topic, 1, None, columnar.encode(keyed), codec.ENCODING_V3),
        (topic, 1, None, codec.encode_batch_v2(headed), codec.ENCODING_V2),
    ])
    async with broker(stack) as http:
        r = await http.post("/produce", content=envelope, headers=BINARY)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [(x["partition"], x["start_offset"], x["count"]) for x in results] == [
            (0, 1, 2), (0, 3, 1), (1, 1, 2), (1, 3, 1)]
        repeat = llp1.build([(topic, 0, "once", columnar.encode([b"a", b"b"]),
                              codec.ENCODING_V3)])
        again = await http.post("/produce", content=repeat, headers=BINARY)
        assert again.json()["results"][0]["duplicate"] is True  # the idempotency key

        assert [x["value"] for x in await _read(http, topic, 0)] == ["a", "b", "c"]
        one = await _read(http, topic, 1)
        assert (one[0]["key"], one[0]["timestamp_ms"], one[1]["value"]) == (
            "key-1", 17, "plain")
        assert one[2]["headers"] == [{"name": "trace", "value": "t1"}]

        r = await http.post("/consume", json=consume_body(topic, 1, 1), headers=WANTS_BINARY)
        assert r.headers["content-type"] == llr1.CONTENT_TYPE
        (answer,) = llr1.parse(r.content)
        assert isinstance(answer, llr1.Records)
        assert (answer.first_offset, answer.next_offset, answer.high_watermark) == (1, 4, 3)
        got = answer.records
        assert [p if isinstance(p, bytes) else p.value for p in got] == [
            b"k-value", b"plain", b"h-value"]
        assert isinstance(got[0], LogRecord) and got[0].key == b"key-1"
        assert isinstance(got[2], LogRecord) and got[2].headers == (("trace", b"t1"),)
        assert all(t > 0 for t in answer.append_times)


async def test_a_binary_answer_carries_errors_as_json(stack: LocalStack, topic: str) -> None:
    async with broker(stack) as http:
        await http.post("/produce", json=json_produce(topic, "x"))
        r = await http.post("/consume", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "fetch_offset": 9},
            {"topic": topic, "partition": 0 + 1, "fetch_offset": 1}], "max_wait_ms": 0},
            headers=WANTS_BINARY)
        failed, empty = llr1.parse(r.content)
        assert isinstance(failed, llr1.Failed)
        assert failed.error["error_type"] == "OffsetOutOfRange"
        assert failed.error["high_watermark"] == 1
        assert isinstance(empty, llr1.Records) and empty.records == []


def _entry(topic: str, body: bytes, code: int = 3, partition: int = 0, key: bytes = b"",
           producer: bytes | None = None) -> bytes:
    """An LLP1 entry; with ``producer`` (its bytes after the key), an LLP2 one."""
    raw = topic.encode()
    return (len(raw).to_bytes(2, "big") + raw + partition.to_bytes(4, "big", signed=True)
            + len(key).to_bytes(1, "big") + key + (producer or b"") + code.to_bytes(1, "big")
            + len(body).to_bytes(4, "big") + body)


GOOD = columnar.encode([b"r"])


def _envelope(*entries: bytes, count: int | None = None, magic: bytes = b"LLP1") -> bytes:
    n = len(entries) if count is None else count
    return magic + n.to_bytes(4, "big") + b"".join(entries)


def _sequenced(*entries: bytes) -> bytes:
    return _envelope(*entries, magic=b"LLP2")


def _producer(pid: bytes, seq: int) -> bytes:
    return len(pid).to_bytes(1, "big") + pid + seq.to_bytes(8, "big")


@pytest.mark.parametrize("envelope, why", [
    (b"LLP3" + bytes(4), "starts with"),
    (_sequenced(_entry("t", GOOD, producer=_producer(b"has space", 0))), "producer id"),
    (_sequenced(_entry("t", GOOD, producer=_producer(b"p", 2**53))), "sequence is at most"),
    (_sequenced(_entry("t", GOOD, partition=-1, producer=_producer(b"p", 0))),
     "names its partition"),
    (_sequenced(_entry("t", GOOD, key=b"k", producer=_producer(b"p", 0))),
     "no idempotency key"),
    (_sequenced(_entry("t", GOOD, producer=_producer(b"p", 0)))[:-(len(GOOD) + 8)],
     "ends inside"),
    (_envelope(), "at least one entry"),
    (_envelope(_entry("t", GOOD), count=2), "ends inside"),
    (_envelope(_entry("t", GOOD)) + b"x", "after the last entry"),
    (_envelope(_entry("b@d", GOOD)), "not a valid topic"),
    (_envelope(_entry("..", GOOD)), "not a valid topic"),
    (_envelope(_entry("t", GOOD, partition=-2)), "partition -2"),
    (_envelope(_entry("t", GOOD, key=b"has space")), "idempotency key"),
    (_envelope(_entry("t", GOOD, code=7)), "encoding 7"),
    (_envelope(_entry("t", GOOD[:-1])), "add up"),
    (_envelope(_entry("t", columnar.encode([]))), "at least one record"),
    (_envelope(_entry("t", codec.encode_batch([b"x"])[:-1], code=1)), "bytes-batch-v1"),
])
def test_malformed_envelopes_say_what_is_wrong(envelope: bytes, why: str) -> None:
    with pytest.raises(InvalidRequest, match=why):
        llp1.parse(envelope, max_entries=1000)


async def test_a_malformed_envelope_is_a_400_and_writes_nothing(stack: LocalStack,
                                                               topic: str) -> None:
    good = _entry(topic, GOOD)
    bad = _entry(topic, GOOD[:-1])
    big = _entry(topic, columnar.encode([b"k" * 2000]))
    async with broker(stack, max_record_bytes=1000) as http:
        r = await http.post("/produce", content=_envelope(good, bad), headers=BINARY)
        assert r.status_code == 400 and r.json()["error_type"] == "InvalidRequest"
        assert "entry 1" in r.json()["error"]
        r = await http.post("/produce", content=_envelope(good, big), headers=BINARY)
        assert r.status_code == 413 and "2000 bytes" in r.json()["error"]
        keyed = _entry(topic, columnar.encode([LogRecord(b"v", b"k" * 20000)]))
        r = await http.post("/produce", content=_envelope(keyed), headers=BINARY)
        assert r.status_code == 413
        assert await _read(http, topic) == []


# -- the JSON fast path accepts exactly what the model accepts ---------------------------

_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["\ud800", "a b", "..", ".", "x" * 250]))
_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**32), st.floats(), _TEXT,
                   st.fixed_dictionaries({"base64": st.sampled_from(["AAE=", "!"])}))
_HEADER = st.one_of(
    st.fixed_dictionaries({"name": st.one_of(_TEXT, st.sampled_from(["", "n" * 256, "n" * 257])),
                           "value": _VALUE}),
    st.dictionaries(st.sampled_from(["name", "value", "base64", "x"]), _VALUE, max_size=3))
_RECORD = st.one_of(
    st.fixed_dictionaries({"value": _TEXT}, optional={
        "key": st.one_of(_TEXT, _VALUE),
        "headers": st.one_of(st.none(), st.lists(_HEADER, max_size=2), _VALUE),
        "timestamp_ms": st.one_of(st.none(), st.booleans(), st.sampled_from(
            [-1, 0, 1760000000000, 2**63 - 1, 2**63, 1.5]))}),
    st.dictionaries(st.sampled_from(["value", "key", "headers", "timestamp_ms", "other"]),
                    _VALUE, max_size=4))
_ENTRY = st.dictionaries(
    st.sampled_from(["topic", "partition", "records", "idempotency_key", "producer_id",
                     "sequence", "other"]),
    st.one_of(_VALUE, st.lists(_TEXT, max_size=3), st.lists(_VALUE, max_size=2)),
    max_size=5)
_DOCS = st.one_of(
    st.fixed_dictionaries({"topic_partitions": st.lists(_ENTRY, max_size=3)}),
    st.fixed_dictionaries({"topic_partitions": st.lists(st.fixed_dictionaries({
        "topic": st.sampled_from(["t", "orders.v2", "a-b_c"]),
        "records": st.lists(_TEXT, min_size=1, max_size=3)},
        optional={"partition": st.integers(0, 3) | st.none(),
                  "idempotency_key": st.sampled_from(["k1", "x" * 128, "x" * 129, "é"])}),
        max_size=3)}),
    st.fixed_dictionaries({"topic_partitions": st.lists(st.fixed_dictionaries({
        "topic": st.sampled_from(["t", "orders.v2"]),
        "records": st.lists(_TEXT, min_size=1, max_size=3)},
        optional={"partition": st.sampled_from([0, 3, None, -1, "0"]),
                  "idempotency_key": st.sampled_from(["k1", None]),
                  "producer_id": st.sampled_from(["p-1", "x" * 100, "x" * 101, "é", "", 5,
                                                  None]),
                  "sequence": st.sampled_from([0, 7, -1, 2**53 - 1, 2**53, 1.0, True, None,
                                               "1"])}),
        max_size=3)}),
    st.fixed_dictionaries({"topic_partitions": st.lists(st.fixed_dictionaries({
        "topic": st.just("t"), "records": st.lists(st.one_of(_TEXT, _RECORD),
                                                   min_size=1, max_size=3)}), max_size=2)}),
    st.dictionaries(_TEXT, _VALUE, max_size=2))


def _model(body: bytes) -> list[tuple[Any, ...]] | None:
    try:
        entries = produce_body._through_model(body)
    except RequestValidationError:
        return None
    return [(e.topic, e.partition, e.idempotency_key, list(e.records), e.producer)
            for e in entries]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_DOCS)
def test_the_fast_path_accepts_exactly_what_the_model_accepts(doc: Any) -> None:
    body = json.dumps(doc).encode()
    fast = produce_body._fast(json.loads(body))
    expected = _model(body)
    if fast is None:
        return  # it stepped aside: the model decides
    assert expected is not None, f"the fast path accepted what the model refuses: {doc}"
    assert [(e.topic, e.partition, e.idempotency_key, list(e.records), e.producer)
            for e in fast] == expected


def test_the_load_generators_envelope_is_read_as_meant() -> None:
    """The bytes bench/httpload's TestLLP1AndV3Layout expects its encoder to write."""
    body = (b"LLP1\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02\x00\x03\x00\x00\x00\x10"
            b"\x00\x00\x00\x02\x00\x00\x00\x00\x02\x00\x00\x00\x01abc")
    (entry,) = llp1.parse(body, max_entries=1)
    assert (entry.topic, entry.partition, entry.idempotency_key) == ("t", 2, None)
    assert list(entry.records) == [b"ab", b"c"]


def test_record_objects_with_text_fields_take_the_fast_path() -> None:
    doc = {"topic_partitions": [{"topic": "t", "partition": 1, "records": [
        "plain", {"value": "v"}, {"value": "v", "key": "k", "timestamp_ms": 5},
        {"value": "v", "headers": [{"name": "h", "value": "x"}, {"name": "h", "value": ""}]},
        {"value": "v", "key": None, "headers": [], "timestamp_ms": None}]}]}
    body = json.dumps(doc).encode()
    fast = produce_body._fast(json.loads(body))
    assert fast is not None, "record objects of text fields went through the model"
    assert [(e.topic, e.partition, e.idempotency_key, list(e.records), e.producer)
            for e in fast] == _model(body)
    # A base64 field is the model's to decode.
    doc["topic_partitions"][0]["records"].append({"value": {"base64": "AAE="}})
    assert produce_body._fast(doc) is None


def test_an_llp2_envelope_carries_each_entrys_producer() -> None:
    """Built and read back: producers where given, none elsewhere; LLP1 when no entry
    has one (a receiver of the earlier version reads it)."""
    body = codec.encode_batch([b"x"])
    entries = [("t", 0, None, body, codec.ENCODING_V1), ("t", 1, "k", body, codec.ENCODING_V1)]
    seq = ProducerSeq("p-1", 2**53 - 1)
    sequenced = llp1.build(entries, [seq, None])
    assert sequenced.startswith(b"LLP2")
    first, second = llp1.parse(sequenced, max_entries=10)
    assert (first.producer, first.idempotency_key) == (seq, None)
    assert (second.producer, second.idempotency_key) == (None, "k")
    plain = llp1.build(entries, [None, None])
    assert plain.startswith(b"LLP1") and plain == llp1.build(entries)
    assert [e.producer for e in llp1.parse(plain, max_entries=10)] == [None, None]
