"""``meta/compactor-claim``: an ephemeral "I am compacting this partition" hint.

Created with "expect not exists" as an Oxia ephemeral record, so a compactor that dies
loses it when its session expires. Deleted after the attempt, conditionally on the version
created, so a claim that expired and was re-taken by another compactor is never removed.
The claim keeps compactors from duplicating work; correctness never depends on it.

A create whose answer is lost may still have been applied, and an ephemeral record lives
as long as this process's session: left alone, it would keep every compactor off the
partition for good. Each claim therefore carries a ``claim_id``; an unanswered create is
settled by reading the claim back (ours: held; another's: busy; none: not created), and
one that cannot be read yet is settled before the next attempt on that partition.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import anyio

from app.compaction.metrics import CompactionMetrics
from app.errors import StorageUnavailable, VersionMismatch
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import CompactorClaim, now_ms
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

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
        # Creates whose outcome is unknown: the claim_id they carried.
        self._unsettled: dict[TopicPartition, str] = {}

    async def acquire(self, tp: TopicPartition) -> int | None:
        """The claim's version, or None if another compactor holds it."""
        leftover = self._unreleased.pop(tp, None)
        if leftover is not None:
            await self.release(tp, leftover)
        unsettled = self._unsettled.get(tp)
        if unsettled is not None:
            mine = await self._settle(tp, unsettled)
            if mine is not None:
                await self.release(tp, mine)  # from an earlier attempt: let go of it
        claim_id = uuid.uuid4().hex
        claim = CompactorClaim(compactor_id=self.compactor_id, claimed_at_ms=now_ms(),
                               claim_id=claim_id)
        try:
            version = await self._oxia.put(
                self._layout.compactor_claim(tp), claim.to_json(), tp.partition_key,
                expected_version=EXPECT_NOT_EXISTS, ephemeral=True,
            )
        except VersionMismatch:
            self._count("busy")
            return None
        except StorageUnavailable:
            self._unsettled[tp] = claim_id
            settled = await self._settle(tp, claim_id)
            self._count("busy" if settled is None else "acquired")
            return settled
        self._count("acquired")
        return version

    async def _settle(self, tp: TopicPartition, claim_id: str) -> int | None:
        """After an unanswered create: the claim's version if it is ours, else None.
        Raises StorageUnavailable (and stays unsettled) while it cannot be read."""
        found = await self._oxia.get(self._layout.compactor_claim(tp), tp.partition_key)
        self._unsettled.pop(tp, None)
        if found is None:
            return None
        held = CompactorClaim.from_json(found.value)
        return found.version_id if held.claim_id == claim_id else None

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
