"""Preferred appenders: each partition's records go to the member that prefers it.

Any broker may append to any partition (the commit's compare-and-set keeps that safe),
but when every broker appends to every partition their commits collide on each
partition's control record, and each collision costs a re-read and a retry. The router
splits a produce request's groups by their preferred member (rendezvous hashing over the
live members, :mod:`app.cluster.membership`): its own go to the local batcher, the
others to one *lane* per peer, a batcher whose flush is one forward frame
(:mod:`app.cluster.forward`). Lanes coalesce across requests: while a peer's frames are in
flight the lane's buffer grows, so the frames per second track the peer's flushes, not
the requests.

What a forward may leave behind decides what happens next, and never a blind second
append:

- definitely not written (the peer refused, could not be reached, or let the deadline
  pass before its flush took the records): appended here instead (``fallback``);
- maybe written (the connection broke after the frame went out, or no answer in time):
  the frame's fence settles it (:mod:`app.cluster.fences`). If this broker's claim wins,
  the peer will never write the frame, and its groups are appended here
  (``abandoned``); if the peer took the frame first, or Oxia cannot say, every group is
  answered :class:`~app.errors.CommitInDoubt`, as a client of a broker that died
  mid-request is, keyed or not: appending a keyed group here as well could write it
  twice once its key has left the partition's window of recent keys.

  When the peer took the frame, that answer waits out the frame's commit window (and a
  margin) from the moment the fence said so: by then the peer sends no commit of the
  frame but one expecting a control version it read before, so a client that sends the
  records again under their keys cannot race a late first copy. The wait is the
  request's own, after the lane's flush, so it holds no flush slot of the lane. If the
  frame only timed out, the peer's answer may still come on the same connection
  meanwhile (a peer whose store paused commits the frame once it answers): that answer
  settles the groups for certain (:class:`~app.cluster.forward.LateAnswer`), and no
  client is left to resend records that are in the log. When
  Oxia could not say who holds the fence, no such bound is known: answered at once.

  Of a frame answered in part (some groups expired at the peer, unwritten), the expired
  groups are appended here; if this broker refuses them too, that refusal answers them
  alone: the peer's answers of the others stand.

A peer that could not be reached is suspected briefly (a refused connection costs little
to try again); one that took a frame and did not answer, for as long as its Oxia session
could outlive it, so that a hung peer leaves the view before it is tried again rather
than costing each round of clients an answer timeout and an answer in doubt. Groups that
waited in a lane's buffer while its peer became suspect are appended here, unsent.

A forwarded frame is appended by the receiver itself and never forwarded again, so two
brokers whose views of the members disagree cannot bounce records between them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Counter

from app.batching.batcher import Batcher
from app.cluster.fences import ANSWER_MARGIN_S, Fence, ForwardFences, Outcome
from app.cluster.forward import ForwardClient, ForwardNotWritten, ForwardUnknown, LateAnswer
from app.cluster.membership import BrokerMember, ClusterMembership
from app.errors import CommitInDoubt, ForwardExpired, LlogError, Unavailable
from app.storage.appends import AppendGroup, AppendOutcome

log = logging.getLogger(__name__)

ClientFactory = Callable[[BrokerMember], ForwardClient]
SubmitFn = Callable[[Sequence[AppendGroup]], Awaitable[list[AppendOutcome]]]


class RouterMetrics:
    """``member`` labels every series, so the workers of one server stay apart."""

    def __init__(self, registry: CollectorRegistry, member: str = "") -> None:
        groups = Counter(
            "llog_affinity_groups", "Produce groups by where they were appended: local "
            "(this member is preferred), forwarded (its preferred member appended it), "
            "fallback (a forward that was not written, appended here), in_doubt (a "
            "forward left unanswered that this broker could not show unwritten: its "
            "peer took it and did not answer by the end of its commit window, or its "
            "fence could not be settled; answered CommitInDoubt)",
            ["member", "route"], registry=registry)
        fallbacks = Counter(
            "llog_affinity_fallbacks", "Forwarded groups appended here instead, by why "
            "(unreachable, refused, expired, closed: not written; abandoned: unanswered, "
            "and this broker won the frame's fence, so its peer never writes it; left: "
            "the peer left the view; suspected: the peer was found down while the groups "
            "waited in its lane; BackPressureRejected, ShuttingDown: the lane took "
            "nothing)",
            ["member", "reason"], registry=registry)
        self._groups, self._fallbacks, self._member = groups, fallbacks, member

    def routed(self, route: str, n: int) -> None:
        if n:
            self._groups.labels(self._member, route).inc(n)

    def fell_back(self, reason: str, n: int) -> None:
        if n:
            self._fallbacks.labels(self._member, reason).inc(n)


class _InDoubtFrom(CommitInDoubt):
    """A group of a frame its peer took: in doubt, to be answered no sooner than
    ``answer_at`` (``time.monotonic()``), once the frame's commit window and
    :data:`~app.cluster.fences.ANSWER_MARGIN_S` have passed; unless the peer's late
    answer (``late``, the group being its ``index``-th) comes first and settles it.
    Made by a lane's flush, waited out by the request (``AffinityRouter._when_due``)."""

    def __init__(self, message: str, answer_at: float, late: LateAnswer | None = None,
                 index: int = 0) -> None:
        super().__init__(message)
        self.answer_at = answer_at
        self.late = late
        self.index = index

    async def settle(self) -> AppendOutcome | None:
        """The peer's outcome if its answer comes by ``answer_at`` (``ForwardExpired``
        among them: not written); None once ``answer_at`` has passed without one."""
        if self.late is not None:
            outcomes = await self.late.outcomes(self.answer_at)
            if outcomes is not None:
                return outcomes[self.index]
        await anyio.sleep(max(0.0, self.answer_at - time.monotonic()))
        return None


