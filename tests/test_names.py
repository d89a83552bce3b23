"""The rules for names and idempotency keys are written once (app/storage/names.py): the
JSON Schema pattern the document states agrees with the check every parser makes, and no
other module spells the rule again."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from app.storage import names

ROOT = Path(__file__).resolve().parents[1]
NEAR_NAMES = st.text(alphabet="Aa0._-/ é\x7f", max_size=252) | st.sampled_from(
    ["", ".", "..", "...", "a" * 249, "a" * 250, ".a", "..a", "-", "_"])
NEAR_KEYS = st.text(alphabet="a~!\x20\x21\x7e\x7f\té", max_size=130) | st.sampled_from(
    ["", "k" * 128, "k" * 129, "order-4711"])


@given(NEAR_NAMES)
def test_the_name_pattern_and_the_check_agree(text: str) -> None:
    by_schema = (re.search(names.NAME_PATTERN, text) is not None
                 and 1 <= len(text) <= names.NAME_MAX_CHARS)
    assert names.is_name(text) == by_schema


@given(NEAR_KEYS)
def test_the_idempotency_key_pattern_and_the_check_agree(key: str) -> None:
    by_schema = (re.search(names.IDEMPOTENCY_KEY_PATTERN, key) is not None
                 and 1 <= len(key) <= names.IDEMPOTENCY_KEY_MAX_CHARS)
    assert names.is_idempotency_key(key) == by_schema
    assert names.is_idempotency_key(key.encode()) == by_schema  # the binary body's bytes


def test_no_other_module_spells_the_rules() -> None:
    spelled = re.compile(r"\{1,249\}|\\x21-\\x7e|max_length=249\b|\.\{0,2\}\[A-Za-z")
    found = [str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py")
             if p.name != "names.py" and spelled.search(p.read_text())]
    assert not found, f"the name or key rule spelled outside app/storage/names.py: {found}"
