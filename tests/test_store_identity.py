"""The store's identity at startup: created once, read by every later process, and
asked for again while Oxia is unavailable instead of failing the process's startup."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from app.errors import StorageUnavailable, VersionMismatch
from app.storage.identity import store_identity
from app.storage.keys import KeyLayout

LAYOUT = KeyLayout("llog", "bucket")


@dataclass
class Found:
    value: bytes


@dataclass
class FlakyOxia:
    """A create-if-absent and a get, over one record; the first ``failures`` calls
    find Oxia unavailable."""

    failures: int = 0
    calls: int = 0
    records: dict[str, bytes] = field(default_factory=dict)

    def _call(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StorageUnavailable("Oxia get failed: UNAVAILABLE: tcp handshaker shutdown")

    async def put(self, key: str, value: bytes, partition_key: str, *,
                  expected_version: int) -> None:
        self._call()
        if key in self.records:
            raise VersionMismatch()
        self.records[key] = value

    async def get(self, key: str, partition_key: str) -> Found | None:
        self._call()
        return Found(self.records[key]) if key in self.records else None


async def test_every_process_gets_the_id_the_first_one_created() -> None:
    oxia: Any = FlakyOxia()
    first = await store_identity(oxia, LAYOUT)
    assert await store_identity(oxia, LAYOUT) == first
    assert len(first) == 32


async def test_oxia_unavailable_at_startup_is_asked_again() -> None:
    oxia: Any = FlakyOxia(failures=3)
    created = await store_identity(oxia, LAYOUT, within_s=10)
    assert oxia.calls == 4
    oxia.failures, oxia.calls = 2, 0  # a later process, on a read this time
    assert await store_identity(oxia, LAYOUT, within_s=10) == created


async def test_oxia_unavailable_past_the_wait_fails_the_startup() -> None:
    oxia: Any = FlakyOxia(failures=10**6)
    with pytest.raises(StorageUnavailable, match="tcp handshaker shutdown"):
        await store_identity(oxia, LAYOUT, within_s=0.5)
    assert 2 <= oxia.calls < 10  # backoff, not a busy loop
