"""Read-ahead for consumers catching up through compacted blobs.

A catch-up consumer asks for the next range as soon as it has the previous answer, so
each answer waits for its ranged GET. When a read stops inside a compacted blob, the
chunks that follow (as many bytes as that read fetched) are fetched in the background
into the reader's object cache, and the next read finds them there: the GET overlaps
sending the previous answer instead of following it.

Bounded: at most ``max_inflight`` blobs are read ahead at once (a read that would start
one more starts none), one read-ahead per blob, and what it fetches is kept only within
the object cache's budget. While it fetches and decodes, a read-ahead holds its bytes
in the broker's answer budget (``admit``), and only if they fit at once: a read-ahead is
worth doing when there is room, so it never waits for it and never makes an answer
wait (one that does not fit is not started, and counted as declined). A failed
read-ahead is counted and forgotten: the read that needs those chunks fetches them
itself. A read that needs chunks a read-ahead is still
fetching waits for it rather than fetching them twice.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc

log = logging.getLogger(__name__)

Fetch = Callable[[], Awaitable[None]]
# Takes the bytes a read-ahead will hold, if there is room now: the function that gives
# them back, or None (no room: the read-ahead is not started).
Admit = Callable[[int], Callable[[], None] | None]


@dataclass(frozen=True)
class ReadAheadStats:
    inflight: int
    max_inflight: int
    started: int
    failed: int
    declined: int


class ReadAhead:
    """Background fetches of the chunks after a read, in the task group given to
    :meth:`run_in` (none before: a reader without one never reads ahead)."""

    def __init__(self, max_inflight: int, admit: Admit | None = None) -> None:
        self.max_inflight = max_inflight
        self._admit = admit  # None: read-aheads hold no budget (a reader of its own)
        self._group: anyio.abc.TaskGroup | None = None
        self._inflight: dict[str, anyio.Event] = {}
        self.started = 0
        self.failed = 0
        self.declined = 0

    def run_in(self, group: anyio.abc.TaskGroup) -> None:
        self._group = group

    def statistics(self) -> ReadAheadStats:
        return ReadAheadStats(len(self._inflight), self.max_inflight, self.started,
                              self.failed, self.declined)

    def start(self, key: str, fetch: Fetch, cost: int = 0) -> bool:
        """Run ``fetch`` (chunks of the blob ``key``, about ``cost`` bytes once read and
        decoded) in the background, unless the blob is already being read ahead,
        ``max_inflight`` are, or the budget has no room for ``cost`` now; whether it
        started."""
        if (self._group is None or key in self._inflight
                or len(self._inflight) >= self.max_inflight):
            return False
        release = None
        if self._admit is not None:
            release = self._admit(cost)
            if release is None:
                self.declined += 1
                return False
        done = self._inflight[key] = anyio.Event()
        self.started += 1
        self._group.start_soon(self._run, key, fetch, done, release)
        return True

    async def wait(self, key: str) -> None:
        """Until a read-ahead of ``key`` under way (if any) has ended."""
        done = self._inflight.get(key)
        if done is not None:
            await done.wait()

    async def _run(self, key: str, fetch: Fetch, done: anyio.Event,
                   release: Callable[[], None] | None) -> None:
        try:
            await fetch()
        except Exception as exc:  # the read that needs these chunks fetches them itself
            self.failed += 1
            log.debug("read-ahead of %s failed: %s", key, exc)
        finally:
            del self._inflight[key]
            if release is not None:
                release()
            done.set()
