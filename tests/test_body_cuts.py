"""Cutting a body received in pieces: every span holds exactly its bytes, whatever the
pieces' boundaries; a span that is a whole piece is that piece, not a copy; bytes
between spans are dropped; a span outside the body is refused."""

from __future__ import annotations

import random

import pytest

from app.storage.body_cuts import cut


def _pieces(body: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for size in sizes:
        out.append(body[at:at + size])
        at += size
    assert at == len(body)
    return out


def test_spans_hold_their_bytes_whatever_the_pieces() -> None:
    rng = random.Random(7)
    for _ in range(500):
        body = rng.randbytes(rng.randint(0, 3_000))
        cuts = sorted(rng.sample(range(len(body) + 1), k=min(len(body) + 1, 6)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        pieces = _pieces(body, sizes)
        marks = sorted(rng.choices(range(len(body) + 1), k=2 * rng.randint(0, 5)))
        spans = list(zip(marks[::2], marks[1::2], strict=True))
        assert cut(pieces, spans) == [body[a:b] for a, b in spans]


def test_a_span_that_is_a_whole_piece_is_not_copied() -> None:
    pieces = [b"a" * 10, b"b" * 20, b"c" * 30]
    out = cut(pieces, [(0, 10), (10, 30), (30, 45), (45, 60)])
    assert out[0] is pieces[0] and out[1] is pieces[1]
    assert out[2:] == [b"c" * 15, b"c" * 15]
    assert all(type(part) is bytes for part in out)


@pytest.mark.parametrize("span", [(50, 61), (70, 80), (5, 4)])
def test_a_span_outside_the_body_is_refused(span: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="outside the body|ends before"):
        cut([b"x" * 30, b"y" * 30], [span])
