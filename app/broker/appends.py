"""Where a produce request's groups are appended: through the affinity router while this
worker is a cluster member and the router runs, else into this worker's batcher."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from app.batching.batcher import Batcher
from app.cluster.router import AffinityRouter
from app.storage.appends import AppendGroup, AppendOutcome

# At shutdown, how long the lanes may take to hand what they hold to their peers, and
# the forward listener to send its last answers once the batcher has committed them.
FORWARD_DRAIN_S = 10.0


class Appends:
    def __init__(self, batcher: Batcher, router: AffinityRouter | None = None) -> None:
        self._batcher = batcher
        self._router = router  # with LLOG_AFFINITY=forward, until the shutdown begins

    async def __call__(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        if self._router is not None:
            return await self._router.submit(groups)
        return await self._batcher.submit(groups)

    async def stop_routing(self) -> None:
        """Before the batcher closes: new groups are appended here, and what the lanes
        hold goes out (or falls back here, into the still open batcher)."""
        router, self._router = self._router, None
        if router is None:
            return
        router.close()
        with anyio.move_on_after(FORWARD_DRAIN_S, shield=True):
            await router.stopped.wait()
