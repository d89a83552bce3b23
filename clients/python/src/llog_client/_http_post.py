"""The producer's requests: an HTTP/1.1 ``POST`` on a kept-alive connection, written
and read in a few steps on a non-blocking socket (anyio waits for it to be ready, so
on asyncio and trio alike).

Why not httpx, which the rest of the client uses: a produce request is the same small
head and one large body many times a second, and httpx's layers (a request model,
auth and redirect hooks, a connection pool with its own state machine, h11's events)
cost the producer's thread about as much CPU again as writing the body to the socket
and reading the short answer. Here a request is one head built from a template, head
and body given to the socket as they are (the body, MiBs, is not copied into a
transport's buffer, as asyncio's is with what the socket does not take at once),
and an answer read by ``Content-Length`` (or chunked, or to the connection's close).
Only plain ``http://`` brokers are posted to this way; ``https`` (and any
``transport=`` given, for tests) goes through httpx as before.

Failures are told apart as the sender needs: :class:`NotSent` when no byte of the
request can have reached the broker (the connection could not be made), any other
:class:`PostFailed` when it may have (the broker may have written the records; a
retry under the same idempotency keys is safe either way).
"""

from __future__ import annotations

import errno
import os
import socket
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import anyio

_HEAD_END = b"\r\n\r\n"
MAX_HEAD = 64 * 1024
# A produce answer holds one short result per entry (at most 1,000 of them): far less.
MAX_ANSWER = 16 * 1024 * 1024
# Connections kept per broker: the producer has max_in_flight requests at most.
MAX_IDLE = 64
_READ = 64 * 1024
# What a broken exchange raises (ValueError: an answer this module cannot read).
_FAILURES = (OSError, EOFError, TimeoutError, ValueError)
# How long an answer is waited for after the broker stopped taking the body.
_EARLY_ANSWER_S = 2.0
_IN_PROGRESS = (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN)
_HAS_SENDMSG = hasattr(socket.socket, "sendmsg")


class PostFailed(OSError):
    """No answer: the request may have reached the broker."""


