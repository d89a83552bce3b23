"""TCP proxies for faults a real server will not produce on demand: :func:`tcp_proxy`
joins each connection to a target through two pumps of the caller's, and
:func:`truncating_proxy` cuts responses short (a body truncated mid-transfer)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

HEADER_END = b"\r\n\r\n"


Pump = Callable[[anyio.abc.SocketStream, anyio.abc.SocketStream], Coroutine[Any, Any, None]]


@contextlib.asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int, *, up: Pump, down: Pump
                    ) -> AsyncIterator[int]:
    """Listen on a free local port and join each connection to the target: ``up(client,
    upstream)`` carries what the client sends, ``down(upstream, client)`` the answers,
    and a connection closes when ``down`` returns. Yields the port."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def serve(client: anyio.abc.SocketStream) -> None:
        async with (client, await anyio.connect_tcp(target_host, target_port) as upstream,
                    anyio.create_task_group() as tg):
            tg.start_soon(up, client, upstream)
            await down(upstream, client)
            tg.cancel_scope.cancel()

    async with listener, anyio.create_task_group() as tg:  # the listener closes last
        tg.start_soon(listener.serve, serve)
        try:
            yield listener.extra(anyio.abc.SocketAttribute.local_port)
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def truncating_proxy(target_host: str, target_port: int, *, body_bytes: int
                           ) -> AsyncIterator[int]:
    """Forward connections to the target; each response is cut after its headers and
    ``body_bytes`` bytes of body (the connection is then closed). Yields the port."""

    async def down(upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream
                   ) -> None:
        await _pump_truncated(upstream, client, body_bytes)

    async with tcp_proxy(target_host, target_port, up=_pump, down=down) as port:
        yield port


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
