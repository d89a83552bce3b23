"""Which values a JSON consume answer shows as text (encoding "auto"): UTF-8 without C0
controls other than tab, newline and carriage return, and without DEL; the rest goes
as base64. ASCII takes a faster check than other text: both must agree."""

from __future__ import annotations

import pytest

from app.broker.answers import text as _text


@pytest.mark.parametrize(("value", "text"), [
    (b"plain", "plain"), (b"", ""), (b"tab\tnew\nline\r", "tab\tnew\nline\r"),
    (b"nul\x00", None), (b"\x1f", None), (b"del\x7f", None), (b"\x0b\x0c", None),
    ("caf\u00e9".encode(), "caf\u00e9"), ("caf\u00e9\x01".encode(), None),
    ("\u00e9\x7f".encode(), None), (b"\xff\xfe", None), (b"\xc3", None),
])
def test_text_or_not(value: bytes, text: str | None) -> None:
    assert _text(value, "auto") == text
    assert _text(value, "base64") is None
