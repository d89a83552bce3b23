"""The listener other brokers forward appends to.

Each connection starts with the handshake (with a secret, a client that does not prove
it is closed before any APPEND is read), then each APPEND is handed to ``handler`` in a
task of its own, so many are in flight at once and are answered as they finish, by id.
The handler gets the groups, their take-by time (``time.monotonic()`` plus the
frame's deadline), the frame's fence, which a flush must take before it writes them, and
its commit window in seconds (:mod:`app.cluster.fences`); the broker's handler is
``Batcher.enqueue``. An answer says
exactly what happened (docs/protocol.md, Forwarding between brokers):

- RESULTS: the log's outcome of every group (an error that may have written, such as
  ``CommitInDoubt``, is among them, per group);
- REFUSED: nothing was written (the batcher refused the frame, a malformed body, or
  this server is closing);
- EXPIRED: no flush took the groups by their take-by time, the forwarder had given
  up on them (it holds their fence), or their commit window ended before a commit of
  theirs was sent, so nothing was written.

A connection that breaks the protocol (an unknown or oversized frame) is refused and
closed; a malformed APPEND body is refused alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from app.cluster import frames
from app.cluster.fences import Fence
from app.cluster.forward_metrics import ForwardMetrics, ReceivedOutcome
from app.cluster.frames import AppendHead, FrameError, FrameTooLarge, FrameType
from app.errors import (
    CommitInDoubt,
    ForwardExpired,
    InvalidRequest,
    LlogError,
    PayloadTooLarge,
    ShuttingDown,
    Unauthenticated,
)
from app.storage.appends import AppendGroup, AppendOutcome

log = logging.getLogger(__name__)

# The groups, their take-by time (monotonic), their fence and their commit window (s).
ForwardHandler = Callable[[list[AppendGroup], float, Fence, float],
                          Awaitable[list[AppendOutcome]]]

# APPENDs of one connection handled at once; past it the connection is not read (TCP
# pushes back on the sender). The batcher's buffer bounds their bytes well before.
MAX_INFLIGHT_FRAMES = 1024


@dataclass(eq=False)
class _Peer:
    """One accepted connection."""

    writer: asyncio.StreamWriter
    reading: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    inflight: int = 0

    async def send(self, parts: frames.Parts) -> None:
        if self.writer.transport.is_closing():
            return  # the peer is gone: it counts the frame as unknown
        self.writer.writelines(parts)
        with contextlib.suppress(ConnectionError):  # the reading side sees the end too
            await self.writer.drain()


class ForwardServer:
    def __init__(self, handler: ForwardHandler, *, host: str, port: int, secret: str | None,
                 max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
                 handshake_timeout_s: float = 10.0,
                 metrics: ForwardMetrics | None = None) -> None:
        self._handler = handler
        self._host = host
        self._port = port
        self._secret = secret
        self._max_frame = max_frame_bytes
        self._handshake_timeout_s = handshake_timeout_s
        self._metrics = metrics
        self._peers: set[_Peer] = set()
        self._closing = anyio.Event()
        self.stopped = anyio.Event()  # run() has returned: every APPEND read was answered
        self.address = ""  # host:port, known once run() has started listening

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Listen and serve until :meth:`close`; returns once every APPEND read has been
        answered and every connection closed (then :attr:`stopped` is set)."""
        try:
            await self._run(task_status)
        finally:
            self.stopped.set()

    async def _run(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with anyio.create_task_group() as tg:
            # A coroutine, so asyncio runs it as a task: anyio asks sniffio which event
            # loop runs, and sniffio knows only inside a task (a plain callback of the
            # server's protocol would be refused, and the connection with it).
            async def accepted(reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
                try:
                    tg.start_soon(self._serve, reader, writer)
                except RuntimeError:  # accepted as the server stopped
                    writer.transport.abort()

            server = await asyncio.start_server(accepted, self._host, self._port)
            try:
                host, port = server.sockets[0].getsockname()[:2]
                self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                task_status.started()
                await self._closing.wait()
            finally:
                server.close()  # stop accepting; the connections finish in the group
                for peer in list(self._peers):
                    if peer.inflight == 0:
                        peer.reading.cancel()

    def close(self) -> None:
        """Stop accepting; each connection answers the APPENDs it has read (later ones
        are refused, ShuttingDown), then closes."""
        self._closing.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        peer = _Peer(writer)
        self._peers.add(peer)
        if self._closing.is_set():
            peer.reading.cancel()  # accepted as the server stopped: read nothing
        try:
            if await self._handshake(peer, reader):
                async with anyio.create_task_group() as frames_tg:
                    with peer.reading:
                        await self._read_appends(peer, reader, frames_tg)
            # Every APPEND read is answered (or the client was refused): close, letting
            # the last frames out first.
            writer.close()
            with anyio.move_on_after(self._handshake_timeout_s):
                await writer.wait_closed()
        except OSError as exc:
            log.debug("a forward connection ended: %s", exc)
        finally:
            self._peers.discard(peer)
            writer.transport.abort()

    async def _handshake(self, peer: _Peer, reader: asyncio.StreamReader) -> bool:
        """Whether the client passed (else it has been refused; nothing more is read)."""
        nonce = os.urandom(frames.NONCE_BYTES)
        with anyio.move_on_after(self._handshake_timeout_s):
            await peer.send(frames.hello(nonce))
            try:
                got = await frames.read_frame(reader, frames.NONCE_BYTES + 2
                                              + frames.MAC_BYTES)
                if got is None or got.type is not FrameType.AUTH:
                    raise FrameError("expected AUTH")
                client_nonce, mac = frames.parse_auth(got.payload)
            except FrameError as exc:
                if isinstance(exc, frames.ProtocolMismatch):
                    log.warning("a forward connection refused: %s", exc)
                await peer.send(frames.refused(frames.CONNECTION, InvalidRequest(str(exc))))
                return False
            expected = frames.mac(self._secret, "client", nonce, client_nonce)
            if self._secret is not None and not frames.mac_matches(expected, mac):
                log.warning("a forward connection did not prove LLOG_CLUSTER_SECRET; closed")
                await peer.send(frames.refused(frames.CONNECTION, Unauthenticated(
                    "the connection did not prove LLOG_CLUSTER_SECRET")))
                return False
            await peer.send(frames.welcome(frames.mac(self._secret, "server", nonce,
                                                      client_nonce)))
            return True
        return False  # silent for too long

    async def _read_appends(self, peer: _Peer, reader: asyncio.StreamReader,
                            tg: anyio.abc.TaskGroup) -> None:
        """Hand each APPEND to a task until the stream ends, the server closes, or the
        client breaks the protocol (refused; the APPENDs read before are answered)."""
        slots = anyio.Semaphore(MAX_INFLIGHT_FRAMES)
        while True:
            await slots.acquire()
            try:
                got = await frames.read_frame(reader, self._max_frame)
                if got is None:
                    return
                if got.type is not FrameType.APPEND:
                    raise FrameError(f"a {got.type.name} frame where an APPEND was expected")
                head = frames.parse_append_head(got.payload)
            except FrameError as exc:
                log.warning("a forward connection broke the protocol; closed: %s", exc)
                error = (PayloadTooLarge if isinstance(exc, FrameTooLarge)
                         else InvalidRequest)(str(exc))
                await peer.send(frames.refused(frames.CONNECTION, error))
                return
            except OSError:
                return  # the connection is gone; the APPENDs read are still answered
            peer.inflight += 1
            tg.start_soon(self._append, peer, slots, head, got.payload)

    async def _append(self, peer: _Peer, slots: anyio.Semaphore, head: AppendHead,
                      payload: bytes) -> None:
        take_by = time.monotonic() + head.deadline_ms / 1000
        try:
            await peer.send(await self._answer(head, take_by, payload))
        finally:
            peer.inflight -= 1
            slots.release()
            if peer.inflight == 0 and self._closing.is_set():
                peer.reading.cancel()

    async def _answer(self, head: AppendHead, take_by: float, payload: bytes
                      ) -> frames.Parts:
        frame_id = head.frame_id
        try:
            groups = frames.parse_append_groups(payload, head)
        except LlogError as exc:  # InvalidRequest, PayloadTooLarge: refused unread
            return frames.refused(frame_id, exc)
        if self._closing.is_set():
            self._received("refused", len(groups))
            return frames.refused(frame_id, ShuttingDown(
                "this broker is shutting down; append elsewhere"))
        try:
            outcomes = await self._handler(groups, take_by, head.fence,
                                           head.window_ms / 1000)
            if len(outcomes) != len(groups):
                raise RuntimeError(f"{len(outcomes)} outcomes for {len(groups)} groups")
        except ForwardExpired:
            self._received("expired", len(groups))
            return frames.expired(frame_id)
        except LlogError as exc:
            if not exc.maybe_written:  # refused as a whole before anything was written
                self._received("refused", len(groups))
                return frames.refused(frame_id, exc)
            outcomes = [exc] * len(groups)
        except Exception as exc:
            log.exception("appending forwarded records failed unexpectedly")
            outcomes = [CommitInDoubt(f"appending the forwarded records failed "
                                      f"unexpectedly: {exc!r}")] * len(groups)
        expired = sum(isinstance(o, ForwardExpired) for o in outcomes)
        if expired == len(groups):
            self._received("expired", expired)
            return frames.expired(frame_id)
        self._received("expired", expired)
        self._received("appended", len(groups) - expired)
        return frames.results(frame_id, groups, outcomes)

    def _received(self, outcome: ReceivedOutcome, groups: int) -> None:
        if self._metrics is not None and groups:
            self._metrics.received(outcome, groups)
