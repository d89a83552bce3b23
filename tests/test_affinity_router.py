"""The affinity router's decisions: where each group goes, and what a failed forward
leaves (fallback here, or in doubt). Its parts are stand-ins: the local append and the
forward client are functions of this test, the membership a fixed view; the forward
wire itself is tested on real sockets in test_forward.py and the whole path on real
brokers in test_affinity.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from prometheus_client import CollectorRegistry

from app.cluster.fences import Fence, Outcome
from app.cluster.forward import ForwardNotWritten, ForwardUnknown
from app.cluster.router import AffinityRouter, RouterMetrics
from app.errors import BackPressureRejected, CommitInDoubt, ForwardExpired
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult
from app.storage.keys import TopicPartition


@dataclass(frozen=True)
class _Member:
    member_id: str
    forward: str = "127.0.0.1:1"


@dataclass
class _View:
    owners: dict[int, str]
    suspects: frozenset[str] = frozenset()

    def preferred(self, tp: TopicPartition) -> _Member | None:
        owner = self.owners.get(tp.partition)
        return None if owner is None else _Member(owner)


@dataclass
class _Membership:
    owners: dict[int, str]
    me: _Member = field(default_factory=lambda: _Member("me"))
    suspected: list[str] = field(default_factory=list)
    suspected_for: list[float] = field(default_factory=list)

    def view(self) -> _View:
        return _View(self.owners, frozenset(self.suspected))

    def suspect(self, member_id: str, for_s: float) -> None:
        self.suspected.append(member_id)
        self.suspected_for.append(for_s)


def _result(group: AppendGroup, where: str) -> AppendResult:
    return AppendResult(group.tp, 1, len(group.records), len(group.records), where, where)


class _Client:
    """A forward client whose answer the test chooses."""

    def __init__(self, answer: object = None) -> None:
        self.answer = answer
        self.frames: list[list[AppendGroup]] = []
        self.gate: anyio.Event | None = None
        self.expiring: set[int] = set()  # partitions whose groups the peer lets expire
        self._sent = anyio.Event()

    async def sent(self, n: int) -> None:
        """Until ``n`` frames have gone out."""
        while len(self.frames) < n:
            await self._sent.wait()

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        self.frames.append(list(groups))
        self._sent.set()
        self._sent = anyio.Event()
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.answer, Exception):
            raise self.answer
        if self.answer == "expire-first":
            return [ForwardExpired("late") if i == 0 else _result(g, "peer")
                    for i, g in enumerate(groups)]
        return [ForwardExpired("late") if g.tp.partition in self.expiring
                else _result(g, "peer") for g in groups]

    async def aclose(self) -> None:
        pass


class _Local:
    def __init__(self) -> None:
        self.calls: list[list[AppendGroup]] = []
        self.refuse: Exception | None = None

    async def __call__(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        self.calls.append(list(groups))
        if self.refuse is not None:
            raise self.refuse
        return [_result(g, "local") for g in groups]


class _Fences:
    """Forward fences whose race the test decides: ``holder`` is what abandoning finds."""

    def __init__(self, holder: Outcome) -> None:
        self.holder: Outcome = holder
        self.abandoned: list[Fence] = []

    async def abandon(self, fence: Fence) -> Outcome:
        self.abandoned.append(fence)
        return self.holder


def _group(partition: int, key: str | None = None) -> AppendGroup:
    return AppendGroup(TopicPartition("t", partition), [b"x"], key)


async def _with_router(owners: dict[int, str], client: _Client, body,  # type: ignore[no-untyped-def]
                       registry: CollectorRegistry | None = None,
                       fences: _Fences | None = None):
    local, membership = _Local(), _Membership(owners)
    registry = CollectorRegistry() if registry is None else registry
    router = AffinityRouter(local, membership, lambda member: client,  # type: ignore[arg-type]
                            lane_buffer_bytes=1 << 20, lane_max_bytes=1 << 20, suspect_s=2,
                            unanswered_suspect_s=17, metrics=RouterMetrics(registry),
                            fences=fences)  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        await tg.start(router.run)
        with anyio.fail_after(10):
            await body(router, local, membership)
        router.close()


async def test_each_group_goes_to_its_preferred_member_and_outcomes_keep_their_order(
) -> None:
    client = _Client()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(0), _group(1), _group(2), _group(3)])
        assert [o.index_key for o in outcomes] == ["local", "peer", "local", "peer"]
        assert [[g.tp.partition for g in f] for f in client.frames] == [[1, 3]]
        assert [[g.tp.partition for g in c] for c in local.calls] == [[0, 2]]

    await _with_router({0: "me", 1: "peer", 2: "me", 3: "peer"}, client, body)


async def test_no_preferred_member_appends_here() -> None:
    client = _Client()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(5)])
        assert [o.index_key for o in outcomes] == ["local"]
        assert client.frames == []

    await _with_router({}, client, body)


async def test_a_forward_not_written_is_appended_here_and_an_unreachable_peer_suspected(
) -> None:
    client = _Client(ForwardNotWritten("unreachable", "connection refused"))

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1), _group(1, "k")])
        assert [o.index_key for o in outcomes] == ["local", "local"]
        assert membership.suspected == ["peer"]
        assert membership.suspected_for == [2]  # a refused connection is cheap to retry

    await _with_router({1: "peer"}, client, body)


FENCE = Fence(1_700_000_000_000, "me.c0ffee.1")


async def test_an_unanswered_forward_whose_fence_the_peer_took_is_in_doubt_keyed_or_not(
) -> None:
    """The peer took the frame: it may write it whenever its store answers, so nothing is
    appended here, not even under an idempotency key (past its window a second append
    would be a second copy)."""
    client = _Client(ForwardUnknown("broken", "connection reset after the frame", FENCE))
    fences = _Fences("taken")

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1), _group(1, "key-1")])
        assert all(type(o) is CommitInDoubt for o in outcomes), outcomes
        assert local.calls == []
        assert fences.abandoned == [FENCE]

    await _with_router({1: "peer"}, client, body, fences=fences)


async def test_a_frame_the_peer_took_is_answered_once_its_window_is_over_holding_no_lane(
) -> None:
    """The peer took the frame and may read a version to commit it with until its
    commit window is over: the answer in doubt waits for that, in the request, so that
    a client's resend cannot race a late first copy; the lane's flush is over
    meanwhile, and both of its slots carry other frames."""
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline", FENCE,
                                    window_s=3600))
    fences = _Fences("taken")

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        answered: list[list[AppendOutcome]] = []
        async with anyio.create_task_group() as tg:
            async def submit(partition: int) -> None:
                answered.append(await router.submit([_group(partition, "key")]))

            tg.start_soon(submit, 1)
            await client.sent(1)
            await wait_all_tasks_blocked()
            assert fences.abandoned == [FENCE] and answered == []  # waiting, unanswered
            membership.suspected.clear()  # the peer is tried again
            client.answer, client.gate = None, anyio.Event()
            tg.start_soon(submit, 1)
            await client.sent(2)
            tg.start_soon(submit, 1)
            await client.sent(3)  # two frames out at once: no lane slot is held
            client.gate.set()
            while len(answered) < 2:
                await wait_all_tasks_blocked()
            assert [o.index_key for a in answered for o in a] == ["peer", "peer"]  # type: ignore[union-attr]
            tg.cancel_scope.cancel()
        assert local.calls == []

    await _with_router({1: "peer"}, client, body, fences=fences)


class _Late:
    """A late answer whose arrival the test decides (``answer``), or never."""

    def __init__(self) -> None:
        self.outcomes_: list[AppendOutcome] | None = None
        self.arrived = anyio.Event()
        self.kept_until: list[float] = []
        self.released = False

    def answer(self, outcomes: list[AppendOutcome] | None) -> None:
        self.outcomes_ = outcomes
        self.arrived.set()

    def keep_until(self, when: float) -> None:
        self.kept_until.append(when)

    def release(self) -> None:
        self.released = True

    async def outcomes(self, until: float) -> list[AppendOutcome] | None:
        with anyio.move_on_after(until - time.monotonic()):
            await self.arrived.wait()
        return self.outcomes_


async def test_the_peers_late_answer_settles_a_frame_it_took_before_its_window_is_over(
) -> None:
    """The frame timed out, the peer took it, and then its answer came after all: each
    group gets the peer's own outcome at once, not in doubt after the window; a group
    the peer let expire (not written) is appended here, as from a timely answer."""
    late = _Late()
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline", FENCE,
                                    window_s=3600, late=late))  # type: ignore[arg-type]
    fences = _Fences("taken")

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        groups = [_group(1, "key-1"), _group(1), _group(1, "key-2")]
        async with anyio.create_task_group() as tg:
            answered: list[list[AppendOutcome]] = []

            async def submit() -> None:
                answered.append(await router.submit(groups))

            tg.start_soon(submit)
            await client.sent(1)
            await wait_all_tasks_blocked()
            assert answered == [] and len(late.kept_until) == 1  # until the window is over
            assert late.kept_until[0] > time.monotonic() + 3500
            late.answer([_result(groups[0], "peer"), ForwardExpired("late"),
                         _result(groups[2], "peer")])
        (outcomes,) = answered
        assert [o.index_key for o in outcomes] == ["peer", "local", "peer"]  # type: ignore[union-attr]
        assert local.calls == [[groups[1]]] and not late.released

    await _with_router({1: "peer"}, client, body, fences=fences)


@pytest.mark.parametrize("holder", ["abandoned", "error"])
async def test_a_late_answer_is_not_waited_for_when_the_fence_settles_or_cannot_bound_it(
        holder: Outcome) -> None:
    late = _Late()
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline", FENCE,
                                    window_s=3600, late=late))  # type: ignore[arg-type]

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1, "key-1")])
        expected = AppendResult if holder == "abandoned" else CommitInDoubt
        assert [type(o) for o in outcomes] == [expected]
        assert late.released and late.kept_until == []

    await _with_router({1: "peer"}, client, body, fences=_Fences(holder))


async def test_a_frame_whose_fence_cannot_be_settled_is_answered_in_doubt_at_once(
) -> None:
    """Oxia did not say who holds the fence: no bound on a late commit is known, so
    there is nothing to wait for."""
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline", FENCE,
                                    window_s=3600))
    fences = _Fences("error")

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1, "key-1")])
        assert [type(o) for o in outcomes] == [CommitInDoubt] and local.calls == []

    await _with_router({1: "peer"}, client, body, fences=fences)


async def test_an_unanswered_forward_whose_fence_this_broker_won_is_appended_here() -> None:
    """This broker holds the fence: the peer will never write the frame, so every group
    is appended here, keyed or not, and none is in doubt."""
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline", FENCE))
    fences = _Fences("abandoned")
    registry = CollectorRegistry()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1), _group(1, "key-1")])
        assert [o.index_key for o in outcomes] == ["local", "local"]  # type: ignore[union-attr]
        assert [[g.idempotency_key for g in c] for c in local.calls] == [[None, "key-1"]]
        assert registry.get_sample_value(
            "llog_affinity_fallbacks_total", {"member": "", "reason": "abandoned"}) == 2

    await _with_router({1: "peer"}, client, body, registry, fences)


async def test_an_unanswered_forward_without_fences_is_in_doubt() -> None:
    client = _Client(ForwardUnknown("broken", "connection reset after the frame", FENCE))

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1), _group(1, "key-1")])
        assert all(isinstance(o, CommitInDoubt) for o in outcomes), outcomes
        assert local.calls == []

    await _with_router({1: "peer"}, client, body)


async def test_groups_queued_for_a_peer_that_stopped_answering_are_appended_here_unsent(
) -> None:
    """Both of the lane's frames hang; the groups that wait behind them must not be sent
    to the same peer when the first frame's answer times out: it is suspected, for as
    long as its session could outlive it, and they are appended here instead."""
    client = _Client(ForwardUnknown("timeout", "no answer within the deadline"))
    client.gate = anyio.Event()
    registry = CollectorRegistry()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        results: dict[int, list[AppendOutcome]] = {}

        async def one(i: int) -> None:
            results[i] = await router.submit([_group(1)])

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await client.sent(1)
            tg.start_soon(one, 1)
            await client.sent(2)  # both slots hang at the gate
            for i in range(2, 5):
                tg.start_soon(one, i)  # these wait in the lane's buffer
            await wait_all_tasks_blocked()
            client.gate.set()
        assert len(client.frames) == 2  # the queued groups never went out
        assert all(isinstance(results[i][0], CommitInDoubt) for i in (0, 1))
        assert all(results[i][0].index_key == "local" for i in range(2, 5))  # type: ignore[union-attr]
        assert membership.suspected_for and set(membership.suspected_for) == {17}
        assert registry.get_sample_value(
            "llog_affinity_fallbacks_total", {"member": "", "reason": "suspected"}) == 3

    await _with_router({1: "peer"}, client, body, registry)


async def test_groups_the_peer_let_expire_are_appended_here() -> None:
    client = _Client("expire-first")

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(1), _group(3)])
        assert [o.index_key for o in outcomes] == ["local", "peer"]

    await _with_router({1: "peer", 3: "peer"}, client, body)


async def test_requests_arriving_while_a_frame_is_in_flight_share_the_next_frame() -> None:
    client = _Client()
    client.gate = anyio.Event()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        results: list[list[AppendOutcome]] = []

        async def one(partition: int) -> None:
            results.append(await router.submit([_group(partition)]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 1)
            await client.sent(1)  # the first frame is out, held at the gate
            tg.start_soon(one, 1)  # the lane has two slots: this one goes out too
            await client.sent(2)
            for _ in range(5):  # both slots busy: these wait in the lane's buffer
                tg.start_soon(one, 1)
            await wait_all_tasks_blocked()
            client.gate.set()
        assert len(results) == 7
        assert [len(f) for f in client.frames] == [1, 1, 5]

    await _with_router({1: "peer"}, client, body)


async def test_after_close_every_group_is_appended_here() -> None:
    client = _Client()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        router.close()
        outcomes = await router.submit([_group(1)])
        assert [o.index_key for o in outcomes] == ["local"]

    await _with_router({1: "peer"}, client, body)


async def test_a_lane_that_fails_unexpectedly_fails_only_the_groups_it_carried() -> None:
    client = _Client(RuntimeError("a bug in the wire"))

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        outcomes = await router.submit([_group(0), _group(1)])
        assert isinstance(outcomes[0], AppendResult) and outcomes[0].index_key == "local"
        # The frame may have gone out before the failure: never appended again here.
        assert isinstance(outcomes[1], CommitInDoubt)
        assert [[g.tp.partition for g in c] for c in local.calls] == [[0]]

    await _with_router({0: "me", 1: "peer"}, client, body)


@pytest.mark.parametrize(("refusal", "answer"), [
    (BackPressureRejected("buffer full"), BackPressureRejected),
    (RuntimeError("a defect"), CommitInDoubt)], ids=["refused", "failed"])
async def test_a_refused_fallback_answers_the_expired_groups_alone_the_peers_answers_stand(
        refusal: Exception, answer: type[Exception]) -> None:
    """The peer answered a frame in part: one group expired unwritten (its commit window
    ended), the others committed, another request's among them. This broker refuses the
    expired group too (its buffer is full), or its append fails unexpectedly (then it
    may have written: in doubt): that answers it alone; the groups the peer committed
    keep their results, in this request and the other."""
    client = _Client()
    client.expiring, client.gate = {1}, anyio.Event()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        local.refuse = refusal
        answers: dict[str, list[AppendOutcome]] = {}

        async def submit(name: str, groups: list[AppendGroup]) -> None:
            answers[name] = await router.submit(groups)

        async with anyio.create_task_group() as tg:
            for n, name in enumerate(("ahead-1", "ahead-2"), 1):
                tg.start_soon(submit, name, [_group(3)])
                await client.sent(n)  # both of the lane's slots held: the next two
            tg.start_soon(submit, "first", [_group(1), _group(3)])  # requests share
            tg.start_soon(submit, "other", [_group(3, "key-1")])  # the next frame
            await wait_all_tasks_blocked()
            client.gate.set()
        assert [[g.tp.partition for g in f] for f in client.frames] == [[3], [3], [1, 3, 3]]
        expired, committed = answers["first"]
        assert type(expired) is answer
        assert isinstance(committed, AppendResult) and committed.index_key == "peer"
        (other,) = answers["other"]
        assert isinstance(other, AppendResult) and other.index_key == "peer"
        assert [[g.tp.partition for g in c] for c in local.calls] == [[1]]

    await _with_router({1: "peer", 3: "peer"}, client, body)


async def test_a_local_refusal_answers_its_groups_and_the_forwarded_ones_keep_theirs(
) -> None:
    client = _Client()

    async def body(router: AffinityRouter, local: _Local, membership: _Membership) -> None:
        local.refuse = BackPressureRejected("buffer full")
        outcomes = await router.submit([_group(0), _group(1)])
        assert isinstance(outcomes[0], BackPressureRejected)
        assert isinstance(outcomes[1], AppendResult) and outcomes[1].index_key == "peer"

    await _with_router({0: "me", 1: "peer"}, client, body)
