"""The lean S3 path's requests on connections of its own: GETs, each body read by the
kernel straight into the buffers that keep it, and PUTs, each body written from the
parts it is made of.

aiohttp (under uvloop) receives a body as a series of new ``bytes`` of up to 256 KiB,
each copied out of the event loop's read buffer and passed through its stream reader;
the reader of a compacted blob then cuts its chunks out of those pieces: three copies of
every byte, and Python work per piece.

Here a connection is an :class:`asyncio.BufferedProtocol`: the event loop asks it where
the bytes it reads go, and it hands out the part of the answer's buffer that comes next.
A body is copied once, from the socket. Asked for spans, each span gets a buffer of its
own (a chunk kept in a cache holds nothing else) and bytes between spans land in a
scratch buffer. What that saves per GET, measured: the docstring of
``app/stores/s3/store.py``.

A PUT's body goes to the transport as its parts (a WAL object's header and its slices,
views into the request bodies they came in): the event loop writes them with one
``writev`` and keeps what the socket did not take, so they are never joined into one
buffer first.

It speaks as much HTTP/1.1 as reading and writing S3 objects needs: one request at a
time on a connection, kept alive and reused. A successful answer must carry
``Content-Length`` (S3 sends it with every answer). Any other answer, an error, is read
up to :data:`MAX_ERROR_BODY` bytes for its code, and its connection closed.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import anyio

from app.stores.s3.body import Body, body_size

MAX_HEAD = 64 * 1024
MAX_ERROR_BODY = 64 * 1024
_SCRATCH = 64 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: |$)")
# The end of a chunked error body (trailers are not expected), or of the error itself.
_ERROR_ENDS = (b"0\r\n\r\n", b"</Error>")


class WireError(ConnectionError):
    """The connection broke, or the answer was not one this client reads: retried as
    a failed connection is."""


@dataclass(slots=True)
class Answer:
    status: int
    # A success: one buffer per span asked for, or the whole body in one when no spans
    # were asked for or the body is not as long as they say. An error: its first bytes.
    buffers: list[bytearray]
    length: int  # the body's length (Content-Length)


@dataclass(slots=True)
class _Segment:
    """Where the next ``size`` bytes of a body go: a buffer of the answer, or (``None``)
    the scratch buffer, for bytes between spans."""

    buffer: bytearray | None
    size: int


class _Connection(asyncio.BufferedProtocol):
    """One kept-alive connection, reading one answer at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._scratch = bytearray(_SCRATCH)
        # Always handed out as a view: asyncio's TLS transport fills what get_buffer
        # gave it in slices, and a slice of a bytearray is a copy, so every byte past
        # its first TLS record would be lost (CPython issue 156275).
        self._scratch_view = memoryview(self._scratch)
        self._waiter: asyncio.Future[Answer] | None = None
        self._ok: frozenset[int] = frozenset()
        self._spans: Sequence[tuple[int, int]] = ()
        self._head = bytearray()
        self._status = 0
        self._keep = False
        self._length = 0
        # Reading a successful body: the segments left and the bytes in the first.
        self._segments: list[_Segment] = []
        self._filled = 0
        self._buffers: list[bytearray] = []
        # Reading an error: its bytes so far, and whether its end is a chunked one.
        self._error: bytearray | None = None
        self._chunked = False
        self.received = 0  # bytes of the current answer so far
        self._request_size = 0  # bytes of the current request
        self.lost = False

    # -- what callers use ------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return (not self.lost and self._waiter is None and self._transport is not None
                and not self._transport.is_closing())

    def progress(self) -> int:
        """Bytes of the current exchange so far: of the request, those the transport
        handed to the kernel, and of the answer, those read. While it grows the
        exchange is not stalled. Over plain TCP a request's bytes leave the transport
        as the socket takes them (a socket buffer's worth ahead of the peer's reading);
        a TLS transport takes a whole request at once, encrypting it, so over TLS the
        read timeout bounds an upload as a whole, as aiohttp's did."""
        transport = self._transport
        unsent = 0 if transport is None else transport.get_write_buffer_size()
        return self.received + self._request_size - unsent

    async def exchange(self, request: Body, ok: frozenset[int],
                       spans: Sequence[tuple[int, int]], read_timeout_s: float) -> Answer:
        """Send ``request`` and read its answer; :class:`TimeoutError` when the
        exchange makes no :meth:`progress` for ``read_timeout_s`` (a long answer on a
        slow link is not cut short, nor, over plain TCP, a long request). Cancelled or
        failed midway, the connection is closed, and aborted with bytes of the request
        unsent: what is left of the answer would come first on it."""
        assert self._waiter is None
        self.received = 0
        if self.lost or self._transport is None or self._transport.is_closing():
            raise WireError("the connection closed before the request was sent")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer] = loop.create_future()
        self._waiter = waiter
        self._ok, self._spans = ok, spans
        self._head, self._error, self._segments, self._buffers = bytearray(), None, [], []
        try:
            # A request's parts in order (head, then body), or its bytes.
            self._request_size = body_size(request)
            if isinstance(request, bytes | bytearray | memoryview):
                self._transport.write(request)
            else:
                self._transport.writelines(request)
        except BaseException:
            self._waiter = None
            self.close()
            raise
        watch = _ReadWatch(self, waiter, read_timeout_s)
        try:
            return await waiter
        except BaseException:
            self.close()
            raise
        finally:
            watch.cancel()
            self._waiter = None

    def close(self) -> None:
        transport = self._transport
        if transport is not None:
            # With bytes of a request still unsent (a PUT that failed or was answered
            # early), closing would wait for them to go, for as long as the peer keeps
            # the connection open: aborted instead, dropping them and the socket now.
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
        self.lost = True

    # -- the event loop's side ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not derive from asyncio.Transport).
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._segments:
            segment = self._segments[0]
            if segment.buffer is not None:
                return memoryview(segment.buffer)[self._filled:]
            return self._scratch_view[:min(segment.size - self._filled, _SCRATCH)]
        return self._scratch_view

    def buffer_updated(self, nbytes: int) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():  # bytes no request asked for: out of step
            self.close()
            return
        self.received += nbytes
        try:
            if self._segments:
                self._advance(nbytes)
            elif self._error is not None:
                self._take_error(self._scratch_view[:nbytes])
            else:
                self._take_head(self._scratch_view[:nbytes])
        except WireError as exc:
            self.close()
            if not waiter.done():
                waiter.set_exception(exc)

    def eof_received(self) -> bool:
        return False  # the transport closes itself, then connection_lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._error is not None:  # an error body may end with the connection
            waiter.set_result(self._error_answer())
            return
        waiter.set_exception(WireError(
            f"the connection closed after {self.received} bytes of the answer"
            + (f": {exc}" if exc else "")))

    # -- reading an answer -------------------------------------------------------------

    def _take_head(self, data: memoryview) -> None:
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HEAD:
                raise WireError(f"an answer's head is over {MAX_HEAD} bytes")
            return
        status, headers, keep = _parse_head(bytes(self._head[:end]))
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): HTTP lets a server
            # send them unasked; the final answer follows.
            after = bytes(self._head[end + 4:])
            self._head = bytearray()
            if after:
                self._take_head(memoryview(after))
            return
        rest = memoryview(self._head)[end + 4:]
        self._status = status
        self._keep = keep
        length = headers.get("content-length")
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if status not in self._ok:
            self._length = int(length) if length is not None and not self._chunked else -1
            self._error = bytearray()
            self._take_error(rest)
            return
        if length is None or self._chunked:
            raise WireError(f"an answer ({status}) without Content-Length")
        self._length = int(length)
        self._lay_out(self._length)
        self._feed(rest)

    def _lay_out(self, length: int) -> None:
        """The segments of a body of ``length`` bytes: one buffer per span when the
        body is as long as the spans say, else the whole body in one. Longer than
        the spans (than the range asked for) it is refused before anything is kept."""
        spans = self._spans
        if spans and length > spans[-1][1]:
            raise WireError(f"an answer of {length} bytes to a request for "
                            f"{spans[-1][1]}")
        if not spans or spans[-1][1] != length:
            self._buffers = [bytearray(length)]
            self._segments = [_Segment(self._buffers[0], length)] if length else []
        else:
            at = 0
            for offset, end in spans:
                if offset > at:
                    self._segments.append(_Segment(None, offset - at))
                buffer = bytearray(end - offset)
                self._buffers.append(buffer)
                if end > offset:
                    self._segments.append(_Segment(buffer, end - offset))
                at = end
        self._filled = 0
        if not self._segments:
            self._finish()

    def _feed(self, data: memoryview) -> None:
        """Bytes of the body that arrived with its head: copied into place."""
        while data:
            if not self._segments:
                raise WireError("more bytes than the answer's Content-Length")
            segment = self._segments[0]
            take = min(len(data), segment.size - self._filled)
            if segment.buffer is not None:
                segment.buffer[self._filled:self._filled + take] = data[:take]
            data = data[take:]
            self._advance(take)

    def _advance(self, nbytes: int) -> None:
        """``nbytes`` more of the body are in place."""
        self._filled += nbytes
        if self._filled >= self._segments[0].size:
            self._segments.pop(0)
            self._filled = 0
            if not self._segments:
                self._finish()

    def _finish(self) -> None:
        assert self._waiter is not None
        if not self._keep:
            self.close()
        answer = Answer(self._status, self._buffers, self._length)
        # An idle connection must not pin the last body it read (megabytes each, up to
        # a pool's worth of them) beyond what the caches bound.
        self._buffers, self._segments = [], []
        self._waiter.set_result(answer)

    def _take_error(self, data: memoryview) -> None:
        assert self._error is not None and self._waiter is not None
        self._error += data[:MAX_ERROR_BODY - len(self._error)]
        if (len(self._error) >= MAX_ERROR_BODY
                or (self._length >= 0 and len(self._error) >= self._length)
                or (self._chunked and self._error.endswith(_ERROR_ENDS[0]))
                or _ERROR_ENDS[1] in self._error):
            self.close()  # the rest of a long error is not read: the connection goes
            self._waiter.set_result(self._error_answer())

    def _error_answer(self) -> Answer:
        assert self._error is not None
        error, self._error = self._error, bytearray()  # as _finish: kept by no one here
        return Answer(self._status, [error], len(error))


