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

from tests.helpers.faults import _pump, _pump_truncated, tcp_proxy


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
    async def down(upstream: anyio.abc.SocketStream, client: anyio.abc.SocketStream
                   ) -> None:
        proxy.connections += 1
        if proxy.connections <= cut_first:
            await _pump_truncated(upstream, client, body_bytes)
        else:
            await _pump(upstream, client)

    async with tcp_proxy(target_host, target_port, up=_pump, down=down) as port:
        proxy = CutProxy(port, cut_first)
        yield proxy


@contextlib.contextmanager
def cutting_proxy_thread(target_host: str, target_port: int, *, cut_first: int = 1,
                         body_bytes: int = 0) -> Iterator[CutProxy]:
    """:func:`cutting_proxy` on an event loop of its own, for blocking clients."""
    with anyio.from_thread.start_blocking_portal() as portal, portal.wrap_async_context_manager(
            cutting_proxy(target_host, target_port, cut_first=cut_first,
                          body_bytes=body_bytes)) as proxy:
        yield proxy
