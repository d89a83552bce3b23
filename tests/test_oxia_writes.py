"""Oxia puts on the event loop (app/stores/oxia/writes.py): the Write request matches the
package's byte for byte, its answer reads as the package writes it, and the store's group
puts on the loop do what the package's do against the real Oxia (versions, conflicts,
creates, several shards), leave to the package what they cannot send, and turn a failed
call into an unknown outcome without sending it again."""

from __future__ import annotations

import asyncio
import uuid

import grpc.aio
import pytest
from oxia.internal.proto.io.streamnative.oxia import proto as pb

from app.errors import StorageUnavailable, VersionMismatch
from app.settings import Settings
from app.stores.metrics import StoreMetrics
from app.stores.oxia import store as oxia_store_module
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore, PutSpec
from app.stores.oxia.wire import (
    OK,
    UNEXPECTED_VERSION_ID,
    NotUnderstood,
    decode_write,
    encode_write,
)
from app.stores.oxia.writes import EventLoopWrites


@pytest.mark.parametrize("shard", [0, 3, 2**40])
@pytest.mark.parametrize("puts", [
    [PutSpec("k", b"v", "pk")],
    [PutSpec("a/b", b"", "", EXPECT_NOT_EXISTS)],  # no value, an empty partition key
    [PutSpec("", b"v", "pk", 7)],  # an empty key, as proto3 writes it: not at all
    [PutSpec("ü/" + "x" * 300, b"\x00" * 70_000, "t:0", 2**40),
     PutSpec("c", b"1", "t:1", 0), PutSpec("d", b"2", "t:2", None)],
])
def test_a_write_is_the_packages_write_request(shard: int, puts: list[PutSpec]) -> None:
    expected = pb.WriteRequest(shard=shard, puts=[
        pb.PutRequest(key=p.key, value=p.value, partition_key=p.partition_key,
                      expected_version_id=p.expected_version) for p in puts])
    assert encode_write(shard, puts) == bytes(expected)


def test_a_write_answer_reads_as_the_package_writes_it() -> None:
    answer = pb.WriteResponse(puts=[
        pb.PutResponse(status=pb.Status.OK, version=pb.Version(
            version_id=12_345_678_901, modifications_count=3, created_timestamp=5)),
        pb.PutResponse(status=pb.Status.UNEXPECTED_VERSION_ID),
        pb.PutResponse(status=pb.Status.OK, version=pb.Version(version_id=0)),
        pb.PutResponse(status=pb.Status.SESSION_DOES_NOT_EXIST),
    ])
    outcomes = decode_write(bytes(answer))
    assert [(o.status, o.version_id) for o in outcomes] == [
        (OK, 12_345_678_901), (UNEXPECTED_VERSION_ID, None), (OK, 0),
        (int(pb.Status.SESSION_DOES_NOT_EXIST), None)]
    assert decode_write(bytes(pb.WriteResponse())) == []


@pytest.mark.parametrize("answer", [
    bytes(pb.WriteResponse(puts=[pb.PutResponse(status=pb.Status.OK)])),  # no version
    b"\x0a\x05\x08",  # cut short
])
def test_a_write_answer_it_does_not_understand_is_said_so(answer: bytes) -> None:
    with pytest.raises(NotUnderstood):
        decode_write(answer)


class _Shard:
    """A fake leader: answers each Write with the versions it is told, once every
    shard's request has arrived (sent one after the other, they would wait forever)."""

    def __init__(self, versions: list[int], all_sent: asyncio.Barrier) -> None:
        self.requests: list[bytes] = []
        self._versions, self._all_sent = versions, all_sent

    def unary_unary(self, method: str) -> object:
        async def call(request: bytes, **options: float) -> bytes:
            self.requests.append(request)
            await self._all_sent.wait()
            return bytes(pb.WriteResponse(puts=[
                pb.PutResponse(status=pb.Status.OK, version=pb.Version(version_id=v))
                for v in self._versions]))
        return call


async def test_puts_of_several_shards_go_out_together_and_come_back_in_order() -> None:
    all_sent = asyncio.Barrier(2)
    shards = {0: _Shard([10, 11], all_sent), 1: _Shard([20], all_sent)}

    class Leaders:
        def leader(self, partition_key: str) -> tuple[int, object]:
            shard = int(partition_key)
            return shard, shards[shard]

    writes = EventLoopWrites(Leaders(), timeout_s=5,  # type: ignore[arg-type]
                             describe=str, on_stale_leader=lambda exc: None)
    puts = [PutSpec("a", b"1", "0"), PutSpec("b", b"2", "1"), PutSpec("c", b"3", "0")]
    async with asyncio.timeout(10):
        assert await writes.write(puts) == [10, 20, 11]
    assert shards[0].requests == [encode_write(0, [puts[0], puts[2]])]
    assert shards[1].requests == [encode_write(1, [puts[1]])]
    assert await writes.write([]) == []


def _keys(n: int) -> list[tuple[str, str]]:
    """``n`` keys, each on its own partition key, so that they span Oxia's shards."""
    run = uuid.uuid4().hex
    return [(f"loop-writes/{run}/{i}", f"{run}:{i}") for i in range(n)]


