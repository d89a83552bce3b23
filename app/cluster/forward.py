"""Forwarding appends to another broker: the client side, and what its answers mean.

A :class:`ForwardClient` keeps one connection to one peer (opened on first use, opened
again after it breaks) and multiplexes APPEND frames over it by id. Every append ends
one of three ways, and the difference is what keeps a fallback safe:

- outcomes: the peer's log answered each group (an :class:`AppendResult` or the
  :class:`~app.errors.LlogError` its append ended with);
- :class:`ForwardNotWritten`: the peer certainly did not write the groups (it could not
  be reached, it refused them, no flush took them in time, or the frame was never handed
  to the connection), so they may be appended elsewhere;
- :class:`ForwardUnknown`: the frame was sent and no verdict came back (the connection
  broke, or the answer did not come in time): the groups may have been written, until
  the frame's fence (:mod:`app.cluster.fences`, which the error carries) says otherwise.
  A frame that timed out keeps its place on the connection for a while
  (:class:`LateAnswer`): the peer's verdict, should it still come, settles the groups.

The server side is :class:`~app.cluster.forward_server.ForwardServer`; the frames are in
app/cluster/frames.py (docs/protocol.md, Forwarding between brokers).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio

from app.clock import wall_ms
from app.cluster import frames
from app.cluster.fences import ANSWER_MARGIN_S, Fence
from app.cluster.forward_metrics import ForwardMetrics, FrameOutcome
from app.cluster.forward_server import ForwardServer
from app.cluster.frames import Frame, FrameError, FrameType
from app.errors import ForwardExpired
from app.storage.appends import AppendGroup, AppendOutcome

__all__ = ["ForwardClient", "ForwardMetrics", "ForwardNotWritten", "ForwardServer",
           "ForwardUnknown", "LateAnswer"]

log = logging.getLogger(__name__)

NotWrittenReason = Literal["unreachable", "refused", "expired", "closed"]
UnknownReason = Literal["broken", "timeout", "closed"]


class ForwardNotWritten(Exception):
    """The peer did not write the groups: they may be appended elsewhere. ``reason``:
    ``unreachable`` (no connection, or the handshake failed), ``refused`` (the peer
    refused the frame, or it was too large to send), ``expired`` (no flush took it by its
    deadline), ``closed`` (this client was closed before sending it)."""

    def __init__(self, reason: NotWrittenReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: NotWrittenReason = reason
        self.detail = detail


class ForwardUnknown(Exception):
    """The frame was sent and no verdict came back: the groups may have been written.
    ``reason``: ``broken`` (the connection ended), ``timeout`` (no answer within the
    deadline plus the answer timeout), ``closed`` (this client was closed). ``fence``:
    the frame's, which settles whether the peer may still write it; ``window_s``: its
    commit window (once the fence is found taken, the peer sends no commit of the frame
    expecting a version it read later than that); ``late``: where the peer's answer may
    still arrive (a ``timeout`` on a connection that is still up), else None."""

    def __init__(self, reason: UnknownReason, detail: str, fence: Fence | None = None,
                 window_s: float = 0.0, late: LateAnswer | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: UnknownReason = reason
        self.detail = detail
        self.fence = fence
        self.window_s = window_s
        self.late = late


class LateAnswer:
    """The peer's answer to a frame that timed out, should it still come.

    A peer that is slow, not dead (its store paused), commits the frame and answers it
    after the forwarder stopped waiting; the forwarder then waits out the frame's commit
    window anyway before it may answer in doubt (app/cluster/router.py). Meanwhile the
    frame keeps its place among the connection's answers, so a late answer settles its
    groups for certain instead: a client told "in doubt" sends again, and if by then
    more keyed appends than the partition remembers came after the first copy, the
    resend is a second copy. The place is given up at :meth:`keep_until`'s time, at
    :meth:`release`, or when the connection ends; until the forwarder says, after
    ``keep_s`` (longer than it can take to say: ``ForwardClient``'s ``claim_budget_s``).
    """

    def __init__(self, future: asyncio.Future[Frame], groups: Sequence[AppendGroup],
                 release: Callable[[], None], distrust: Callable[[str], None],
                 keep_s: float, metrics: ForwardMetrics | None) -> None:
        self._future = future
        self._groups = groups
        self._release = release
        self._distrust = distrust
        self._metrics = metrics
        self._outcomes: list[AppendOutcome] | None = None
        self._timer = asyncio.get_running_loop().call_later(keep_s, release)

    def keep_until(self, when: float) -> None:
        """Keep waiting for the answer until ``when`` (``time.monotonic()``)."""
        self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(
            max(0.0, when - time.monotonic()), self._release)

    def release(self) -> None:
        """Stop waiting, now: an answer from now on is dropped."""
        self._timer.cancel()
        self._release()

    async def outcomes(self, until: float) -> list[AppendOutcome] | None:
        """The peer's outcome of each group if its answer comes by ``until``
        (``time.monotonic()``; at once if it is not later): its results, or every group
        ``ForwardExpired`` when it answered the whole frame expired or refused (not
        written, as when that answer comes in time). None if no answer comes (the
        connection ended, or the place was given up)."""
        future = self._future
        delay = until - time.monotonic()
        if not future.done() and delay > 0:
            await asyncio.wait([future], timeout=delay)  # never cancels the future
        if not future.done() or future.cancelled() or future.exception() is not None:
            return None
        if self._outcomes is None:
            self._outcomes = self._read(future.result())
            if self._outcomes is not None and self._metrics is not None:
                self._metrics.frame("late")
        return self._outcomes

    def _read(self, answer: Frame) -> list[AppendOutcome] | None:
        if answer.type is FrameType.EXPIRED:
            why = "the receiver answered late that no flush took the records in time"
        elif answer.type is FrameType.REFUSED:
            why = f"the receiver refused them late: {frames.parse_refused(answer.payload)}"
        else:
            try:
                return frames.parse_results(answer.payload, self._groups)
            except FrameError as exc:  # as on time: trust nothing more of the peer
                self._distrust(f"malformed late results: {exc}")
                return None
        return [ForwardExpired(why) for _ in self._groups]


@dataclass(eq=False)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    # Frames handed to the connection and not answered yet, by id.
    pending: dict[int, asyncio.Future[Frame]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    closed: bool = False

    def usable(self) -> bool:
        return not self.closed and not self.writer.transport.is_closing()


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as its parts."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r}: expected host:port")
    return host.strip("[]"), int(port)


class ForwardClient:
    """Appends forwarded to the peer listening at ``address`` (its forward listener).

    ``deadline_s`` is how long the peer may keep the groups buffered before a flush
    takes them (past it they are answered expired, unwritten); an answer that has not
    come ``answer_timeout_s`` after that makes the outcome unknown. ``commit_window_s``
    is each frame's commit window (:mod:`app.cluster.fences`); by default that wait,
    so the receiver refuses no commit its forwarder still waits for, and less for
    groups whose produce deadline comes first (:meth:`_window_for`). Each
    frame's fence token is ``{fence_prefix}.{frame id}``: the prefix must be unique to
    this client (its member and incarnation), and ``clock_ms`` is the wall clock fences
    are dated by. ``claim_budget_s``: how long a claim of a frame's fence may take
    (:func:`~app.cluster.fences.claim_budget_for`), during which a frame that timed out
    keeps its place for a late answer (:class:`LateAnswer`).
    """

    def __init__(self, address: str, *, secret: str | None, deadline_s: float,
                 answer_timeout_s: float, commit_window_s: float | None = None,
                 max_frame_bytes: int = frames.DEFAULT_MAX_FRAME_BYTES,
                 connect_timeout_s: float | None = None,
                 metrics: ForwardMetrics | None = None, fence_prefix: str | None = None,
                 clock_ms: Callable[[], int] = wall_ms, claim_budget_s: float = 0.0
                 ) -> None:
        self.address = address
        self._host, self._port = split_address(address)
        self._secret = secret
        self._deadline_ms = max(0, round(deadline_s * 1000))
        self._wait_s = deadline_s + answer_timeout_s
        window_s = self._wait_s if commit_window_s is None else commit_window_s
        self._window_ms = max(0, round(window_s * 1000))
        self._connect_timeout_s = connect_timeout_s or answer_timeout_s
        self._max_frame = max_frame_bytes
        self._metrics = metrics
        self._ids = itertools.count(1)
        self._fence_prefix = fence_prefix or uuid.uuid4().hex
        self._clock_ms = clock_ms
        self._claim_budget_s = claim_budget_s
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """The peer's outcome of each group, in order; or :class:`ForwardNotWritten`,
        or :class:`ForwardUnknown` (see the module's docstring)."""
        if not groups:
            return []
        frame_id = next(self._ids)
        fence = Fence(self._clock_ms(), f"{self._fence_prefix}.{frame_id}")
        window_ms = self._window_for(groups)
        parts = frames.append(frame_id, self._deadline_ms, window_ms, fence, groups)
        if frames.frame_size(parts) > self._max_frame:
            self._count("refused")
            raise ForwardNotWritten("refused", f"a frame of {frames.frame_size(parts)} "
                                    f"bytes; the limit is {self._max_frame}")
        conn = await self._connection()
        try:
            answer = await self._exchange(conn, frame_id, parts, groups)
        except ForwardUnknown as exc:
            exc.fence, exc.window_s = fence, window_ms / 1000
            raise
        if answer.type is FrameType.RESULTS:
            try:
                outcomes = frames.parse_results(answer.payload, groups)
            except FrameError as exc:  # a peer that answers nonsense: trust nothing more
                self._drop(conn, f"{self.address} sent malformed results: {exc}")
                self._count("broken")
                raise ForwardUnknown("broken", str(exc), fence, window_ms / 1000) from None
            self._count("results")
            return outcomes
        if answer.type is FrameType.EXPIRED:
            self._count("expired")
            raise ForwardNotWritten("expired", f"{self.address}: no flush took the records "
                                    "before their deadline")
        self._count("refused")
        raise ForwardNotWritten("refused",
                                f"{self.address}: {frames.parse_refused(answer.payload)}")

    def _window_for(self, groups: Sequence[AppendGroup]) -> int:
        """The frame's commit window (ms): this client's, cut short so the peer commits
        no group with a control version read after the group's own ``commit_by`` here
        (its produce request's deadline). The peer counts the window from its claim,
        which comes after this frame is sent by the network's delay, plus at most the
        peer's buffering deadline: both are taken off, the network's as
        :data:`~app.cluster.fences.ANSWER_MARGIN_S`, and so is the connect and
        handshake the frame may still wait for (no connection is up). A window of 0
        has the peer answer the frame expired, unwritten, and this broker append it
        itself."""
        deadlines = [g.commit_by for g in groups if g.commit_by is not None]
        if not deadlines:
            return self._window_ms
        conn = self._conn
        connect_s = 0.0 if conn is not None and conn.usable() else self._connect_timeout_s
        left_s = (min(deadlines) - time.monotonic() - self._deadline_ms / 1000
                  - ANSWER_MARGIN_S - connect_s)
        return max(0, min(self._window_ms, math.floor(left_s * 1000)))

    async def _exchange(self, conn: _Connection, frame_id: int, parts: frames.Parts,
                        groups: Sequence[AppendGroup]) -> Frame:
        """Send one APPEND and wait for its answer."""
        if self._closed:
            raise ForwardNotWritten("closed", "the forward client is closed")
        if not conn.usable():
            self._count("unreachable")
            raise ForwardNotWritten("unreachable", f"the connection to {self.address} "
                                    "closed before the frame was sent")
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        # A caller cancelled while its frame fails never reads the failure: mark it read.
        future.add_done_callback(_retrieve)
        conn.pending[frame_id] = future
        # From here on the peer may read the whole frame: any failure is "unknown".
        conn.writer.writelines(parts)
        sent = time.monotonic()
        late: LateAnswer | None = None
        try:
            with anyio.fail_after(self._wait_s):
                await conn.writer.drain()
                # Shielded: a timeout must leave the future for a late answer to fill.
                answer = await asyncio.shield(future)
        except TimeoutError:
            self._count("timeout")
            if conn.usable():
                late = self._late_answer(conn, frame_id, future, groups)
            raise ForwardUnknown("timeout", f"{self.address} did not answer within "
                                 f"{self._wait_s:.3f} s", late=late) from None
        except ConnectionError as exc:
            self._drop(conn, f"the connection to {self.address} broke: {exc}")
            self._count("broken")
            raise ForwardUnknown("broken", str(exc)) from None
        except ForwardUnknown as exc:
            self._count(exc.reason)
            raise
        finally:
            if late is None:
                conn.pending.pop(frame_id, None)
        if self._metrics is not None:
            self._metrics.answered(time.monotonic() - sent)
        return answer

    def _late_answer(self, conn: _Connection, frame_id: int,
                     future: asyncio.Future[Frame], groups: Sequence[AppendGroup]
                     ) -> LateAnswer:
        """The frame keeps its place among ``conn``'s answers (:class:`LateAnswer`)."""
        def release() -> None:
            if conn.pending.get(frame_id) is future:
                del conn.pending[frame_id]
            future.cancel()  # its waiters stop waiting

        def distrust(why: str) -> None:
            self._drop(conn, f"{self.address} sent {why}")

        # Until the forwarder says how long (once its claim of the fence is over), with
        # a minute to spare: no shorter than the claim may last, and not forever.
        keep_s = self._claim_budget_s + 60.0
        return LateAnswer(future, groups, release, distrust, keep_s, self._metrics)

    async def _connection(self) -> _Connection:
        conn = self._conn
        if conn is not None and conn.usable():
            return conn
        async with self._connecting:  # appends arriving together share one connect
            if self._closed:
                raise ForwardNotWritten("closed", "the forward client is closed")
            conn = self._conn
            if conn is not None and conn.usable():
                return conn
            try:
                conn = await self._connect()
            # ValueError, OverflowError: an address no socket can reach (a member record
            # read from Oxia names a port out of range or a host that does not encode);
            # nothing was sent, as for a refused connection.
            except (OSError, TimeoutError, FrameError, asyncio.IncompleteReadError,
                    ValueError, OverflowError) as exc:
                if isinstance(exc, frames.ProtocolMismatch):
                    log.warning("not forwarding to %s: %s", self.address, exc)
                self._count("unreachable")
                raise ForwardNotWritten("unreachable", f"{self.address}: {exc}") from None
            conn.task = asyncio.create_task(self._read_answers(conn),
                                            name=f"forward answers from {self.address}")
            self._conn = conn
            return conn

    async def _connect(self) -> _Connection:
        """A connection that has passed the handshake (both sides proved the secret)."""
        with anyio.fail_after(self._connect_timeout_s):
            reader, writer = await asyncio.open_connection(self._host, self._port)
            try:
                hello = await frames.read_frame(reader, frames.NONCE_BYTES + 2)
                if hello is None or hello.type is not FrameType.HELLO:
                    raise FrameError(_unexpected(hello, "HELLO"))
                server_nonce = frames.parse_hello(hello.payload)
                nonce = os.urandom(frames.NONCE_BYTES)
                writer.writelines(frames.auth(nonce, frames.mac(
                    self._secret, "client", server_nonce, nonce)))
                await writer.drain()
                answer = await frames.read_frame(reader, 4096)
                if answer is not None and answer.type is FrameType.REFUSED:
                    raise FrameError(f"refused: {frames.parse_refused(answer.payload)}")
                if answer is None or answer.type is not FrameType.WELCOME:
                    raise FrameError(_unexpected(answer, "WELCOME"))
                expected = frames.mac(self._secret, "server", server_nonce, nonce)
                if not frames.mac_matches(expected, answer.payload):
                    raise FrameError("the peer did not prove LLOG_CLUSTER_SECRET")
            except BaseException:
                writer.transport.abort()
                raise
        return _Connection(reader, writer)

    async def _read_answers(self, conn: _Connection) -> None:
        """Hand each answer to the frame it is for, until the connection ends; then
        fail every frame still waiting (none is left stranded)."""
        reason = f"{self.address} closed the connection"
        try:
            while True:
                answer = await frames.read_frame(conn.reader, self._max_frame)
                if answer is None:
                    break
                if answer.type not in (FrameType.RESULTS, FrameType.REFUSED,
                                       FrameType.EXPIRED):
                    raise FrameError(_unexpected(answer, "an answer"))
                frame_id = frames.frame_id(answer.payload)
                if frame_id == frames.CONNECTION:
                    reason = (f"{self.address} refused the connection: "
                              f"{frames.parse_refused(answer.payload)}")
                    break
                future = conn.pending.get(frame_id)
                if future is not None and not future.done():
                    future.set_result(answer)  # a timed-out frame's: its LateAnswer's
                # else: an answer after its frame gave up its place: it stays unknown
        except (FrameError, OSError) as exc:
            reason = f"the connection to {self.address} failed: {exc}"
        except Exception as exc:
            log.exception("reading answers from %s failed", self.address)
            reason = f"reading answers from {self.address} failed: {exc!r}"
        except asyncio.CancelledError:
            reason = "the forward client was closed"
            raise
        finally:
            self._drop(conn, reason)

    def _drop(self, conn: _Connection, reason: str) -> None:
        """Close ``conn`` and fail every frame it carried as unknown."""
        if not conn.closed:
            conn.closed = True
            conn.writer.transport.abort()
            unanswered = sum(not future.done() for future in conn.pending.values())
            if unanswered:
                log.warning("forwarding to %s: %d frame(s) without an answer: %s",
                            self.address, unanswered, reason)
        unknown: UnknownReason = "closed" if self._closed else "broken"
        for future in conn.pending.values():
            if not future.done():
                future.set_exception(ForwardUnknown(unknown, reason))
        if self._conn is conn:
            self._conn = None

    async def aclose(self) -> None:
        """Close the connection; frames still waiting end :class:`ForwardUnknown`, and
        later appends :class:`ForwardNotWritten` (``closed``)."""
        self._closed = True
        conn = self._conn
        if conn is None:
            return
        self._drop(conn, "the forward client was closed")
        if conn.task is not None:
            conn.task.cancel()
            await asyncio.wait([conn.task])

    def _count(self, outcome: FrameOutcome) -> None:
        if self._metrics is not None:
            self._metrics.frame(outcome)


def _retrieve(future: asyncio.Future[Frame]) -> None:
    if not future.cancelled():
        future.exception()


def _unexpected(got: Frame | None, wanted: str) -> str:
    return f"expected {wanted}, got " + ("the end of the stream" if got is None
                                         else got.type.name)
