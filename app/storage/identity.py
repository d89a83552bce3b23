"""The store's identity: an id created once with the store, kept in Oxia.

Caches outside the store (the file tail cache shared by a host's workers) are keyed by
it, so after the store is reset, or beside another deployment on the same host, they
start empty instead of serving old records at reused offsets.
"""

from __future__ import annotations

import json
import uuid

from app.errors import CorruptData, VersionMismatch
from app.storage.keys import KeyLayout
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore
from app.storage.records import now_ms

_PARTITION_KEY = "_meta"


async def store_identity(oxia: OxiaStore, layout: KeyLayout) -> str:
    """The store's id, created on first use (create-if-absent, so every process agrees)."""
    key = layout.store_identity()
    proposal = json.dumps({"store_id": uuid.uuid4().hex, "created_at_ms": now_ms()}).encode()
    try:
        await oxia.put(key, proposal, _PARTITION_KEY, expected_version=EXPECT_NOT_EXISTS)
        return _parse(proposal)
    except VersionMismatch:
        found = await oxia.get(key, _PARTITION_KEY)
        if found is None:
            raise CorruptData(f"{key} exists and does not: Oxia disagrees with itself") from None
        return _parse(found.value)


def _parse(raw: bytes) -> str:
    try:
        value = json.loads(raw)["store_id"]
    except (ValueError, KeyError, TypeError):
        raise CorruptData("the store identity record is not valid") from None
    if not isinstance(value, str) or not value:
        raise CorruptData("the store identity record is not valid")
    return value
