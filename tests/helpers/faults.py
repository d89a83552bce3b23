"""A TCP proxy that cuts responses short, for faults a real server will not produce on
demand (a body truncated mid-transfer)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc

HEADER_END = b"\r\n\r\n"


@contextlib.asynccontextmanager
async def truncating_proxy(target_host: str, target_port: int, *, body_bytes: int
                           ) -> AsyncIterator[int]:
    """Forward connections to the target; each response is cut after its headers and
    ``body_bytes`` bytes of body (the connection is then closed). Yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with (client, await anyio.connect_tcp(target_host, target_port) as upstream,
                    anyio.create_task_group() as tg):
            tg.start_soon(_pump, client, upstream)
            await _pump_truncated(upstream, client, body_bytes)
            tg.cancel_scope.cancel()

    async with listener, anyio.create_task_group() as tg:  # the listener closes last
        tg.start_soon(listener.serve, serve)
        try:
            yield port
        finally:
            tg.cancel_scope.cancel()


async def _pump(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                             anyio.ClosedResourceError):
        while True:
            await sink.send(await source.receive())


async def _pump_truncated(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream,
                          body_bytes: int) -> None:
    seen = b""
    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                             anyio.ClosedResourceError):
        while True:
            chunk = await source.receive()
            seen += chunk
            end = seen.find(HEADER_END)
            if end >= 0 and len(seen) > end + len(HEADER_END) + body_bytes:
                keep = len(chunk) - (len(seen) - (end + len(HEADER_END) + body_bytes))
                await sink.send(chunk[:max(keep, 0)])
                return
            await sink.send(chunk)
