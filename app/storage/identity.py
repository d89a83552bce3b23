"""The store's identity: an id created once with the store, kept in Oxia.

Caches outside the store (the file tail cache shared by a host's workers) are keyed by
it, so after the store is reset, or beside another deployment on the same host, they
start empty instead of serving old records at reused offsets.
"""

from __future__ import annotations

import json
import logging
import uuid

import anyio

from app.errors import CorruptData, StorageUnavailable, VersionMismatch
from app.storage.keys import KeyLayout
from app.storage.metadata import now_ms
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

_PARTITION_KEY = "_meta"
# How long a starting process keeps trying when Oxia does not answer.
STARTUP_WAIT_S = 30.0
_MAX_PAUSE_S = 2.0

log = logging.getLogger(__name__)


async def store_identity(oxia: OxiaStore, layout: KeyLayout, *,
                         within_s: float = STARTUP_WAIT_S) -> str:
    """The store's id, created on first use (create-if-absent, so every process agrees).

    It is the first thing a starting process asks Oxia. A call that finds Oxia
    unavailable (a server restarting, a channel still connecting under load) is made
    again, with backoff, for up to ``within_s``: the process waits instead of failing
    its startup, which takes every worker of a multi-worker broker down with it. Both
    calls may be repeated: the create is conditional and the read has no effect."""
    deadline = anyio.current_time() + within_s
    pause = 0.1
    while True:
        try:
            return await _create_or_read(oxia, layout.store_identity())
        except StorageUnavailable as exc:
            if anyio.current_time() + pause > deadline:
                raise
            log.warning("Oxia is unavailable at startup (%s); trying again in %.1f s",
                        exc, pause)
        await anyio.sleep(pause)
        pause = min(pause * 2, _MAX_PAUSE_S)


async def _create_or_read(oxia: OxiaStore, key: str) -> str:
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
