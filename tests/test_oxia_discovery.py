"""FailoverDiscovery.refresh: a stream from a stalled server is dropped and the shard
assignments read from the next server. Pure logic: a fake connection pool whose streams
the test controls (the servers' side is in tests/test_cluster_oxia.py)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from oxia.internal.proto.io.streamnative.oxia import proto as pb

from app.stores.oxia import discovery as oxia_discovery
from app.stores.oxia.discovery import FailoverDiscovery


def _assignments(leader: str) -> Any:
    return pb.ShardAssignments(namespaces={"default": pb.NamespaceShardsAssignment(
        shard_key_router=pb.ShardKeyRouter.XXHASH3,
        assignments=[pb.ShardAssignment(shard=0, leader=leader, int32_hash_range=pb.Int32HashRange(
            min_hash_inclusive=0, max_hash_inclusive=2**32 - 1))])})


class _Cancelled(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED


class _Stream:
    """One assignments message, then silence until cancelled (a stalled server)."""

    def __init__(self, leader: str) -> None:
        self.leader = leader
        self.cancelled = threading.Event()
        self.applied = threading.Event()  # the reader asked for more: it applied the first

    def __iter__(self) -> Iterator[Any]:
        yield _assignments(self.leader)
        self.applied.set()
        self.cancelled.wait(30)
        raise _Cancelled()

    def cancel(self) -> None:
        self.cancelled.set()


class _Pool:
    def __init__(self) -> None:
        self.streams: queue.Queue[tuple[str, _Stream]] = queue.Queue()

    def get(self, address: str) -> Any:
        pool = self

        class Channel:
            def unary_stream(self, *_: Any) -> Any:
                def call(_request: Any) -> _Stream:
                    stream = _Stream(f"leader-from-{address}")
                    pool.streams.put((address, stream))
                    return stream
                return call

        class Stub:
            _channel = Channel()

        return Stub()


def test_refresh_reads_the_assignments_again_from_the_next_server(monkeypatch: Any) -> None:
    monkeypatch.setattr(oxia_discovery, "MIN_REFRESH_INTERVAL_S", 3600.0)
    pool = _Pool()
    discovery = FailoverDiscovery("a:1,b:2", pool, "default", init_timeout=10)
    try:
        first_address, first = pool.streams.get(timeout=10)
        assert first_address == "a:1" and first.applied.wait(10)
        assert discovery.leaders() == {0: "leader-from-a:1"}
        discovery.refresh()
        assert first.cancelled.is_set()
        second_address, second = pool.streams.get(timeout=10)
        assert second_address == "b:2" and second.applied.wait(10)
        assert discovery.leaders() == {0: "leader-from-b:2"}
        discovery.refresh()  # again within the interval: nothing happens
        assert not second.cancelled.is_set() and discovery.refreshes == 1
    finally:
        discovery._closed = True
        for _, stream in list(pool.streams.queue):
            stream.cancel()
        first.cancel()
        second.cancel()
