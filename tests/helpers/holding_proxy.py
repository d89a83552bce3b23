"""A TCP proxy that can hold what clients send: while held, bytes from clients wait in
the proxy (the upstream sees nothing) until released, in order. In front of MinIO it
makes a broker's object-store writes as slow as a test needs, on the real wire. Its
twin holds the answers instead (the upstream reads and acts, its client hears nothing):
a peer that did the work and whose answer is late."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import anyio
import anyio.abc
import anyio.from_thread

from tests.helpers.faults import _pump, tcp_proxy


@dataclass
class HoldingProxy:
    port: int
    _open: anyio.Event = field(default_factory=anyio.Event)
    # Set (from the proxy's loop) once a client's bytes are being held.
    holding: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._open.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self) -> None:
        if self._open.is_set():
            self._open = anyio.Event()
            self.holding.clear()

    def release(self) -> None:
        self._open.set()

    async def _send_when_open(self, source: anyio.abc.SocketStream,
                              sink: anyio.abc.SocketStream) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                                 anyio.ClosedResourceError):
            while True:
                chunk = await source.receive()
                if not self._open.is_set():
                    self.holding.set()
                    await self._open.wait()
                await sink.send(chunk)


@contextlib.asynccontextmanager
async def holding_proxy(target_host: str, target_port: int, *, answers: bool = False
                        ) -> AsyncIterator[HoldingProxy]:
    """``answers``: hold what the target sends back, not what clients send."""
    async def held(source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream) -> None:
        await proxy._send_when_open(source, sink)

    up, down = (_pump, held) if answers else (held, _pump)
    async with tcp_proxy(target_host, target_port, up=up, down=down) as port:
        proxy = HoldingProxy(port)
        try:
            yield proxy
        finally:
            proxy.release()  # connections held mid-request end as the proxy closes


@contextlib.contextmanager
def holding_proxy_thread(target_host: str, target_port: int
                         ) -> Iterator[tuple[HoldingProxy, anyio.from_thread.BlockingPortal]]:
    """:func:`holding_proxy` on an event loop of its own (a thread); call its
    ``hold``/``release`` through the portal (``portal.call(proxy.hold)``)."""
    with anyio.from_thread.start_blocking_portal() as portal, \
            portal.wrap_async_context_manager(holding_proxy(target_host, target_port)
                                              ) as proxy:
        yield proxy, portal