class _ReadWatch:
    """Fails an exchange with :class:`TimeoutError` once it made no progress for a
    whole period: no byte of its request taken by the socket, none of its answer read
    (aiohttp's ``sock_read``, counting the upload too). One timer per period, not one
    per read."""

    def __init__(self, conn: _Connection, waiter: asyncio.Future[Answer],
                 period_s: float) -> None:
        self._conn, self._waiter, self._period_s = conn, waiter, period_s
        self._seen = conn.progress()  # the exchange's progress at the last check
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(period_s, self._check)

    def _check(self) -> None:
        if self._waiter.done():
            return
        progress = self._conn.progress()
        if progress == self._seen:
            self._waiter.set_exception(TimeoutError(
                f"no progress of the S3 exchange for {self._period_s} s "
                f"({self._conn.received} bytes of the answer received)"))
            return
        self._seen = progress
        self._timer = self._loop.call_later(self._period_s, self._check)

    def cancel(self) -> None:
        self._timer.cancel()


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    """Status, headers (names in lower case), and whether the connection stays open."""
    lines = head.split(b"\r\n")
    matched = _STATUS_LINE.match(lines[0])
    if matched is None:
        raise WireError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise WireError(f"a malformed header line: {line[:80]!r}")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    length = headers.get("content-length")
    if length is not None and not (length.isascii() and length.isdigit()):
        raise WireError(f"a malformed Content-Length: {length[:40]!r}")
    tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
    keep = "close" not in tokens if matched.group(1) == b"1" else "keep-alive" in tokens
    return int(matched.group(2)), headers, keep


