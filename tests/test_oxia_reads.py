"""Oxia gets and range scans on the event loop (app/stores/oxia/reads.py): the messages
match the package's byte for byte, and the store's gets and scans read what the package
reads, from the real Oxia, falling back to the package for an answer they do not
understand."""

from __future__ import annotations

import pytest
from oxia.internal.proto.io.streamnative.oxia import proto as pb

from app.settings import Settings
from app.stores.metrics import StoreMetrics
from app.stores.oxia.store import OxiaStore
from app.stores.oxia.wire import (
    NotUnderstood,
    decode_get,
    decode_range_scan,
    encode_get,
    encode_range_scan,
)


@pytest.mark.parametrize(("shard", "key"), [(0, "k"), (3, "a/b"), (2**40, "ü/" + "x" * 300)])
def test_a_get_is_the_packages_read_request(shard: int, key: str) -> None:
    expected = pb.ReadRequest(shard=shard, gets=[pb.GetRequest(key=key, include_value=True)])
    assert encode_get(shard, key) == bytes(expected)


@pytest.mark.parametrize(("shard", "start", "end"), [
    (0, "a/", "a/~"), (7, "", "z"), (2**40, "ü/" + "x" * 300, "ü/y")])
def test_a_range_scan_is_the_packages_request(shard: int, start: str, end: str) -> None:
    expected = pb.RangeScanRequest(shard=shard, start_inclusive=start, end_exclusive=end)
    assert encode_range_scan(shard, start, end) == bytes(expected)


def test_scanned_records_read_as_the_package_writes_them() -> None:
    answer = pb.RangeScanResponse(records=[
        pb.GetResponse(status=pb.Status.OK, key=f"i/{n}", value=bytes([n]) * n,
                       version=pb.Version(version_id=2**40 + n, modifications_count=n))
        for n in range(3)])
    found = decode_range_scan(bytes(answer))
    assert [(f.key, f.value, f.version_id) for f in found] == [
        (f"i/{n}", bytes([n]) * n, 2**40 + n) for n in range(3)]
    assert decode_range_scan(bytes(pb.RangeScanResponse())) == []


@pytest.mark.parametrize("record", [
    pb.GetResponse(status=pb.Status.OK, value=b"v", version=pb.Version(version_id=1)),  # no key
    pb.GetResponse(status=pb.Status.KEY_NOT_FOUND, key="k"),
])
def test_a_scanned_record_it_does_not_understand_is_said_so(record: pb.GetResponse) -> None:
    with pytest.raises(NotUnderstood):
        decode_range_scan(bytes(pb.RangeScanResponse(records=[record])))


def test_answers_read_as_the_package_writes_them() -> None:
    found = pb.ReadResponse(gets=[pb.GetResponse(
        status=pb.Status.OK, value=b"\x00value", key="a/b",
        version=pb.Version(version_id=12_345_678_901, modifications_count=2,
                           created_timestamp=5, modified_timestamp=7, session_id=9))])
    record = decode_get(bytes(found), "asked")
    assert record is not None
    assert (record.key, record.value, record.version_id) == ("a/b", b"\x00value",
                                                             12_345_678_901)
    empty = pb.ReadResponse(gets=[pb.GetResponse(status=pb.Status.OK,
                                                 version=pb.Version(version_id=0))])
    record = decode_get(bytes(empty), "asked")  # defaults: the key asked, no bytes
    assert record is not None and (record.key, record.value, record.version_id) == (
        "asked", b"", 0)
    missing = pb.ReadResponse(gets=[pb.GetResponse(status=pb.Status.KEY_NOT_FOUND)])
    assert decode_get(bytes(missing), "asked") is None


@pytest.mark.parametrize("answer", [
    b"",  # no GetResponse
    bytes(pb.ReadResponse(gets=[pb.GetResponse(status=pb.Status.SESSION_DOES_NOT_EXIST)])),
    b"\x0a\x05\x08",  # cut short
    b"\x0a\x02\x0b\x00",  # a wire type protobuf no longer uses
])
def test_an_answer_it_does_not_understand_is_said_so(answer: bytes) -> None:
    with pytest.raises(NotUnderstood):
        decode_get(answer, "k")


async def test_the_store_reads_on_the_loop_what_the_package_reads(settings: Settings) -> None:
    async with OxiaStore(settings, StoreMetrics()) as store:
        assert store._reads is not None  # the default, under asyncio
        await store.put("loop-reads/a", b"one", "pk")
        await store.put("loop-reads/a", b"two", "pk")
        on_loop = await store.get("loop-reads/a", "pk")
        assert await store.get("loop-reads/none", "pk") is None
        reads, store._reads = store._reads, None
        through_package = await store.get("loop-reads/a", "pk")
        store._reads = reads
        assert on_loop == through_package
        assert on_loop is not None and on_loop.value == b"two"


async def test_an_answer_not_understood_is_read_again_through_the_package(
        settings: Settings) -> None:
    async with OxiaStore(settings, StoreMetrics()) as store:
        await store.put("loop-reads/b", b"value", "pk")
        assert store._reads is not None

        async def refusing(key: str, partition_key: str) -> None:
            raise NotUnderstood("a status this client does not know")

        store._reads.get = refusing  # type: ignore[method-assign]
        record = await store.get("loop-reads/b", "pk")
        assert record is not None and record.value == b"value"


async def test_turned_off_every_get_goes_through_the_package(settings: Settings) -> None:
    off = settings.model_copy(update={"oxia_event_loop_reads": False})
    async with OxiaStore(off, StoreMetrics()) as store:
        assert store._reads is None
        await store.put("loop-reads/c", b"value", "pk")
        record = await store.get("loop-reads/c", "pk")
        assert record is not None and record.value == b"value"


async def test_the_store_scans_on_the_loop_what_the_package_scans(settings: Settings) -> None:
    async with OxiaStore(settings, StoreMetrics()) as store:
        assert store._reads is not None
        # Enough bytes for the server to answer in several messages.
        for n in range(40):
            await store.put(f"loop-scan/{n:03d}", bytes([n]) * 200_000, "pk")
        scans = [("loop-scan/", "loop-scan/~", None), ("loop-scan/", "loop-scan/~", 7),
                 ("loop-scan/010", "loop-scan/013", None), ("loop-scan/x", "loop-scan/y", 3)]
        on_loop = [await store.range_scan(lo, hi, "pk", limit=limit) for lo, hi, limit in scans]
        reads, store._reads = store._reads, None
        through_package = [await store.range_scan(lo, hi, "pk", limit=limit)
                           for lo, hi, limit in scans]
        store._reads = reads
        assert on_loop == through_package
        assert [len(found) for found in on_loop] == [40, 7, 3, 0]
        assert on_loop[0][39].value == bytes([39]) * 200_000


async def test_a_scan_not_understood_is_made_again_through_the_package(
        settings: Settings) -> None:
    async with OxiaStore(settings, StoreMetrics()) as store:
        await store.put("loop-scan-b/1", b"value", "pk")
        assert store._reads is not None

        async def refusing(*_: object) -> None:
            raise NotUnderstood("a status this client does not know")

        store._reads.range_scan = refusing  # type: ignore[method-assign, assignment]
        (record,) = await store.range_scan("loop-scan-b/", "loop-scan-b/~", "pk")
        assert record.value == b"value"
