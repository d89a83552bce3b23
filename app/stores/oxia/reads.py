"""Oxia gets and range scans on the event loop (``grpc.aio``): the reads consumers wait on.

The ``oxia`` package is synchronous, so every call of :class:`OxiaStore` runs in a worker
thread, and a get hands over the GIL between the event loop, the worker and gRPC's
polling thread several times. With the loop busy (a catch-up sending 4 MiB answers), each
handover waits its turn: a control-record get took 15 ms on average there, against about
1 ms idle, and every answer of a catch-up waits for one (docs/performance.md). Here a get
is one ``Read`` call on a ``grpc.aio`` channel of the loop's own, and a range scan (the
index pages a catch-up through WAL entries walks) one ``RangeScan`` call.

The messages are written and read in protobuf wire format (app/stores/oxia/wire.py).

Only as a fast path: which shard and which leader come from the package's
own discovery (which follows leader changes, app/stores/oxia/discovery.py), a gRPC
error is reported as the package's would be (:class:`OxiaStore` maps both), and anything
else that goes wrong here (an answer this does not understand) sends the read through the
package instead. Only under asyncio, which ``grpc.aio`` needs.
"""

from __future__ import annotations

from app.stores.oxia.channels import LeaderChannels
from app.stores.oxia.wire import (
    Found,
    NotUnderstood,
    decode_get,
    decode_range_scan,
    encode_get,
    encode_range_scan,
)

READ_METHOD = "/io.streamnative.oxia.proto.OxiaClient/Read"
RANGE_SCAN_METHOD = "/io.streamnative.oxia.proto.OxiaClient/RangeScan"

__all__ = ["EventLoopReads", "Found", "NotUnderstood"]


class EventLoopReads:
    """Gets and range scans through ``grpc.aio`` channels to the shard leaders the
    package's discovery names."""

    def __init__(self, channels: LeaderChannels, *, timeout_s: float) -> None:
        self._leaders = channels
        self._timeout = timeout_s

    async def get(self, key: str, partition_key: str) -> Found | None:
        """The record under ``key`` on ``partition_key``'s shard, None when there is
        none. Raises ``grpc.aio.AioRpcError`` as a call fails, :class:`NotUnderstood`
        when the answer is not one this reads."""
        shard, channel = self._leaders.leader(partition_key)
        call = channel.unary_stream(READ_METHOD)(encode_get(shard, key),
                                                 timeout=self._timeout)
        try:
            async for answer in call:
                return decode_get(answer, key)
        finally:
            call.cancel()  # the stream has one answer: do not wait for its end
        raise NotUnderstood("the Read stream ended without an answer")

    async def range_scan(self, start: str, end: str, partition_key: str,
                         limit: int | None = None) -> list[Found]:
        """The records of ``[start, end)`` on ``partition_key``'s shard, in key order, at
        most ``limit``. Raises as :meth:`get` does."""
        shard, channel = self._leaders.leader(partition_key)
        call = channel.unary_stream(RANGE_SCAN_METHOD)(encode_range_scan(shard, start, end),
                                                       timeout=self._timeout)
        found: list[Found] = []
        try:
            async for answer in call:
                found.extend(decode_range_scan(answer))
                if limit is not None and len(found) >= limit:
                    return found[:limit]
        finally:
            call.cancel()  # ends a stream left early; nothing once it has ended
        return found
