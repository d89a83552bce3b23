"""A forward that timed out, settled by the peer's late answer: the real forward client
and server on loopback sockets, the router between them and a local append, and forward
fences whose claim the test holds open (Oxia paused under both brokers) and ends with the
holder it chooses. The wire alone is in test_forward.py; the router's decisions with a
stand-in client in test_affinity_router.py; two brokers in test_affinity.py."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import pytest
from prometheus_client import CollectorRegistry

from app.cluster.fences import Fence, Outcome
from app.cluster.forward import ForwardClient, ForwardUnknown, LateAnswer
from app.cluster.forward_metrics import ForwardMetrics
from app.cluster.router import AffinityRouter, RouterMetrics
from app.errors import CommitInDoubt, ForwardExpired
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from tests.test_affinity_router import _group, _Local, _Membership
from tests.test_forward import SECRET, FakeHandler, serving


class _HeldClaim:
    """Forward fences whose claim lasts until the test ends it, with ``holder``."""

    def __init__(self, lates: list[LateAnswer]) -> None:
        self.lates = lates  # the frames' late answers, for the test to wait on
        self.claiming = anyio.Event()
        self._end = anyio.Event()
        self._holder: Outcome = "taken"

    def end(self, holder: Outcome) -> None:
        self._holder = holder
        self._end.set()

    async def abandon(self, fence: Fence) -> Outcome:
        self.claiming.set()
        await self._end.wait()
        return self._holder


class _Client(ForwardClient):
    """The forward client, keeping each late answer it gave the router (``lates``)."""

    lates: list[LateAnswer]

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        try:
            return await super().append(groups)
        except ForwardUnknown as exc:
            if exc.late is not None:
                self.lates.append(exc.late)
            raise


Body = Callable[[AffinityRouter, _Local, FakeHandler, _HeldClaim], Awaitable[None]]


async def _with_peer(body: Body) -> CollectorRegistry:
    """A router forwarding partition 1 to a real forward server whose handler the test
    holds; the frame's wait is 0.1 s, its commit window an hour (an answer in doubt
    would come long after the test's bound)."""
    registry, lates = CollectorRegistry(), []
    handler, fences = FakeHandler(), _HeldClaim(lates)
    handler.release = anyio.Event()
    async with serving(handler) as (server, _):
        local = _Local()

        def client(member: object) -> ForwardClient:
            made = _Client(server.address, secret=SECRET, deadline_s=0.05,
                           answer_timeout_s=0.05, commit_window_s=3600,
                           metrics=ForwardMetrics(registry))
            made.lates = lates
            return made

        router = AffinityRouter(local, _Membership({1: "peer"}), client,  # type: ignore[arg-type]
                                lane_buffer_bytes=1 << 20, lane_max_bytes=1 << 20,
                                suspect_s=2, unanswered_suspect_s=17,
                                metrics=RouterMetrics(registry), fences=fences)  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            await tg.start(router.run)
            with anyio.fail_after(20):
                await body(router, local, handler, fences)
            router.close()
    return registry


async def _answered_during_claim(router: AffinityRouter, handler: FakeHandler,
                                 fences: _HeldClaim, holder: Outcome
                                 ) -> list[AppendOutcome]:
    """Submit two groups; the frame times out; while this broker's claim is open the
    peer answers; then the claim ends with ``holder``."""
    answered: list[AppendOutcome] = []

    async def submit() -> None:
        answered.extend(await router.submit([_group(1, "key-1"), _group(1)]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit)
        await fences.claiming.wait()  # the frame timed out, the peer still holds it
        assert handler.release is not None
        handler.release.set()
        (late,) = fences.lates
        assert await late.outcomes(time.monotonic() + 10) is not None  # it came
        fences.end(holder)
    return answered


@pytest.mark.parametrize("holder", ["taken", "error", "late"])
async def test_an_answer_that_came_during_the_claim_is_the_outcome_whoever_holds_the_fence(
        holder: Outcome) -> None:
    """However long the claim took (Oxia paused under both brokers), the frame kept its
    place: the peer's results answer the groups at once, not in doubt (whether after the
    window, for ``taken``, or at once, when the fence could not say)."""
    async def body(router: AffinityRouter, local: _Local, handler: FakeHandler,
                   fences: _HeldClaim) -> None:
        outcomes = await _answered_during_claim(router, handler, fences, holder)
        assert [type(o) for o in outcomes] == [AppendResult, AppendResult], outcomes
        assert [o.start_offset for o in outcomes] == [1, 2]  # type: ignore[union-attr]
        assert local.calls == []

    registry = await _with_peer(body)
    assert registry.get_sample_value("llog_forward_frames_total",
                                     {"member": "", "outcome": "late"}) == 1
    assert registry.get_sample_value("llog_affinity_groups_total",
                                     {"member": "", "route": "forwarded"}) == 2
    assert registry.get_sample_value("llog_affinity_groups_total",
                                     {"member": "", "route": "in_doubt"}) is None


async def test_a_frame_the_peer_answers_late_as_expired_is_appended_here() -> None:
    """The peer took the frame and its flush let it expire, unwritten (its commit window
    ran out under a paused store): the late EXPIRED means what it means on time, and the
    groups are appended here."""
    async def body(router: AffinityRouter, local: _Local, handler: FakeHandler,
                   fences: _HeldClaim) -> None:
        handler.fail_with = ForwardExpired("no flush took them in time")
        outcomes = await _answered_during_claim(router, handler, fences, "taken")
        assert [o.index_key for o in outcomes] == ["local", "local"]  # type: ignore[union-attr]
        assert len(local.calls) == 1

    registry = await _with_peer(body)
    assert registry.get_sample_value("llog_affinity_fallbacks_total",
                                     {"member": "", "reason": "expired"}) == 2


async def test_without_an_answer_a_claim_that_fails_answers_in_doubt_at_once() -> None:
    async def body(router: AffinityRouter, local: _Local, handler: FakeHandler,
                   fences: _HeldClaim) -> None:
        answered: list[AppendOutcome] = []

        async def submit() -> None:
            answered.extend(await router.submit([_group(1, "key-1")]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(submit)
            await fences.claiming.wait()
            fences.end("error")
        assert [type(o) for o in answered] == [CommitInDoubt] and local.calls == []
        assert handler.release is not None
        handler.release.set()  # the peer's answer, now, finds no place

    await _with_peer(body)
