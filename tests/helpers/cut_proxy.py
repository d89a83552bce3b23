"""A TCP proxy that cuts the answers of its first connections and lets later ones
through whole: a client's first attempt loses its answer after the broker acted on the
request, and its retry (on a new connection) gets through."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import anyio
import anyio.abc
import anyio.from_thread

from tests.helpers.faults import _pump, _pump_truncated


@dataclass
class CutProxy:
    port: int
    cut_first: int
    connections: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def cuts(self) -> int:
        return min(self.connections, self.cut_first)


@contextlib.asynccontextmanager
async def cutting_proxy(target_host: str, target_port: int, *, cut_first: int = 1,
                        body_bytes: int = 0) -> AsyncIterator[CutProxy]:
    """Forward to the target; the answers on the first ``cut_first`` connections end
    after their headers and ``body_bytes`` bytes of body."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy = CutProxy(listener.extra(anyio.abc.SocketAttribute.local_port), cut_first)

    async def serve(client: anyio.abc.SocketStream) -> None:
        proxy.connections += 1
        cut = proxy.connections <= cut_first
        async with (client, await anyio.connect_tcp(target_host, target_port) as upstream,
                    anyio.create_task_group() as tg):
            tg.start_soon(_pump, client, upstream)
            if cut:
                await _pump_truncated(upstream, client, body_bytes)
            else:
                await _pump(upstream, client)
            tg.cancel_scope.cancel()

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, serve)
        try:
            yield proxy
        finally:
            tg.cancel_scope.cancel()


@contextlib.contextmanager
def cutting_proxy_thread(target_host: str, target_port: int, *, cut_first: int = 1,
                         body_bytes: int = 0) -> Iterator[CutProxy]:
    """:func:`cutting_proxy` on an event loop of its own, for blocking clients."""
    with anyio.from_thread.start_blocking_portal() as portal, portal.wrap_async_context_manager(
            cutting_proxy(target_host, target_port, cut_first=cut_first,
                          body_bytes=body_bytes)) as proxy:
        yield proxy
