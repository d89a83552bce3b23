"""This worker as a cluster member (``LLOG_AFFINITY`` on, with the write role), and the
members every broker shows its clients.

:func:`join_cluster` takes the worker's slot, listens for the appends other members
forward here, registers the member with a first view of the cluster and starts the
affinity router, all before the broker reports ready. A broker outside any cluster is
:class:`Solo`: it sees no members, and its produce answers carry no digest.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.abc

from app.batching.batcher import Batcher
from app.broker.appends import FORWARD_DRAIN_S
from app.broker.topic_view import TopicDirectory
from app.cluster.fences import Fence, FenceMetrics, ForwardFences, claim_budget_for
from app.cluster.forward import ForwardClient, ForwardMetrics, ForwardServer
from app.cluster.members import BrokerMember, MemberView
from app.cluster.membership import ClusterMembership
from app.cluster.router import AffinityRouter, RouterMetrics
from app.cluster.slots import member_id, take_slot
from app.errors import InvalidRequest, LlogError
from app.storage.appends import AppendGroup, AppendOutcome
from app.storage.keys import KeyLayout
from app.stores.oxia.store import OxiaStore

if TYPE_CHECKING:
    from app.broker.process import BrokerProcess

log = logging.getLogger(__name__)

# A peer whose forward listener could not be reached is passed over for this long.
FORWARD_SUSPECT_S = 2.0


class Members(Protocol):
    """The broker members as this broker sees them (``GET /cluster``, the console)."""

    def view(self) -> MemberView: ...

    def digest(self) -> str | None:
        """What a produce answer announces of the members (None: nothing)."""
        ...


class Solo:
    """A broker outside any cluster (LLOG_AFFINITY off, or no write role)."""

    def view(self) -> MemberView:
        return MemberView()

    def digest(self) -> str | None:
        return None


@dataclass(frozen=True)
class ClusterSide:
    membership: ClusterMembership
    router: AffinityRouter  # produce appends through it (app/broker/appends.py)
    server: ForwardServer  # the appends other members forward here
    address: str  # "host:port" of the forward listener, as the member record announces it

    def view(self) -> MemberView:
        return self.membership.view()

    def digest(self) -> str | None:
        return self.membership.view().digest

    async def leave(self) -> None:
        """Leave the cluster as the broker drains: peers move its partitions meanwhile."""
        try:
            await self.membership.leave()
        except (LlogError, TimeoutError) as exc:
            log.warning("could not leave the cluster (the member record goes with "
                        "the Oxia session): %r", exc)

    async def answer_forwarded(self, batcher: Batcher) -> None:
        """Once the forward listener is closed and the batcher closing: until every frame
        the listener took is answered. Once the batcher's last flushes have committed
        them (however long they take: shutdown waits for the batcher anyway), the
        answers have FORWARD_DRAIN_S to go out. A frame cut off unanswered leaves its
        forwarder in doubt, and its client sends again what may well be committed
        already."""
        await batcher.finished.wait()
        with anyio.move_on_after(FORWARD_DRAIN_S, shield=True):
            await self.server.stopped.wait()


async def join_cluster(process: BrokerProcess, oxia: OxiaStore, layout: KeyLayout,
                       batcher: Batcher, topics: TopicDirectory, tg: anyio.abc.TaskGroup,
                       stack: contextlib.AsyncExitStack) -> ClusterSide:
    """Take this worker's slot, listen for forwarded appends, register as a member with
    a first view of the cluster, and route produce through the affinity router; the
    loops run in ``tg``, watched (app/service_health.py)."""
    s, c, watched = process.settings, process.settings.cluster, process.health.watched
    slot = await anyio.to_thread.run_sync(take_slot, process.registry.shared_dir)
    stack.callback(slot.release)
    if c.forward_advertised_address and slot.index > 0:
        # Every worker would announce the one address, and all forwards reach one of them.
        raise ValueError("LLOG_FORWARD_ADVERTISED_ADDRESS names one listener: run one "
                         "worker per process with it")
    try:
        me_id = member_id(s.broker_id, slot.index)
    except InvalidRequest:
        raise ValueError(f"LLOG_BROKER_ID {s.broker_id!r} cannot name a cluster member "
                         "(LLOG_AFFINITY): up to 60 characters of [A-Za-z0-9._-]") from None
    secret = None if c.cluster_secret is None else c.cluster_secret.get_secret_value()
    forward_metrics = ForwardMetrics(process.registry, member=me_id)
    claim_budget_s = claim_budget_for(s.oxia_request_timeout_s)
    fences = ForwardFences(oxia, layout, FenceMetrics(process.registry, member=me_id),
                           claim_budget_s=claim_budget_s)
    server = await _serve_forwarded(process, batcher, topics, fences, secret,
                                    forward_metrics, tg, stack)
    address = c.forward_advertised_address or server.address
    me = BrokerMember(me_id, s.broker_id, s.broker_url, address, tuple(s.roles),
                      uuid.uuid4().hex)
    membership = ClusterMembership(oxia, layout, me, refresh_s=c.membership_refresh_s,
                                   registry=process.registry,
                                   call_timeout_s=s.oxia_request_timeout_s * 2 + 5)
    with anyio.fail_after(30):
        await tg.start(watched, membership.run)
    with anyio.fail_after(30):
        await tg.start(watched, fences.run)

    def client(peer: BrokerMember) -> ForwardClient:
        # Fence tokens name this member and the client: each client counts frames anew.
        return ForwardClient(peer.forward, secret=secret,
                             deadline_s=c.forward_deadline_ms / 1000,
                             answer_timeout_s=c.forward_answer_timeout_ms / 1000,
                             metrics=forward_metrics,
                             fence_prefix=f"{me_id}.{uuid.uuid4().hex}",
                             claim_budget_s=claim_budget_s)

    router = AffinityRouter(
        batcher.submit, membership, client, lane_buffer_bytes=s.batch_buffer_max_bytes,
        lane_max_bytes=s.batch_max_bytes, suspect_s=FORWARD_SUSPECT_S,
        # A peer that hung keeps its Oxia session this long at most, then leaves the view.
        unanswered_suspect_s=s.oxia_session_timeout_ms / 1000 + c.membership_refresh_s,
        metrics=RouterMetrics(process.registry, member=me_id), fences=fences)
    await tg.start(watched, router.run)
    # The members split the partitions, so they split the batcher's eager flushes too:
    # together they flush about as often as one broker would at the same load.
    membership.on_change(lambda view: batcher.pace(view.writer_count))
    return ClusterSide(membership, router, server, address)


async def _serve_forwarded(process: BrokerProcess, batcher: Batcher, topics: TopicDirectory,
                           fences: ForwardFences, secret: str | None,
                           metrics: ForwardMetrics, tg: anyio.abc.TaskGroup,
                           stack: contextlib.AsyncExitStack) -> ForwardServer:
    """Listen for the appends other brokers forward here (until the stack closes)."""
    c = process.settings.cluster

    async def forwarded(groups: list[AppendGroup], take_by: float, fence: Fence,
                        window_s: float) -> list[AppendOutcome]:
        # Appended here, never forwarded again: views that disagree cannot bounce records.
        # Stored as this broker's cached view of each topic says (a frame carries none).
        # A flush writes them only once it has taken their fence, and commits them only
        # with a control version it read within the frame's window (app/cluster/fences.py).
        stored = await topics.stored_as(groups)
        return await batcher.enqueue(stored, take_by=take_by,
                                     claim=functools.partial(fences.take, fence),
                                     commit_within_s=window_s)

    server = ForwardServer(forwarded, host=c.forward_host, port=c.forward_port,
                           secret=secret, metrics=metrics)
    with anyio.fail_after(30):
        await tg.start(process.health.watched, server.run)
    stack.callback(server.close)
    return server
