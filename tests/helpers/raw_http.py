"""One HTTP/1.1 request read off a plain socket, for the scripted servers of the
client's tests (a fake broker that answers well, oddly or not at all)."""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class RawRequest:
    line: str  # "POST /produce HTTP/1.1"
    headers: dict[str, str]  # names in lower case
    body: bytes


def read_request(conn: socket.socket) -> RawRequest | None:
    """The next request on ``conn``, its body by Content-Length (None: the client
    closed the connection first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(1 << 20)
        if not chunk:
            return None
        body += chunk
    return RawRequest(lines[0], headers, body)
