"""The rules for what clients name and choose: topic and group names, idempotency keys.

Written once here and read everywhere a request arrives: the key layout (names become
Oxia and object keys), the request models (as JSON Schema patterns, so the document
states the same rule), the fast JSON body parser and the binary body parser.
"""

from __future__ import annotations

import re
from typing import TypeGuard

NAME_MAX_CHARS = 249
NAME_RULE = f"1..{NAME_MAX_CHARS} characters of [A-Za-z0-9._-], not '.' or '..'"
# The same rule as one JSON Schema pattern (a schema has no "but not"): up to two dots,
# then another character, or three dots; the length is the schema's maxLength.
NAME_PATTERN = r"^(\.{0,2}[A-Za-z0-9_-]|\.\.\.)[A-Za-z0-9._-]*$"
_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{NAME_MAX_CHARS}}}")

IDEMPOTENCY_KEY_MAX_CHARS = 128
IDEMPOTENCY_KEY_RULE = f"1..{IDEMPOTENCY_KEY_MAX_CHARS} printable ASCII characters"
_PRINTABLE = r"\x21-\x7e"  # printable ASCII without the space
IDEMPOTENCY_KEY_PATTERN = rf"^[{_PRINTABLE}]+$"
_IDEMPOTENCY_KEY = re.compile(rf"[{_PRINTABLE}]{{1,{IDEMPOTENCY_KEY_MAX_CHARS}}}")
# The binary body carries the key as bytes; the rule is the same.
_IDEMPOTENCY_KEY_BYTES = re.compile(_IDEMPOTENCY_KEY.pattern.encode())


def is_name(text: object) -> TypeGuard[str]:
    """A topic or consumer group name (Kafka's rule for topics)."""
    return isinstance(text, str) and _NAME.fullmatch(text) is not None \
        and text not in (".", "..")


def is_idempotency_key(key: object) -> bool:
    """An idempotency key, as text (JSON) or as the binary body's bytes."""
    if isinstance(key, bytes):
        return _IDEMPOTENCY_KEY_BYTES.fullmatch(key) is not None
    return isinstance(key, str) and _IDEMPOTENCY_KEY.fullmatch(key) is not None