class WirePool:
    """Kept-alive connections to one server, at most ``limit`` at a time. A connection
    is opened within ``connect_timeout_s``; an answer fails when no byte of it comes
    for ``read_timeout_s``."""

    def __init__(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None,
                 limit: int, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._host, self._port, self._ssl = host, port, ssl_context
        self._slots = anyio.Semaphore(limit)
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._idle: list[_Connection] = []
        self._closed = False

    async def exchange(self, request: Body, ok: frozenset[int],
                       spans: Sequence[tuple[int, int]] = ()) -> Answer:
        """``request`` on a connection of the pool. A kept connection the server
        closed while idle is found out by the request it fails before any answer: that
        request is sent again once, on a new connection."""
        if self._closed:
            raise WireError("the S3 connection pool is closed")
        async with self._slots:
            conn = self._reusable()
            if conn is not None:
                try:
                    answer = await conn.exchange(request, ok, spans, self._read_timeout_s)
                except WireError:
                    if conn.received:
                        raise
                    conn = None
            if conn is None:
                conn = await self._connect()
                answer = await conn.exchange(request, ok, spans, self._read_timeout_s)
            if conn.usable and not self._closed:
                self._idle.append(conn)
            else:
                conn.close()
            return answer

    def _reusable(self) -> _Connection | None:
        while self._idle:  # the most recently used first: the least likely closed
            conn = self._idle.pop()
            if conn.usable:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        with anyio.fail_after(self._connect_timeout_s):
            _, conn = await loop.create_connection(
                _Connection, self._host, self._port, ssl=self._ssl,
                server_hostname=self._host if self._ssl is not None else None)
        return conn

    def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()