async def test_the_store_writes_on_the_loop_what_the_package_writes(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    def through_package(*_: object) -> None:
        raise AssertionError("a group put that could go on the loop went to the package")

    async with OxiaStore(settings, StoreMetrics()) as store:
        assert store._writes is not None  # the default, under asyncio
        monkeypatch.setattr(oxia_store_module, "_write", through_package)
        keys = _keys(12)
        first = await store.put_group([PutSpec(k, b"one", pk, EXPECT_NOT_EXISTS)
                                       for k, pk in keys])
        assert all(isinstance(v, int) for v in first)
        versions = [v for v in first if isinstance(v, int)]
        again = await store.put_group(
            [PutSpec(keys[0][0], b"two", keys[0][1], versions[0]),  # CAS that holds
             PutSpec(keys[1][0], b"two", keys[1][1], versions[1] + 1),  # one that does not
             PutSpec(keys[2][0], b"two", keys[2][1], EXPECT_NOT_EXISTS),  # exists already
             PutSpec(keys[3][0], b"", keys[3][1])])  # blind, no value
        assert isinstance(again[0], int) and again[0] > versions[0]
        assert isinstance(again[1], VersionMismatch)
        assert isinstance(again[2], VersionMismatch)
        assert isinstance(again[3], int)
        monkeypatch.undo()
        writes, store._writes = store._writes, None
        for (key, pk), value, version in zip(keys[:4], [b"two", b"one", b"one", b""],
                                              [again[0], versions[1], versions[2], again[3]],
                                              strict=True):
            found = await store.get(key, pk)
            assert found is not None and (found.value, found.version_id) == (value, version)
        store._writes = writes


async def test_a_put_whose_leader_is_not_known_goes_through_the_package(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    async with OxiaStore(settings, StoreMetrics()) as store:
        assert store._channels is not None

        def electing(partition_key: str) -> tuple[int, grpc.aio.Channel]:
            raise NotUnderstood("shard 0 has no leader yet")

        monkeypatch.setattr(store._channels, "leader", electing)
        ((key, pk),) = _keys(1)
        (version,) = await store.put_group([PutSpec(key, b"v", pk, EXPECT_NOT_EXISTS)])
        assert isinstance(version, int)
        monkeypatch.undo()
        found = await store.get(key, pk)
        assert found is not None and found.version_id == version


async def test_a_failed_write_is_an_unknown_outcome_and_not_sent_again(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    quick = settings.model_copy(update={"oxia_request_timeout_s": 1.0})
    async with OxiaStore(quick, StoreMetrics()) as store:
        channels = store._channels
        assert channels is not None
        gone = grpc.aio.insecure_channel("127.0.0.1:1")  # nothing listens there

        def dead_leader(partition_key: str) -> tuple[int, grpc.aio.Channel]:
            return channels.shard(partition_key).shard, gone

        resent: list[object] = []

        def through_package(client: object, batch: object) -> list[int | Exception]:
            resent.append(batch)
            return []

        monkeypatch.setattr(channels, "leader", dead_leader)
        monkeypatch.setattr(oxia_store_module, "_write", through_package)
        keys = _keys(3)
        try:
            outcomes = await store.put_group([PutSpec(k, b"v", pk) for k, pk in keys])
            with pytest.raises(StorageUnavailable, match="UNAVAILABLE|DEADLINE"):
                await store.put(keys[0][0], b"v", keys[0][1])
        finally:
            await gone.close()
        assert resent == []
        assert all(isinstance(o, StorageUnavailable) for o in outcomes)
        assert all("UNAVAILABLE" in str(o) or "DEADLINE" in str(o) for o in outcomes)


async def test_a_write_cut_off_by_the_client_closing_is_an_unknown_outcome() -> None:
    """Closing a channel cancels its calls; the put's outcome is unknown, which is what
    its waiter hears (not a cancellation of a task nobody cancelled)."""
    connected = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connected.set()  # and never answers
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")

    class Leaders:
        def leader(self, partition_key: str) -> tuple[int, object]:
            return 0, channel

    writes = EventLoopWrites(Leaders(), timeout_s=30,  # type: ignore[arg-type]
                             describe=str, on_stale_leader=lambda exc: None)
    try:
        async with asyncio.timeout(20):
            pending = asyncio.create_task(writes.write([PutSpec("k", b"v", "pk")]))
            await connected.wait()
            await channel.close()
            (outcome,) = await pending
        assert isinstance(outcome, StorageUnavailable)
        assert "closing" in str(outcome)
    finally:
        server.close()
        await server.wait_closed()


async def test_turned_off_every_put_goes_through_the_package(settings: Settings) -> None:
    off = settings.model_copy(update={"oxia_event_loop_writes": False})
    async with OxiaStore(off, StoreMetrics()) as store:
        assert store._writes is None and store._reads is not None
        ((key, pk),) = _keys(1)
        version = await store.put(key, b"v", pk, expected_version=EXPECT_NOT_EXISTS)
        found = await store.get(key, pk)
        assert found is not None and found.version_id == version
