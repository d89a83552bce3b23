"""A request's body as the lean S3 path sends it: one buffer, or parts written one after
another without being joined (a WAL object's head and slices, views into the request
bodies they came in: ``codec.pack_shared_parts``)."""

from __future__ import annotations

from collections.abc import Sequence

Buffer = bytes | bytearray | memoryview
Body = Buffer | Sequence[Buffer]


def body_parts(body: Body) -> Sequence[Buffer]:
    """``body`` as parts in order (a whole one is one part)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return (body,)
    return body


def body_size(body: Body) -> int:
    """The bytes of ``body``, whole or in parts (a view's own size, not a new view of
    each part: a PUT's size is taken per flush, over about a hundred parts)."""
    return sum(part.nbytes if type(part) is memoryview else len(part)
               for part in body_parts(body))
