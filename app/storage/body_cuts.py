"""Cutting a body received in pieces into the spans its reader keeps apart.

An HTTP client hands a body over in the pieces the socket gave it (a few hundred KiB
each). A reader that keeps the spans of one ranged GET separately (the chunks of a
compacted blob, each cached on its own) would join the pieces, then copy each span out
of the joined body so that a span kept longer does not hold the rest of the range in
memory: two copies of every byte. Cut from the pieces directly, each byte is copied
once, and a span that is a whole piece is not copied at all.
"""

from __future__ import annotations

from collections.abc import Sequence


def cut(pieces: Sequence[bytes], spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """One ``bytes`` per span (``(offset, end)`` into the pieces laid end to end, in
    order, not overlapping; bytes between spans are dropped)."""
    out: list[bytes] = []
    index, at = 0, 0  # the piece holding the next byte, and its offset in the body
    for offset, end in spans:
        if offset > end:
            raise ValueError(f"span ({offset}, {end}) ends before it starts")
        while index < len(pieces) and at + len(pieces[index]) <= offset:
            at += len(pieces[index])
            index += 1
        parts: list[bytes | memoryview] = []
        i, piece_at = index, at
        while i < len(pieces) and piece_at < end:
            piece = pieces[i]
            lo, hi = max(offset - piece_at, 0), min(end - piece_at, len(piece))
            parts.append(piece if (lo, hi) == (0, len(piece)) else memoryview(piece)[lo:hi])
            piece_at += len(piece)
            i += 1
        if sum(len(p) for p in parts) != end - offset:
            raise ValueError(f"span ({offset}, {end}) is outside the body")
        if len(parts) == 1 and isinstance(parts[0], bytes):
            out.append(parts[0])
        else:
            out.append(b"".join(parts))
    return out
