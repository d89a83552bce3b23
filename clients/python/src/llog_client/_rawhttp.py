"""HTTP/1.1 requests over a plain TCP socket in as few system calls as can be: the
request in one ``send``, the answer's head peeked at and read in two or three, and a
body of known length in one ``recv(MSG_WAITALL)`` that waits in the kernel until all
of it has come.

Why: each system call lets go of the GIL and must take it back, and a thread that
wants the GIL back while another thread runs Python waits for that one to let go,
up to ``sys.getswitchinterval()`` (5 ms). The consumer's thread reads answers while
the program runs Python over the previous one: read 64 KiB at a time (as
``http.client`` does, some 50 calls for a 16 MiB answer), an answer took longer to
come than the program took to go through the last one, and the program waited. The
socket is blocking, with ``SO_RCVTIMEO``/``SO_SNDTIMEO`` for timeouts, since
``MSG_WAITALL`` does not wait on a socket in non-blocking mode (Python's own timeouts
use that mode).
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from collections.abc import Mapping

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024
_MAX_LINE = 256
# The largest answer body read: consume answers are bounded by the request's max_bytes
# (at most a few tens of MiB); a length beyond this is a broken or hostile peer, refused
# before anything is allocated for it.
MAX_BODY = 256 * 1024 * 1024
# Where the calls this module makes exist (Windows gives SO_RCVTIMEO in another form).
AVAILABLE = hasattr(socket, "MSG_WAITALL") and hasattr(socket, "MSG_PEEK") \
    and sys.platform != "win32"


class ProtocolError(OSError):
    """The answer is not HTTP/1.1 as this module reads it."""


class Closed(ProtocolError):
    """The broker closed the connection (a kept-alive one it had let go, or in the
    middle of an answer)."""


class Connection:
    def __init__(self, host: str, port: int, connect_s: float | None) -> None:
        self.sock = socket.create_connection((host, port), timeout=connect_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(None)  # blocking: see the module
        self._timeout: float | None = None
        self._deadline: float | None = None  # of the exchange under way
        self._host = f"{host}:{port}"

    def close(self) -> None:
        self.sock.close()

    def exchange(self, path: str, body: bytes, headers: Mapping[str, str],
                 timeout_s: float | None) -> tuple[int, dict[str, str], bytes, bool]:
        """POST ``body``: the status, the headers (lower-case names), the body, and
        whether the broker closes the connection after it."""
        # One deadline for the whole exchange: a peer that trickles a byte at a time
        # within each read's timeout does not hold the reader past it.
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._set_timeout(timeout_s)
        try:
            self.sock.sendall(_request(path, self._host, headers, body))
        except BlockingIOError:  # SO_SNDTIMEO ran out
            raise TimeoutError("the broker did not take the request in time") from None
        status, answer = self._read_head()
        while 100 <= status < 200:  # interim answers (100 Continue): the final one follows
            status, answer = self._read_head()
        if status in (204, 304):
            content = b""  # no body, whatever the head says
        elif answer.get("transfer-encoding", "").lower() == "chunked":
            content = self._read_chunked()
        elif "content-length" in answer:
            content = self._read_exact(_length(answer["content-length"]))
        else:  # to the end of the connection
            content = self._read_to_close()
            answer["connection"] = "close"
        closes = answer.get("connection", "").lower() == "close"
        return status, answer, content, closes

    def _set_timeout(self, seconds: float | None) -> None:
        if seconds == self._timeout:
            return
        whole = 0.0 if seconds is None else seconds  # 0: no limit
        value = struct.pack("ll", int(whole), int((whole % 1) * 1_000_000))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._timeout = seconds

    def _recv(self, size: int, flags: int = 0) -> bytes:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the broker's answer did not come in time")
            self._set_timeout(max(left, 0.001))  # 0 would mean "no limit"
        try:
            data = self.sock.recv(size, flags)
        except BlockingIOError:  # SO_RCVTIMEO ran out with nothing come
            raise TimeoutError("the broker's answer did not come in time") from None
        if not data:
            raise Closed("the broker closed the connection")
        return data

    def _read_head(self) -> tuple[int, dict[str, str]]:
        """Read up to the end of the head, and not a byte past it (the body then comes
        in one call): what arrived is peeked at, and only the head taken."""
        head = b""
        while True:
            peek = self._recv(_MAX_HEAD, socket.MSG_PEEK)
            end = (head[-3:] + peek).find(_HEAD_END)
            if end >= 0:
                head += self._read_exact(end + len(_HEAD_END) - len(head[-3:]))
                return _parse_head(head)
            if len(head) + len(peek) > _MAX_HEAD:
                raise ProtocolError("the answer's head is too long")
            head += self._read_exact(len(peek))

    def _read_exact(self, size: int) -> bytes:
        if size == 0:
            return b""
        data = self._recv(size, socket.MSG_WAITALL)
        if len(data) == size:
            return data
        parts = [data]  # cut short by a signal or the timeout: the rest
        got = len(data)
        while got < size:
            parts.append(self._recv(size - got, socket.MSG_WAITALL))
            got += len(parts[-1])
        return b"".join(parts)

    def _read_line(self) -> bytes:
        """A chunk's size line (or a trailer), which may come in pieces."""
        while True:
            peek = self._recv(_MAX_LINE, socket.MSG_PEEK)
            end = peek.find(b"\r\n")
            if end >= 0:
                return self._read_exact(end + 2)[:-2]
            if len(peek) >= _MAX_LINE:
                raise ProtocolError("a chunk's size line is too long")
            self._wait_for_more(len(peek))

    def _wait_for_more(self, have: int) -> None:
        """Until more than ``have`` bytes wait on the socket (peeked at, not taken)."""
        while len(self._recv(have + 1, socket.MSG_PEEK | socket.MSG_WAITALL)) <= have:
            pass

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = _length(self._read_line().split(b";")[0].decode("latin-1"), 16)
            got = sum(map(len, parts)) + size
            if size < 0 or got > MAX_BODY:
                raise ProtocolError(f"a chunked answer over {MAX_BODY} bytes")
            if size == 0:
                while self._read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            parts.append(self._read_exact(size))
            self._read_exact(2)

    def _read_to_close(self) -> bytes:
        parts: list[bytes] = []
        got = 0
        while True:
            try:
                parts.append(self._recv(1 << 20))
            except Closed:
                return b"".join(parts)
            got += len(parts[-1])
            if got > MAX_BODY:
                raise ProtocolError(f"an answer over {MAX_BODY} bytes")


def _length(text: str, base: int = 10) -> int:
    """A length of the head or a chunk: a ProtocolError, not a ValueError, when it is
    not one."""
    try:
        length = int(text.strip(), base)
    except ValueError:
        raise ProtocolError(f"not a length: {text[:40]!r}") from None
    if not 0 <= length <= MAX_BODY:
        raise ProtocolError(f"a length of {length} bytes (at most {MAX_BODY})")
    return length


def _request(path: str, host: str, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} has a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, _, rest = status_line.partition(" ")
    if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 answer: {status_line[:80]!r}")
    answer: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            answer[key] = f"{answer[key]}, {value.strip()}" if key in answer else value.strip()
    if version == "HTTP/1.0" and answer.get("connection", "").lower() != "keep-alive":
        answer["connection"] = "close"
    return int(rest[:3]), answer
