"""The OpenAPI declarations of compression on the wire (app/wire/content_encoding.py):
the ``Content-Encoding`` a produce body may have, the ``Accept-Encoding`` a reader may
send, and the headers of an answer compressed for it."""

from __future__ import annotations

from typing import Any

from app.routes.openapi import Responses, error
from app.wire.content_encoding import (
    ACCEPTED_ENCODINGS,
    ANSWER_ENCODINGS,
    MIN_COMPRESSED_ANSWER,
    REQUEST_ENCODINGS,
)

CONTENT_ENCODING: dict[str, Any] = {
    "name": "Content-Encoding", "in": "header", "required": False,
    "description": "how the body is compressed; its decoded size is bounded by the "
                   "request body limit (413 past it, before it is inflated further), a "
                   "stream that does not decode is a 400, any other coding a 415",
    "schema": {"type": "string", "enum": list(REQUEST_ENCODINGS), "default": "identity"}}

ACCEPT_ENCODING: dict[str, Any] = {
    "name": "Accept-Encoding", "in": "header", "required": False,
    "description": "codings the caller decodes (q-values honoured): the answer is "
                   f"compressed with {' or '.join(ANSWER_ENCODINGS)} (preferred in that "
                   f"order) when it is at least {MIN_COMPRESSED_ANSWER} bytes",
    "schema": {"type": "string"}, "example": "zstd, gzip"}

_ANSWER_HEADERS: dict[str, Any] = {
    "Content-Encoding": {
        "description": "present when the answer is compressed (for the request's "
                       "Accept-Encoding)",
        "schema": {"type": "string", "enum": list(ANSWER_ENCODINGS)}},
    "Vary": {"description": "the answer depends on the request's Accept-Encoding",
             "schema": {"type": "string", "enum": ["Accept-Encoding"]}}}


def compressible(answer: Responses) -> Responses:
    """``answer`` (one status) declared with the headers of a compressed answer."""
    for entry in answer.values():
        entry.setdefault("headers", {}).update(_ANSWER_HEADERS)
    return answer


def unsupported_encoding() -> Responses:
    """The 415 of a body in a coding the broker does not decode, with the
    ``Accept-Encoding`` that says which it does (RFC 9110, 12.5.3)."""
    answer = error(415, "UnsupportedEncoding", description=(
        "a Content-Encoding other than identity, gzip or zstd; nothing was written"))
    for entry in answer.values():
        entry["headers"] = {"Accept-Encoding": {
            "description": "the codings a body may have", "required": True,
            "schema": {"type": "string"}, "example": ACCEPTED_ENCODINGS}}
    return answer
