"""Request ids: taken from an incoming ``X-Request-ID`` (a proxy's or a client's) when it
is acceptable, generated otherwise, echoed in the ``X-Request-ID`` response header, and
kept with the request's method and path in a context variable that every log line
logged while the request is served carries (app/telemetry/logs.py).

An id is acceptable when it has 1 to ``LLOG_REQUEST_ID_MAX_LENGTH`` characters from
``A-Z a-z 0-9 . _ : ; = / + @ -``: enough for UUIDs and the trace ids of common proxies,
never a space, quote or control character that could forge a log line. Any other value
is replaced (not refused: an id is for tracing, it never decides whether a request is
served).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.telemetry.logs import REQUEST_FIELDS

HEADER = b"x-request-id"
_ALLOWED = re.compile(r"[A-Za-z0-9._:;=/+@-]+")


def accepted_id(value: bytes | None, max_length: int) -> str | None:
    """``value`` as a request id, or None when it is missing or not acceptable."""
    if value is None or not 0 < len(value) <= max_length:
        return None
    text = value.decode("latin-1")
    return text if _ALLOWED.fullmatch(text) else None


def id_generator() -> Iterator[str]:
    """Fresh ids: 32 hex digits, a random prefix per generator and a counter. Unique
    enough to trace by, and no system call per request (a UUID4 takes one)."""
    prefix = os.urandom(8).hex()
    return (f"{prefix}{n:016x}" for n in itertools.count())


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp, max_length: int) -> None:
        self.app = app
        self.max_length = max_length
        self._fresh = id_generator()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == HEADER), None)
        request_id = accepted_id(given, self.max_length) or next(self._fresh)
        token = REQUEST_FIELDS.set({"request_id": request_id, "method": scope.get("method", ""),
                                    "path": scope.get("path", "")})

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_FIELDS.reset(token)
