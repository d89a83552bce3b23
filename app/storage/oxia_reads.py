"""Oxia gets and range scans on the event loop (``grpc.aio``): the reads consumers wait on.

The ``oxia`` package is synchronous, so every call of :class:`OxiaStore` runs in a worker
thread, and a get hands over the GIL between the event loop, the worker and gRPC's
polling thread several times. With the loop busy (a catch-up sending 4 MiB answers), each
handover waits its turn: a control-record get took 15 ms on average there, against about
1 ms idle, and every answer of a catch-up waits for one (docs/performance.md). Here a get
is one ``Read`` call on a ``grpc.aio`` channel of the loop's own, and a range scan (the
index pages a catch-up through WAL entries walks) one ``RangeScan`` call.

The messages are small and fixed, so they are written and read with a few lines of
protobuf wire format, after Oxia's ``client.proto``: ``ReadRequest{shard = 1, gets = 2}``,
``GetRequest{key = 1, include_value = 2}``, ``ReadResponse{gets = 1}``,
``GetResponse{status = 1, version = 2, value = 3, key = 4}``, ``Version{version_id = 1}``,
``RangeScanRequest{shard = 1, start_inclusive = 2, end_exclusive = 3}``,
``RangeScanResponse{records = 1}`` (each a ``GetResponse``).

Only as a fast path: which shard and which leader come from the package's
own discovery (which follows leader changes, app/storage/oxia_discovery.py), a gRPC
error is reported as the package's would be (:class:`OxiaStore` maps both), and anything
else that goes wrong here (an answer this does not understand) sends the read through the
package instead. Only under asyncio, which ``grpc.aio`` needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio

READ_METHOD = "/io.streamnative.oxia.proto.OxiaClient/Read"
RANGE_SCAN_METHOD = "/io.streamnative.oxia.proto.OxiaClient/RangeScan"
_OK, _KEY_NOT_FOUND = 0, 1
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


class NotUnderstood(Exception):
    """An answer (or a state of the discovery) this client does not handle."""


class Found:
    """A record as a get found it."""

    __slots__ = ("key", "value", "version_id")

    def __init__(self, key: str, value: bytes, version_id: int) -> None:
        self.key, self.value, self.version_id = key, value, version_id


class EventLoopReads:
    """Gets through ``grpc.aio`` channels to the shard leaders the package's discovery
    names, one channel per leader, opened on first use (on the running loop) and
    closed by :meth:`aclose`."""

    def __init__(self, client: Any, *, timeout_s: float,
                 credentials: grpc.ChannelCredentials | None,
                 options: list[tuple[str, Any]]) -> None:
        self._discovery = client._service_discovery
        self._timeout = timeout_s
        self._credentials = credentials
        self._options = options
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def get(self, key: str, partition_key: str) -> Found | None:
        """The record under ``key`` on ``partition_key``'s shard, None when there is
        none. Raises ``grpc.aio.AioRpcError`` as a call fails, :class:`NotUnderstood`
        when the answer is not one this reads."""
        shard = self._shard(partition_key)
        read = self._channel(shard.leader).unary_stream(READ_METHOD)
        call = read(encode_get(shard.shard, key), timeout=self._timeout)
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
        shard = self._shard(partition_key)
        scan = self._channel(shard.leader).unary_stream(RANGE_SCAN_METHOD)
        call = scan(encode_range_scan(shard.shard, start, end), timeout=self._timeout)
        found: list[Found] = []
        try:
            async for answer in call:
                found.extend(decode_range_scan(answer))
                if limit is not None and len(found) >= limit:
                    return found[:limit]
        finally:
            call.cancel()  # ends a stream left early; nothing once it has ended
        return found

    def _shard(self, partition_key: str) -> Any:
        try:
            return self._discovery.get_shard(partition_key)
        except Exception as exc:  # no assignments yet: the package waits for them
            raise NotUnderstood(f"no shard for {partition_key!r}: {exc}") from exc

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = (grpc.aio.insecure_channel(address, options=self._options)
                       if self._credentials is None else
                       grpc.aio.secure_channel(address, self._credentials,
                                               options=self._options))
            self._channels[address] = channel
        return channel

    async def aclose(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


# -- protobuf wire format, for these messages only ----------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_get(shard: int, key: str) -> bytes:
    """``ReadRequest{shard, gets: [GetRequest{key, include_value: true}]}``."""
    raw = key.encode()
    get = b"\x0a" + _varint(len(raw)) + raw + b"\x10\x01"
    return b"\x08" + _varint(shard) + b"\x12" + _varint(len(get)) + get


def encode_range_scan(shard: int, start: str, end: str) -> bytes:
    """``RangeScanRequest{shard, start_inclusive, end_exclusive}`` (an empty string, as
    proto3 writes it: not at all)."""
    out = b"\x08" + _varint(shard)
    for tag, text in ((b"\x12", start), (b"\x1a", end)):
        if text:
            raw = text.encode()
            out += tag + _varint(len(raw)) + raw
    return out


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise NotUnderstood("a varint runs past the message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """``(field number, value)``: an int for varints and fixed-width fields, bytes for
    length-delimited ones."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, value
        elif wire == _BYTES:
            length, pos = _read_varint(buf, pos)
            if pos + length > len(buf):
                raise NotUnderstood("a field runs past the message")
            yield number, buf[pos:pos + length]
            pos += length
        elif wire in (_FIXED64, _FIXED32):
            width = 8 if wire == _FIXED64 else 4
            if pos + width > len(buf):
                raise NotUnderstood("a field runs past the message")
            yield number, int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        else:
            raise NotUnderstood(f"wire type {wire} in an answer")


def decode_get(answer: bytes, asked: str) -> Found | None:
    """The first ``GetResponse`` of a ``ReadResponse``: the record, or None when the key
    is not found; :class:`NotUnderstood` for any other status."""
    response = next((v for n, v in _fields(answer) if n == 1 and isinstance(v, bytes)), None)
    if response is None:
        raise NotUnderstood("a ReadResponse without a GetResponse")
    return _get_response(response, asked)


def decode_range_scan(answer: bytes) -> list[Found]:
    """The records of one ``RangeScanResponse`` (a scan's answer comes in several); each
    must carry its key and be found."""
    found: list[Found] = []
    for number, field in _fields(answer):
        if number != 1 or not isinstance(field, bytes):
            continue
        record = _get_response(field, None)
        if record is None:
            raise NotUnderstood("a range scan answered a record as not found")
        found.append(record)
    return found


def _get_response(response: bytes, asked: str | None) -> Found | None:
    """One ``GetResponse``; ``asked`` is its key when it carries none (None: it must)."""
    status, value, key, version_id = _OK, b"", asked, None
    for number, field in _fields(response):
        if number == 1 and isinstance(field, int):
            status = field
        elif number == 2 and isinstance(field, bytes):
            version_id = next((v for n, v in _fields(field) if n == 1 and isinstance(v, int)),
                              0)
        elif number == 3 and isinstance(field, bytes):
            value = field
        elif number == 4 and isinstance(field, bytes):
            key = field.decode()
    if status == _KEY_NOT_FOUND:
        return None
    if status != _OK or version_id is None:
        raise NotUnderstood(f"a GetResponse with status {status}")
    if key is None:
        raise NotUnderstood("a scanned record without its key")
    if version_id >= 1 << 63:  # int64 on the wire as two's complement
        version_id -= 1 << 64
    return Found(key, value, version_id)