class NotSent(PostFailed):
    """No answer, and the request cannot have reached the broker."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class _Origin:
    host: str
    port: int
    idle: list[socket.socket] = field(default_factory=list)


class PostPool:
    """Kept-alive connections to each broker; ``headers`` go with every request."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        fields = {name: value for name, value in headers.items()
                  if name.lower() not in ("accept-encoding", "host")}
        self._fields = _head_fields(fields)  # raises ValueError for a field it cannot send
        self._origins: dict[str, _Origin] = {}
        self._direct: dict[str, bool] = {}  # by host and port: no proxy applies
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def handles(self, url: str) -> bool:
        """Whether ``url`` is one this pool posts to: plain HTTP, and no proxy of the
        environment (``HTTP_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``) applies to it,
        as it would through httpx."""
        if not url.startswith("http://"):
            return False
        netloc = urlsplit(url).netloc
        direct = self._direct.get(netloc)
        if direct is None:
            proxies = urllib.request.getproxies()
            direct = self._direct[netloc] = not (
                ("http" in proxies or "all" in proxies)
                and not urllib.request.proxy_bypass(netloc.rpartition("@")[2]))
        return direct

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   connect_s: float, read_s: float) -> Answer:
        """``body`` to ``url``; the answer. Raises :class:`NotSent` or
        :class:`PostFailed` (see the module)."""
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:  # built before any connection is taken: a head it cannot send sends nothing
            head = (f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\n{self._fields}"
                    f"content-length: {len(body)}\r\n{_head_fields(headers)}\r\n"
                    ).encode("latin-1")
            origin = self._origin(parts.netloc, parts.hostname, parts.port)
        except ValueError as exc:  # UnicodeError, a line break, a port out of range
            raise NotSent(f"the request cannot be sent: {exc}") from exc
        sock = self._idle(origin)
        if sock is None:
            sock = await self._connect(origin, connect_s)
        try:
            with anyio.fail_after(read_s):
                answer, reusable = await _exchange(sock, head, body)
        except BaseException as exc:
            sock.close()
            if isinstance(exc, _FAILURES):
                raise PostFailed(f"{type(exc).__name__}: {exc}" if str(exc)
                                 else type(exc).__name__) from exc
            raise
        if reusable and not self._closed and len(origin.idle) < MAX_IDLE:
            origin.idle.append(sock)
        else:
            sock.close()
        return answer

    def _origin(self, netloc: str, host: str | None, port: int | None) -> _Origin:
        origin = self._origins.get(netloc)
        if origin is None:
            origin = self._origins[netloc] = _Origin(host or "", port or 80)
        return origin

    @staticmethod
    def _idle(origin: _Origin) -> socket.socket | None:
        """A kept-alive connection the broker has not closed meanwhile (it would fail
        the request sent on it), newest first."""
        while origin.idle:
            sock = origin.idle.pop()
            if _quiet(sock):
                return sock
            sock.close()
        return None

    async def _connect(self, origin: _Origin, connect_s: float) -> socket.socket:
        if self._closed:
            raise NotSent("the producer's connections are closed")
        try:
            with anyio.fail_after(connect_s):
                return await _connect(origin.host, origin.port)
        except (OSError, TimeoutError) as exc:
            raise NotSent(f"connect to {origin.host}:{origin.port}: "
                          f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()


async def _connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking socket to one of ``host``'s addresses, in turn."""
    last: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in await anyio.getaddrinfo(
            host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            error = sock.connect_ex(address)
            if error in _IN_PROGRESS:
                await anyio.wait_writable(sock)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                raise OSError(error, os.strerror(error))
            return sock
        except OSError as exc:
            sock.close()
            last = exc
        except BaseException:
            sock.close()
            raise
    raise last


def _quiet(sock: socket.socket) -> bool:
    """Whether nothing (an end, an error, stray bytes) has come on an idle connection."""
    try:
        sock.recv(1, socket.MSG_PEEK)
        return False  # the broker closed it (b""), or sent what nobody asked for
    except BlockingIOError:
        return True
    except OSError:
        return False


async def _exchange(sock: socket.socket, head: bytes, body: bytes
                    ) -> tuple[Answer, bool]:
    """Send the request, read its answer. A broker may answer before it has read the
    whole body (a 413 from the head alone) and close: that answer, when it came, is the
    outcome, not the broken write."""
    try:
        await _send_all(sock, head, body)
    except OSError:
        with anyio.move_on_after(_EARLY_ANSWER_S):
            answer, _ = await _read_answer(sock)
            return answer, False
        raise
    return await _read_answer(sock)


async def _send_all(sock: socket.socket, head: bytes, body: bytes) -> None:
    """Head and body, as the socket takes them: never copied (``sendmsg`` of the two,
    then what is left of the body as a view of it)."""
    view = memoryview(body)
    done = 0
    total = len(head) + len(body)
    while done < total:
        try:
            if done >= len(head):
                done += sock.send(view[done - len(head):])
            elif _HAS_SENDMSG:
                done += sock.sendmsg([head[done:], view])
            else:
                done += sock.send(head[done:])
        except BlockingIOError:
            await anyio.wait_writable(sock)


async def _recv(sock: socket.socket) -> bytes:
    while True:
        try:
            data = sock.recv(_READ)
        except BlockingIOError:
            await anyio.wait_readable(sock)
            continue
        if not data:
            raise EOFError("the broker closed the connection")
        return data


async def _read_answer(sock: socket.socket) -> tuple[Answer, bool]:
    """The answer (after any interim 1xx), and whether the connection can carry another
    request."""
    buffer = bytearray()
    while True:
        while (end := buffer.find(_HEAD_END)) < 0:
            if len(buffer) > MAX_HEAD:
                raise ValueError("an answer's head over 64 KiB")
            buffer += await _recv(sock)
        if end > MAX_HEAD:
            raise ValueError("an answer's head over 64 KiB")
        status, version_11, headers = _parse_head(bytes(buffer[:end]))
        buffer = buffer[end + 4:]
        if not 100 <= status < 200:
            break
    reusable = version_11 and headers.get("connection", "").lower() != "close"
    if status in (204, 304):
        body, rest = b"", buffer
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body, rest = await _read_chunked(sock, buffer)
    elif (length := headers.get("content-length")) is not None:
        size = _number(length)
        if size > MAX_ANSWER:
            raise ValueError(f"an answer of {size} bytes")
        while len(buffer) < size:
            buffer += await _recv(sock)
        body, rest = bytes(buffer[:size]), buffer[size:]
    else:
        reusable = False
        body = bytes(await _read_to_end(sock, buffer))
        rest = bytearray()
    return Answer(status, headers, body), reusable and not rest


async def _read_chunked(sock: socket.socket, have: bytearray) -> tuple[bytes, bytearray]:
    """A chunked body, its trailers skipped; the bytes read past its end."""
    body = bytearray()
    while True:
        line, have = await _read_line(sock, have)
        size = _number(line.split(b";")[0].strip().decode("latin-1"), 16)
        if size == 0:
            while True:  # trailers, then an empty line
                line, have = await _read_line(sock, have)
                if not line:
                    return bytes(body), have
        if len(body) + size > MAX_ANSWER:
            raise ValueError("an answer over 16 MiB")
        while len(have) < size + 2:
            have += await _recv(sock)
        if have[size:size + 2] != b"\r\n":
            raise ValueError("a chunk not ended by CRLF")
        body += have[:size]
        have = have[size + 2:]


async def _read_line(sock: socket.socket, have: bytearray) -> tuple[bytes, bytearray]:
    while (end := have.find(b"\r\n")) < 0:
        if len(have) > 8192:
            raise ValueError("a line of a chunked body over 8 KiB")
        have += await _recv(sock)
    return bytes(have[:end]), have[end + 2:]


async def _read_to_end(sock: socket.socket, have: bytearray) -> bytearray:
    while True:
        try:
            have += await _recv(sock)
        except EOFError:
            return have
        if len(have) > MAX_ANSWER:
            raise ValueError("an answer over 16 MiB")


def _head_fields(headers: Mapping[str, str]) -> str:
    """Header lines; ValueError for a name or value that would break the head."""
    lines = []
    for name, value in headers.items():
        if not name or any(c in name for c in ":\r\n\0 ") or any(
                c in value for c in "\r\n\0"):
            raise ValueError(f"a header that cannot be sent: {name!r}")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


def _parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = _number(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"a header line without a colon: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return status, version == "HTTP/1.1", headers


def _number(text: str, base: int = 10) -> int:
    if not text or not text.isascii() or not text.isalnum():
        raise ValueError(f"not a number: {text[:40]!r}")
    value = int(text, base)
    if value < 0:
        raise ValueError(f"a negative length: {value}")
    return value