class _Lane:
    """Groups on their way to one peer: a batcher whose flush is one forward frame."""

    def __init__(self, peer: BrokerMember, client: ForwardClient, batcher: Batcher) -> None:
        self.peer = peer
        self.client = client
        self.batcher = batcher


class AffinityRouter:
    """Appends a request's groups where their partitions are preferred (see module)."""

    def __init__(self, local: SubmitFn, membership: ClusterMembership, clients: ClientFactory, *,
                 lane_buffer_bytes: int, lane_max_bytes: int, suspect_s: float,
                 unanswered_suspect_s: float, metrics: RouterMetrics,
                 fences: ForwardFences | None, lane_inflight: int = 2) -> None:
        self._local = local
        self._fences = fences  # None: every unanswered frame is in doubt
        self._membership = membership
        self._clients = clients
        self._lane_buffer = lane_buffer_bytes
        self._lane_max_bytes = lane_max_bytes
        self._lane_inflight = lane_inflight
        self._suspect_s = suspect_s
        self._unanswered_suspect_s = max(suspect_s, unanswered_suspect_s)
        self._metrics = metrics
        self._lanes: dict[str, _Lane] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._closed = anyio.Event()
        self.stopped = anyio.Event()  # run() has returned: every lane answered

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Hold the lanes' flushers; returns once :meth:`close` has drained them."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                task_status.started()
                await self._closed.wait()
                for lane in list(self._lanes.values()):
                    lane.batcher.close()
        finally:
            self._tg = None
            for lane in list(self._lanes.values()):
                await _close_quietly(lane.client)
            self.stopped.set()

    def close(self) -> None:
        """From now on every group is appended here; buffered forwards still go out."""
        self._closing = True
        self._closed.set()

    async def submit(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """Append ``groups``, each where its partition is preferred; outcomes in order."""
        routes = self._route(groups)
        if set(routes) <= {None}:
            self._metrics.routed("local", len(groups))
            return await self._local(groups)
        outcomes: list[AppendOutcome | None] = [None] * len(groups)

        async def run(member_id: str | None, indexes: list[int]) -> None:
            part = [groups[i] for i in indexes]
            try:
                if member_id is None:
                    self._metrics.routed("local", len(part))
                    got = await self._local(part)
                else:
                    got = await self._forwarded(member_id, part)
            except LlogError as exc:  # refused as a whole: these groups, not the request
                got = [exc] * len(part)
            for i, outcome in zip(indexes, got, strict=True):
                outcomes[i] = outcome

        async with anyio.create_task_group() as tg:
            for member_id, indexes in routes.items():
                tg.start_soon(run, member_id, indexes)
        assert all(o is not None for o in outcomes)
        return [o for o in outcomes if o is not None]

    def _route(self, groups: Sequence[AppendGroup]) -> dict[str | None, list[int]]:
        """Group indexes by the member to append them (None: here). One request's groups
        of a partition all go one way, so their order within the partition holds."""
        routes: dict[str | None, list[int]] = {}
        me = self._membership.me.member_id
        view = self._membership.view()
        for i, group in enumerate(groups):
            member = None if self._closing else view.preferred(group.tp)
            if member is None or member.member_id == me or self._lane(member) is None:
                routes.setdefault(None, []).append(i)
            else:
                routes.setdefault(member.member_id, []).append(i)
        return routes

    def _lane(self, peer: BrokerMember) -> _Lane | None:
        lane = self._lanes.get(peer.member_id)
        if lane is not None and lane.peer == peer:
            return lane
        if self._tg is None:
            return None  # not running (starting or stopped): append here
        if lane is not None:  # the member came back as another incarnation or address
            lane.batcher.close()
        client = self._clients(peer)
        lane = _Lane(peer, client, Batcher(
            lambda groups: self._send(peer, client, groups), max_bytes=self._lane_max_bytes,
            max_delay_s=0, buffer_max_bytes=self._lane_buffer,
            max_inflight_flushes=self._lane_inflight, sequence_gate=False))
        self._lanes[peer.member_id] = lane
        self._tg.start_soon(self._run_lane, lane)
        return lane

    async def _run_lane(self, lane: _Lane) -> None:
        try:
            await lane.batcher.run()
        except Exception:  # its waiters were failed by the batcher itself
            log.exception("the forward lane to %s stopped", lane.peer.member_id)
        finally:
            if self._lanes.get(lane.peer.member_id) is lane:
                del self._lanes[lane.peer.member_id]
            await _close_quietly(lane.client)

    async def _forwarded(self, member_id: str, groups: list[AppendGroup]
                         ) -> list[AppendOutcome]:
        lane = self._lanes.get(member_id)
        if lane is None:
            return await self._fallback(groups, "left")
        try:
            outcomes = await lane.batcher.submit(groups)
        except Unavailable as exc:  # the lane is full or closing: nothing was sent
            return await self._fallback(groups, type(exc).__name__)
        except LlogError as exc:  # the lane's flush failed: only these groups share it
            return [exc] * len(groups)
        return await self._when_due(groups, outcomes)

    async def _when_due(self, groups: list[AppendGroup], outcomes: list[AppendOutcome]
                        ) -> list[AppendOutcome]:
        """``outcomes`` once no group of theirs can be committed by a peer but with a
        control version it read before: the peer's late answer (groups it let expire
        are appended here, as from a timely one), or after the latest ``answer_at``
        among them, as plain CommitInDoubt."""
        waiting = [i for i, o in enumerate(outcomes) if isinstance(o, _InDoubtFrom)]
        if not waiting:
            return outcomes
        # At shutdown the server lets requests in flight finish for 30 s, usually long
        # enough; a request it cuts short is unanswered, which is no less safe: its
        # client resends after its timeout (docs/protocol.md, Forward fences).
        settled, answered = list(outcomes), []
        for i in waiting:
            doubt = outcomes[i]
            assert isinstance(doubt, _InDoubtFrom)
            late = await doubt.settle()
            if late is None:
                settled[i] = CommitInDoubt(str(doubt))
            else:
                settled[i] = late
                answered.append(i)
        self._metrics.routed("in_doubt", len(waiting) - len(answered))
        return await self._answered(groups, settled, answered)

    async def _answered(self, groups: Sequence[AppendGroup], outcomes: list[AppendOutcome],
                        among: Sequence[int] | None = None) -> list[AppendOutcome]:
        """``outcomes``, the peer's answer of the groups at ``among`` (all by default):
        those it let expire, unwritten, are appended here instead."""
        among = range(len(groups)) if among is None else among
        expired = [i for i in among if isinstance(outcomes[i], ForwardExpired)]
        self._metrics.routed("forwarded", len(among) - len(expired))
        await self._fall_back_at(groups, expired, outcomes, "expired")
        return outcomes

    async def _send(self, peer: BrokerMember, client: ForwardClient,
                    groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        """One lane flush: a forward frame, with the outcome rules of the module."""
        if peer.member_id in self._membership.view().suspects:
            # Queued while an earlier frame found the peer down: nothing was sent.
            return await self._fallback(list(groups), "suspected")
        try:
            outcomes = await client.append(groups)
        except ForwardNotWritten as exc:
            if exc.reason == "unreachable":
                self._membership.suspect(peer.member_id, self._suspect_s)
            return await self._fallback(list(groups), exc.reason)
        except ForwardUnknown as exc:
            self._membership.suspect(peer.member_id, self._unanswered_suspect_s)
            return await self._unknown(peer, list(groups), exc)
        return await self._answered(groups, outcomes)

    async def _fallback(self, groups: list[AppendGroup], reason: str
                        ) -> list[AppendOutcome]:
        self._metrics.routed("fallback", len(groups))
        self._metrics.fell_back(reason, len(groups))
        return await self._local(groups)

    async def _unknown(self, peer: BrokerMember, groups: list[AppendGroup], exc: ForwardUnknown
                       ) -> list[AppendOutcome]:
        """A frame without a verdict: appended here if this broker wins its fence, in
        doubt otherwise; waited out (by the request) if the peer took it, unless the
        peer's answer comes meanwhile (``exc.late``)."""
        late = exc.late
        try:
            holder = await self._fence_holder(exc.fence)
        except BaseException:  # cancelled: nobody is left to read a late answer
            if late is not None:
                late.release()
            raise
        if late is not None and holder != "taken":
            # An answer that came during the claim is the peer's verdict, whoever holds
            # the fence now; none has come: the fence says what happens, at once.
            answered = await late.outcomes(time.monotonic())
            late.release()
            if answered is not None:
                return await self._answered(groups, list(answered))
        if holder == "abandoned":
            log.warning("forward to %s went unanswered (%s); its fence was won, so it is "
                        "appended here", peer.member_id, exc)
            return await self._fallback(groups, "abandoned")
        why = (f"forwarded to the partition's preferred broker, which did not answer "
               f"({exc}); the records may have been written")
        if holder != "taken":  # nobody can say: no bound on a late commit is known
            log.warning("forward to %s may have been written, and its fence did not say "
                        "by whom (%s): %s", peer.member_id, holder, exc)
            self._metrics.routed("in_doubt", len(groups))
            return [CommitInDoubt(why) for _ in groups]
        # The peer's claim landed before this broker found out, and began earlier still:
        # the window, counted from here, ends after the peer's commit_by.
        answer_at = time.monotonic() + exc.window_s + ANSWER_MARGIN_S
        if late is not None:
            late.keep_until(answer_at)
        log.warning("forward to %s may have been written (it took the frame): %s; "
                    "answered in doubt in %.1f s, past its commit window, unless it "
                    "answers by then", peer.member_id, exc, exc.window_s + ANSWER_MARGIN_S)
        return [_InDoubtFrom(f"{why}; sent again under their idempotency keys, they are "
                             "kept single", answer_at, late, i)
                for i in range(len(groups))]

    async def _fence_holder(self, fence: Fence | None) -> Outcome | None:
        """Who holds the frame's fence once this broker has claimed it; None if there is
        no fence to claim."""
        if self._fences is None or fence is None:
            return None
        try:
            return await self._fences.abandon(fence)
        except Exception:  # a claim that cannot say: the groups stay in doubt
            log.exception("claiming a forward fence failed unexpectedly")
            return "error"

    async def _fall_back_at(self, groups: Sequence[AppendGroup], indexes: list[int],
                            outcomes: list[AppendOutcome], reason: str) -> None:
        """Append the groups at ``indexes`` here instead, their outcomes put in place. A
        refusal here answers those groups only: the others keep the peer's outcomes
        (committed, some of them), and may belong to other requests; so does a failure
        of any other kind, which must not fail the lane's whole flush."""
        if indexes:
            try:
                again = await self._fallback([groups[i] for i in indexes], reason)
            except LlogError as exc:  # nothing of these was written, here or there
                again = [exc] * len(indexes)
            except Exception as exc:  # a defect: the local append may have written
                log.exception("appending %d groups the peer let expire failed "
                              "unexpectedly", len(indexes))
                again = [CommitInDoubt(f"appending here the records the partition's "
                                       f"preferred broker let expire failed: {exc!r}; "
                                       "they may have been written")] * len(indexes)
            for i, outcome in zip(indexes, again, strict=True):
                outcomes[i] = outcome


async def _close_quietly(client: ForwardClient) -> None:
    try:
        with anyio.move_on_after(5, shield=True):
            await client.aclose()
    except Exception as exc:
        log.warning("closing a forward client failed: %s", exc)

