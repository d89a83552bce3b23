"""Oxia puts on the event loop (``grpc.aio``): the commits every produce waits on.

Each flush of the produce path commits its partitions through one ``Write`` request per
shard. Through the ``oxia`` package that request is built and its answer read as the
package's pure-Python messages, in a worker thread that then hands the GIL back and forth
with the loop and gRPC's polling thread. Here the request is a few lines of protobuf wire
format (app/stores/oxia/wire.py) sent on a channel of the loop's own, and the shards of
one group are written concurrently.

A put that cannot be sent (no assignments yet, a shard between leaders) is left to the
package, as reads are. A put whose ``send_by`` has passed when its shard's request goes
out is left out of it (``SendExpired``). Once a request is sent there is no second
attempt here: a failed call or an answer this does not understand makes each of its
puts ``StorageUnavailable``, an outcome the callers already treat as unknown (the commit
path reads back what happened before it tries again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc
import grpc.aio

from app.errors import StorageUnavailable, VersionMismatch
from app.stores.oxia.channels import LeaderChannels
from app.stores.oxia.wire import (
    OK,
    UNEXPECTED_VERSION_ID,
    NotUnderstood,
    PutSpec,
    decode_write,
    encode_write,
    in_time,
)

WRITE_METHOD = "/io.streamnative.oxia.proto.OxiaClient/Write"

# What one put came to: its new version, VersionMismatch, or StorageUnavailable.
PutResult = int | Exception


class EventLoopWrites:
    """Write requests through ``grpc.aio`` channels to the shard leaders.

    ``describe`` renders a gRPC error for the outcome's message and
    ``on_stale_leader`` is called when a call failed as calls to a replaced leader do,
    so that the store's discovery reads the assignments again."""

    def __init__(self, channels: LeaderChannels, *, timeout_s: float,
                 describe: Callable[[BaseException], str],
                 on_stale_leader: Callable[[grpc.aio.AioRpcError], None]) -> None:
        self._leaders = channels
        self._timeout = timeout_s
        self._describe = describe
        self._on_stale_leader = on_stale_leader

    async def write(self, puts: Sequence[PutSpec]) -> list[PutResult]:
        """Send ``puts``, one request per shard, the shards concurrently; an outcome
        for each put, in order. Raises :class:`NotUnderstood`, having sent nothing,
        when a put's shard or leader is not known."""
        if not puts:
            return []
        by_shard: dict[int, tuple[grpc.aio.Channel, list[int]]] = {}
        for i, put in enumerate(puts):
            # As the package routes: by the partition key, else by the key itself.
            shard, channel = self._leaders.leader(put.partition_key or put.key)
            by_shard.setdefault(shard, (channel, []))[1].append(i)
        out: list[PutResult] = [StorageUnavailable("not sent")] * len(puts)
        sends = [self._send_shard(shard, channel, [puts[i] for i in indexes])
                 for shard, (channel, indexes) in by_shard.items()]
        answers = await asyncio.gather(*sends) if len(sends) > 1 else [await sends[0]]
        for (_, indexes), results in zip(by_shard.values(), answers, strict=True):
            for i, result in zip(indexes, results, strict=True):
                out[i] = result
        return out

    async def _send_shard(self, shard: int, channel: grpc.aio.Channel,
                          puts: list[PutSpec]) -> list[PutResult]:
        """One Write request of the puts still in time (the others are answered
        ``SendExpired``, unsent); never raises for what Oxia or the network did."""
        sendable, out = in_time(puts)
        if sendable:
            sent = await self._request(shard, channel, [puts[i] for i in sendable])
            for i, result in zip(sendable, sent, strict=True):
                out[i] = result
        return out

    async def _request(self, shard: int, channel: grpc.aio.Channel,
                       puts: list[PutSpec]) -> list[PutResult]:
        """One Write request; never raises for what Oxia or the network did."""
        write = channel.unary_unary(WRITE_METHOD)
        try:
            answer = await write(encode_write(shard, puts), timeout=self._timeout)
            outcomes = decode_write(answer)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled: not the call's doing
            # The channel was closed under the call (the store is closing): grpc.aio
            # cancels its calls, and the put's outcome is unknown.
            return [StorageUnavailable(f"Oxia write to shard {shard} was cut off: "
                                       "the client is closing")] * len(puts)
        except grpc.aio.UsageError as exc:  # a closed channel: nothing was sent
            return [StorageUnavailable(f"Oxia write to shard {shard}: {exc}")] * len(puts)
        except grpc.aio.AioRpcError as exc:
            self._on_stale_leader(exc)
            error = StorageUnavailable(
                f"Oxia write to shard {shard} failed: {self._describe(exc)}")
            return [error] * len(puts)
        except NotUnderstood as exc:
            return [StorageUnavailable(f"Oxia write to shard {shard}: {exc}")] * len(puts)
        if len(outcomes) != len(puts):
            return [StorageUnavailable(f"Oxia answered {len(outcomes)} of {len(puts)} puts"
                                       f" to shard {shard}")] * len(puts)
        results: list[PutResult] = []
        for put, outcome in zip(puts, outcomes, strict=True):
            if outcome.status == OK and outcome.version_id is not None:
                results.append(outcome.version_id)
            elif outcome.status == UNEXPECTED_VERSION_ID:
                results.append(VersionMismatch())
            else:
                results.append(StorageUnavailable(
                    f"Oxia put {put.key}: status {outcome.status}"))
        return results
