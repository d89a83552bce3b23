"""The consumer's way to its answers: HTTP/1.1 over one kept-alive connection of its
own, through :mod:`llog_client._rawhttp` (plain HTTP) or the standard library's
``http.client`` (HTTPS), each of which reads a body of known length in few calls into C,
with the GIL released while it waits.

Why not httpx, which every other request of the client goes through: httpcore and h11
read an answer 64 KiB at a time through Python and copy it three or four times on the
way, and httpx's request and response machinery costs a third of a millisecond more per
request. For 4 MiB answers of 1 KiB records that came to 1.4 µs of CPU per record, five
times this lane's 0.3 µs, and more than everything else the consumer does per record.
The consumer uses httpx instead when the client was given a transport of its own (its
TLS settings, its sockets) or a proxy of the environment applies to the broker (httpx
honours ``HTTP_PROXY`` and the others; this lane does not).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import urllib.request
from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

from llog_client import _rawhttp as rawhttp
from llog_client._wire import Broken

Answer = tuple[int, dict[str, str], bytes]
# A kept-alive connection the broker had closed fails with these before any answer.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
          rawhttp.Closed)


def usable(url: str) -> bool:
    """Whether the lane can reach ``url``: http or https, and no proxy of the
    environment in between."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    proxies = urllib.request.getproxies_environment()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return True
    # The standard library's NO_PROXY rule (typeshed does not declare it).
    bypass = getattr(urllib.request, "proxy_bypass_environment")  # noqa: B009
    return bool(bypass(parts.hostname, proxies))


class Lane:
    """One connection to one broker, made at the first request and again whenever
    the broker (the URL) changes or the connection fails."""

    def __init__(self) -> None:
        self._conn: rawhttp.Connection | http.client.HTTPConnection | None = None
        self._origin = ""
        self._ssl: ssl.SSLContext | None = None

    def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
             connect_s: float | None, read_s: float | None) -> Answer | Broken:
        """Status, headers (lower-case names) and body; or why there is none."""
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        reused = self._conn is not None and origin == self._origin
        try:
            if not reused:
                self._open(parts, connect_s)
            try:
                return self._exchange(path, body, headers, read_s)
            except _STALE:
                if not reused:
                    raise
                # Once more on a new connection: a read changes nothing, and the broker
                # had let this one go before it read the request.
                self._open(parts, connect_s)
                return self._exchange(path, body, headers, read_s)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            sent = self._conn is not None  # it stood: the request may have gone out
            self.close()
            return Broken(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
                          maybe_sent=sent)

    def _open(self, parts: SplitResult, connect_s: float | None) -> None:
        self.close()
        host = parts.hostname or ""
        if parts.scheme == "https" or not rawhttp.AVAILABLE:
            if parts.scheme == "https" and self._ssl is None:
                self._ssl = ssl.create_default_context()
            conn = (http.client.HTTPSConnection(host, parts.port, context=self._ssl)
                    if parts.scheme == "https" else http.client.HTTPConnection(host, parts.port))
            conn.timeout = connect_s
            conn.connect()
            self._conn = conn
        else:
            self._conn = rawhttp.Connection(host, parts.port or 80, connect_s)
        self._origin = f"{parts.scheme}://{parts.netloc}"

    def _exchange(self, path: str, body: bytes, headers: Mapping[str, str],
                  read_s: float | None) -> Answer:
        conn = self._conn
        assert conn is not None
        if isinstance(conn, rawhttp.Connection):
            status, answer, content, closes = conn.exchange(path, body, headers, read_s)
        else:
            assert conn.sock is not None
            conn.sock.settimeout(read_s)
            conn.request("POST", path, body=body, headers=dict(headers))
            response = conn.getresponse()
            length = response.getheader("content-length")
            if length is not None and not 0 <= int(length) <= rawhttp.MAX_BODY:
                raise rawhttp.ProtocolError(f"an answer of {length} bytes")
            content = response.read(rawhttp.MAX_BODY + 1)
            if len(content) > rawhttp.MAX_BODY:
                raise rawhttp.ProtocolError(f"an answer over {rawhttp.MAX_BODY} bytes")
            status, closes = response.status, response.will_close
            answer = {k.lower(): v for k, v in response.getheaders()}
        if closes:
            self.close()
        return status, answer, content

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def interrupt(self) -> None:
        """Shut the connection's socket down, from any thread: a read blocked on it ends
        at once (and the request fails as a broken connection)."""
        conn = self._conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
