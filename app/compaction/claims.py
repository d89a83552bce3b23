"""``meta/compactor-claim``: an ephemeral "I am compacting this partition" hint.

Created with "expect not exists" as an Oxia ephemeral record, so a compactor that dies
loses it when its session expires. Deleted after the attempt, conditionally on the version
created, so a claim that expired and was re-taken by another compactor is never removed.
The claim keeps compactors from duplicating work; correctness never depends on it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import anyio

from app.compaction.metrics import CompactionMetrics
from app.errors import StorageUnavailable, VersionMismatch
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.oxia_store import EXPECT_NOT_EXISTS, OxiaStore
from app.storage.records import CompactorClaim, now_ms

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 10.0


class Claims:
    def __init__(self, oxia: OxiaStore, layout: KeyLayout, compactor_id: str, *,
                 metrics: CompactionMetrics | None = None) -> None:
        self._oxia = oxia
        self._layout = layout
        self.compactor_id = compactor_id
        self._metrics = metrics
        # Claims whose release failed: while this process (and so its Oxia session) lives
        # they would never expire, so they are retried before the next acquire.
        self._unreleased: dict[TopicPartition, int] = {}

    async def acquire(self, tp: TopicPartition) -> int | None:
        """The claim's version, or None if another compactor holds it."""
        leftover = self._unreleased.pop(tp, None)
        if leftover is not None:
            await self.release(tp, leftover)
        claim = CompactorClaim(compactor_id=self.compactor_id, claimed_at_ms=now_ms())
        try:
            version = await self._oxia.put(
                self._layout.compactor_claim(tp), claim.to_json(), tp.partition_key,
                expected_version=EXPECT_NOT_EXISTS, ephemeral=True,
            )
        except VersionMismatch:
            self._count("busy")
            return None
        self._count("acquired")
        return version

    async def release(self, tp: TopicPartition, version: int) -> None:
        """Delete our claim; shielded, so a cancelled task still lets go of it."""
        with anyio.CancelScope(shield=True), anyio.move_on_after(RELEASE_TIMEOUT_S) as scope:
            try:
                await self._oxia.delete(self._layout.compactor_claim(tp), tp.partition_key,
                                        expected_version=version)
                self._unreleased.pop(tp, None)
                return
            except VersionMismatch:
                # Our session expired and someone else claimed it since: theirs now.
                self._count("lost")
                return
            except StorageUnavailable as exc:
                log.warning("%s: could not release the compactor claim: %s", tp, exc)
        if scope.cancelled_caught:
            log.warning("%s: releasing the compactor claim timed out", tp)
        self._unreleased[tp] = version

    @contextlib.asynccontextmanager
    async def held(self, tp: TopicPartition) -> AsyncIterator[bool]:
        """``async with claims.held(tp) as mine:``; released on exit when ``mine``."""
        version = await self.acquire(tp)
        try:
            yield version is not None
        finally:
            if version is not None:
                await self.release(tp, version)

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.claims.labels(outcome).inc()
