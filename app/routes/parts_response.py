"""A response whose body is sent as the parts it was built from.

A binary consume answer of many MiB is mostly views of the object-store bodies its
records were cut from; joining them into one buffer would copy every byte once more
(and fault in a fresh allocation of the answer's size) only for the server to write it
out. The parts go to the server one message at a time instead, with the total length
declared up front.

Each part goes out in slices of at most ``SLICE`` bytes: the server's transport copies
what the socket does not take at once into a buffer of its own, so a whole answer
written in one message would be held twice while a slow client reads it.

``content_encoding`` names how the parts are compressed (app/broker/answer_compression.py);
every answer says it varies by ``Accept-Encoding``, compressed or not.

``on_sent`` runs once the answer has been handed to the server, or failed to be (the
client went away): a consume answer gives its bytes back to the answer budget there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from app.broker.answer_compression import VARY

SLICE = 1024 * 1024


class PartsResponse(Response):
    def __init__(self, parts: Sequence[bytes | memoryview], media_type: str,
                 status_code: int = 200, on_sent: Callable[[], None] | None = None,
                 content_encoding: str | None = None) -> None:
        self._parts = [s for p in parts if len(p) for s in _sliced(p)]
        self._on_sent = on_sent
        headers = {"vary": VARY}
        if content_encoding is not None:
            headers["content-encoding"] = content_encoding
        super().__init__(b"", status_code=status_code, media_type=media_type,
                         headers=headers)
        length = str(sum(len(p) for p in self._parts)).encode()
        self.raw_headers = [(k, length if k == b"content-length" else v)
                            for k, v in self.raw_headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._send(send)
        finally:
            self._parts = []
            if self._on_sent is not None:
                self._on_sent()

    async def _send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        last = len(self._parts) - 1
        if last < 0:
            await send({"type": "http.response.body", "body": b""})
            return
        for i, part in enumerate(self._parts):
            await send({"type": "http.response.body", "body": part, "more_body": i < last})


def _sliced(part: bytes | memoryview) -> list[bytes | memoryview]:
    if len(part) <= SLICE:
        return [part]
    view = memoryview(part)
    return [view[i:i + SLICE] for i in range(0, len(view), SLICE)]
