"""Forward fences: one Oxia key decides whether a forwarded frame is written, or not.

A forward that gets no answer in time (the peer's object store is slow, the connection
broke, the peer hangs) leaves its groups in doubt: the peer may still flush them. If
the forwarder appended them as well, they would be written twice (an idempotency key
is remembered only among its partition's recent keys, so past that window nothing
catches the second copy). So the two brokers race for one key per frame, each putting
it only if it does not exist yet (docs/protocol.md, Forward fences):

- the receiver **takes** the frame as a flush takes its records, before anything is
  written; if the key exists, the forwarder has given up on the frame, and the receiver
  answers it expired and writes nothing;
- the forwarder that waited in vain **abandons** it; if that put wins, the receiver will
  never write the frame, so its groups are appended by the forwarder (keyed or not);
  if it loses, the receiver took them and they are answered CommitInDoubt.

One of the two puts succeeds, so no frame is written by both brokers, whatever the
timing. A claim whose outcome Oxia did not report is settled by reading the key back.

A taken frame may still be committed by the receiver after its forwarder gave up: its
flush may be waiting on a slow object store, and nothing bounds when a compare-and-set
lands (an Oxia deadline counts from the request's arrival, so one held on the wire is
applied after its sender gave up on it). What is bounded is the version it expects.
Each frame carries a *commit window* ``W``, the forwarder's wait for an answer: the
receiver sends no compare-and-set that commits the frame's groups expecting a control
version it read more than ``W`` after it started claiming the fence (``commit_by``);
and the forwarder that finds the frame taken answers it in doubt ``W`` plus
:data:`ANSWER_MARGIN_S` after it found out. Its claim lost, so the receiver's landed
first, and started earlier still: the answer comes after ``commit_by``, and so does a
client's resend. A late commit of the frame expects a version that was current before
``commit_by`` and still is when it lands; so it lands before the resend reads the
control record (which then remembers the key), or the resend's commit moves the version
first and the late one fails (docs/protocol.md, Forward fences).

A fence is named by the forwarder's wall-clock minute at sending (``sent_at_ms``) and
the frame's token. Neither side claims a fence later than :data:`TAKE_WINDOW_MS` after
``sent_at_ms`` by its own clock (the receiver answers such a frame expired, the
forwarder counts its groups in doubt), and any member deletes the fences of minutes
more than :data:`SWEEP_AFTER_MS` old. So a fence outlives every claim on it while the
brokers' clocks agree to within the difference (55 minutes; signing S3 requests keeps
each broker within 15 minutes of the object store's clock, so within 30 of each other).
What it costs: one key per forwarded frame of the last hour, on one Oxia shard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Counter

from app.clock import wall_ms
from app.errors import StorageUnavailable, VersionMismatch
from app.storage.cas import Outage
from app.storage.keys import FENCES_PARTITION_KEY, KeyLayout
from app.stores.oxia.store import EXPECT_NOT_EXISTS, OxiaStore

log = logging.getLogger(__name__)

TAKE_WINDOW_MS = 5 * 60_000
# How much later than the commit window a forwarder answers a frame its peer took in
# doubt: the two brokers' monotonic clocks need not agree on the time, only on its rate,
# and this covers rates a fraction of a percent apart over the longest window (4 min).
ANSWER_MARGIN_S = 1.0
SWEEP_AFTER_MS = 60 * 60_000
SWEEP_EVERY_S = 60.0

TAKEN = b"taken"
ABANDONED = b"abandoned"

Side = Literal["receiver", "forwarder"]
Outcome = Literal["taken", "abandoned", "late", "error"]


def claim_budget_for(oxia_request_timeout_s: float) -> float:
    """How long a claim may take before it counts as ``error``: a put and a read back,
    each given the Oxia request deadline. It is part of the longest answer in doubt a
    forwarder gives (its connect, its wait for an answer, this, then the commit window;
    docs/protocol.md, Forward fences, states the whole)."""
    return 2 * oxia_request_timeout_s


@dataclass(frozen=True)
class Fence:
    """Which frame a fence key is for: the forwarder's wall clock when it sent the frame
    (ms) and a token unique to the frame (its client's prefix and frame id)."""

    sent_at_ms: int
    token: str

    @property
    def minute(self) -> int:
        return self.sent_at_ms // 60_000


class FenceMetrics:
    def __init__(self, registry: CollectorRegistry, member: str = "") -> None:
        self._claims = Counter(
            "llog_forward_fences", "Forward fences claimed, by side (receiver: as a "
            "flush takes the frame; forwarder: after its frame went unanswered) and by "
            "who won: taken (the receiver writes the frame), abandoned (the forwarder "
            "appends it itself), late (past the take window: nobody claims it), error "
            "(Oxia did not say: the receiver writes nothing, the forwarder answers in "
            "doubt)", ["member", "side", "outcome"], registry=registry)
        self._member = member

    def claimed(self, side: Side, outcome: Outcome) -> None:
        self._claims.labels(self._member, side, outcome).inc()


class ForwardFences:
    """Claims and sweeps the fence keys of forwarded frames (see the module)."""

    def __init__(self, oxia: OxiaStore, layout: KeyLayout, metrics: FenceMetrics, *,
                 claim_budget_s: float = 10.0,
                 clock_ms: Callable[[], int] = wall_ms
                 ) -> None:
        self._oxia = oxia
        self._layout = layout
        self._metrics = metrics
        # A claim Oxia has not settled in this long counts as "error": the receiver
        # writes nothing, the forwarder answers in doubt (a put cut short may still
        # land, which only makes the other side's claim lose too).
        self._budget_s = claim_budget_s
        self._clock_ms = clock_ms

    def stamp(self, token: str) -> Fence:
        """The fence of a frame sent now."""
        return Fence(self._clock_ms(), token)

    async def take(self, fence: Fence) -> bool:
        """The receiver's claim: True if it may write the frame, False if the forwarder
        gave up on it first, the frame is past the take window, or Oxia did not say."""
        outcome = await self._claim(fence, TAKEN)
        self._metrics.claimed("receiver", outcome)
        return outcome == "taken"

    async def abandon(self, fence: Fence) -> Outcome:
        """The forwarder's claim: ``abandoned`` if the receiver will never write the
        frame (its groups may be appended elsewhere), ``taken`` if the receiver took it
        (the take landed before this call returned), else ``late`` or ``error``: who
        holds it, if anyone, cannot be known."""
        outcome = await self._claim(fence, ABANDONED)
        self._metrics.claimed("forwarder", outcome)
        return outcome

    async def _claim(self, fence: Fence, value: bytes) -> Outcome:
        if self._clock_ms() >= fence.sent_at_ms + TAKE_WINDOW_MS:
            return "late"  # its fence may be swept: claiming it could win a race twice
        # The budget bounds the waiting; a put it cuts short may still land, which can
        # only make the other side's claim lose too (both then write nothing).
        with anyio.move_on_after(self._budget_s):
            return await self._put_or_read(fence, value)
        return "error"

    async def _put_or_read(self, fence: Fence, value: bytes) -> Outcome:
        key = self._layout.forward_fence(fence.minute, fence.token)
        outage = Outage(self._budget_s)  # pauses while Oxia does not answer
        while True:
            try:
                await self._oxia.put(key, value, FENCES_PARTITION_KEY,
                                     expected_version=EXPECT_NOT_EXISTS)
                return _holder(value)
            except VersionMismatch:
                pass  # it exists: read who holds it (perhaps this very claim, retried)
            except StorageUnavailable as exc:
                log.warning("claiming forward fence %s: %s", key, exc)
            try:
                record = await self._oxia.get(key, FENCES_PARTITION_KEY)
            except StorageUnavailable as exc:
                log.warning("reading forward fence %s: %s", key, exc)
                record = None
            if record is not None:
                return _holder(bytes(record.value))
            if not await outage.pause():  # not answered, or not there: put again
                return "error"

    async def sweep(self) -> None:
        """Delete the fences of minutes more than :data:`SWEEP_AFTER_MS` old."""
        before = (self._clock_ms() - SWEEP_AFTER_MS) // 60_000
        await self._oxia.delete_range(self._layout.fences_prefix(),
                                      self._layout.fences_before(before),
                                      FENCES_PARTITION_KEY)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Sweep every :data:`SWEEP_EVERY_S` (every member does; a sweep is idempotent)."""
        task_status.started()
        while True:
            try:
                await self.sweep()
            except StorageUnavailable as exc:
                log.warning("sweeping old forward fences: %s", exc)
            await anyio.sleep(SWEEP_EVERY_S)


def _holder(value: bytes) -> Outcome:
    """Who holds a fence, by its value; one neither side writes is nobody's win."""
    if value == TAKEN:
        return "taken"
    if value == ABANDONED:
        return "abandoned"
    log.warning("a forward fence holds %r, which no broker writes", value[:40])
    return "error"
