"""Broker membership on the real Oxia: members see each other, a member whose session
ends leaves the others' views, a lost record is put back, leaving deletes it, an id used
twice is reported and not fought over; and the preferred appenders of a view."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable

import anyio
from prometheus_client import CollectorRegistry

from app.cluster.members import BrokerMember, MemberView
from app.cluster.membership import ClusterMembership
from app.localstack.stack import LocalStack
from app.storage.keys import MEMBERS_PARTITION_KEY, KeyLayout, TopicPartition
from tests.helpers.stack import Engine, make_settings, open_engine

WAIT_S = 30
PARTITIONS = [TopicPartition("orders", p) for p in range(16)]


def _member(member_id: str, *, forward: str = "127.0.0.1:1",
            roles: tuple[str, ...] = ("write", "read")) -> BrokerMember:
    return BrokerMember(member_id, member_id.split(".")[0], f"http://{member_id}:8080", forward,
                  roles, uuid.uuid4().hex)


def _changes(registry: CollectorRegistry, member_id: str, kind: str) -> float:
    value = registry.get_sample_value("llog_membership_changes_total",
                                      {"member": member_id, "kind": kind})
    return value or 0.0


async def _until(m: ClusterMembership, ok: Callable[[MemberView], bool]) -> MemberView:
    """Wait (bounded) for a view of ``m`` that satisfies ``ok``."""
    with anyio.fail_after(WAIT_S):
        while not ok(m.view()):
            await m.next_change()
    return m.view()


def _close_session(e: Engine) -> None:
    """End the engine's Oxia session on the members' shard, as the server does when a
    process stalls past its session timeout; its ephemeral records go with it."""
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    client = e.oxia.client
    shard = client._service_discovery.get_shard(MEMBERS_PARTITION_KEY).shard
    session = client._session_manager.get_session(shard)
    client._service_discovery.get_stub(shard).close_session(
        pb.CloseSessionRequest(shard=shard, session_id=session.session_id()))


@contextlib.asynccontextmanager
async def _running(*members: ClusterMembership) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        for m in members:
            with anyio.fail_after(WAIT_S):
                await tg.start(m.run)
        yield
        tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def _engines(stack: LocalStack, n: int) -> AsyncIterator[tuple[KeyLayout, list[Engine]]]:
    """``n`` engines, each with its own Oxia session, and a root of the test's own."""
    settings = make_settings(stack, oxia_session_timeout_ms=30_000)
    async with contextlib.AsyncExitStack() as stack_:
        engines = [await stack_.enter_async_context(open_engine(settings)) for _ in range(n)]
        layout = KeyLayout(f"{settings.root_prefix}-m{uuid.uuid4().hex[:8]}",
                           settings.s3_bucket)
        yield layout, engines


async def test_members_see_each_other_and_agree_on_preferences(stack: LocalStack) -> None:
    async with _engines(stack, 2) as (layout, (ea, eb)):
        # Keys of a topic named _brokers lie below the members' prefix, deeper: ignored.
        clash = TopicPartition("_brokers", 0)
        await ea.oxia.put(layout.control(clash), b"{}", clash.partition_key)
        await ea.oxia.put(layout.compactor_claim(clash), b"{}", MEMBERS_PARTITION_KEY)
        a = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=0.1)
        b = ClusterMembership(eb.oxia, layout, _member("b.w0"), refresh_s=0.1)
        async with _running(a, b):
            both = {"a.w0", "b.w0"}
            va = await _until(a, lambda v: set(v.ids()) == both)
            vb = await _until(b, lambda v: set(v.ids()) == both)
            assert va.digest == vb.digest and len(va.digest) == 12
            assert vb.member("a.w0") == a.me
            firsts = [va.preferred(tp) for tp in PARTITIONS]
            assert firsts == [vb.preferred(tp) for tp in PARTITIONS]
            assert {m.member_id for m in firsts if m is not None} == both


async def test_a_member_whose_session_ends_leaves_the_others_views(stack: LocalStack
                                                                   ) -> None:
    registry = CollectorRegistry()
    async with _engines(stack, 2) as (layout, (ea, eb)):
        # a lists rarely, so it does not put its record back before b sees it gone.
        a = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=3600)
        b = ClusterMembership(eb.oxia, layout, _member("b.w0"), refresh_s=0.1, registry=registry)
        async with _running(a, b):
            await _until(b, lambda v: "a.w0" in v.ids())
            _close_session(ea)
            view = await _until(b, lambda v: "a.w0" not in v.ids())
            assert view.ids() == ["b.w0"]
            assert all(view.preferred(tp) == b.me for tp in PARTITIONS)
        assert _changes(registry, "b.w0", "left") == 1
        assert registry.get_sample_value("llog_membership_members", {"member": "b.w0"}) == 1


async def test_a_lost_record_is_put_back(stack: LocalStack) -> None:
    registry = CollectorRegistry()
    async with _engines(stack, 2) as (layout, (ea, eb)):
        a = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=0.1, registry=registry)
        async with _running(a):
            put = a.registrations
            _close_session(ea)
            with anyio.fail_after(WAIT_S):
                while a.registrations == put:
                    await a.next_change()
            found = await eb.oxia.get(layout.member("a.w0"), MEMBERS_PARTITION_KEY)
            assert found is not None and BrokerMember.from_record(found.value) == a.me
        assert _changes(registry, "a.w0", "reregistered") == 1


async def test_leaving_deletes_the_record_for_good(stack: LocalStack) -> None:
    async with _engines(stack, 2) as (layout, (ea, eb)):
        a = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=3600)
        b = ClusterMembership(eb.oxia, layout, _member("b.w0"), refresh_s=0.1)
        async with _running(a, b):
            await _until(b, lambda v: "a.w0" in v.ids())
            await a.leave()
            await a.leave()  # idempotent
            assert "a.w0" not in a.view().ids()
            await _until(b, lambda v: "a.w0" not in v.ids())
            put = a.registrations
            assert await a.refresh()  # a round after leaving does not put it back
            assert a.registrations == put and "a.w0" not in a.view().ids()
            assert await eb.oxia.get(layout.member("a.w0"), MEMBERS_PARTITION_KEY) is None


async def test_an_id_used_twice_is_reported_and_not_fought_over(stack: LocalStack) -> None:
    registry = CollectorRegistry()
    async with _engines(stack, 2) as (layout, (ea, eb)):
        first = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=3600,
                           registry=registry)
        second = ClusterMembership(eb.oxia, layout, _member("a.w0"), refresh_s=3600)
        assert await first.refresh() and await second.refresh()  # second overwrites
        for _ in range(2):
            assert await first.refresh()
            found = await ea.oxia.get(layout.member("a.w0"), MEMBERS_PARTITION_KEY)
            assert found is not None
            assert BrokerMember.from_record(found.value).incarnation == second.me.incarnation
        assert _changes(registry, "a.w0", "id_clash") == 1
        assert first.view().member("a.w0") == second.me
        await first.leave()  # not its record: left alone
        assert await ea.oxia.get(layout.member("a.w0"), MEMBERS_PARTITION_KEY) is not None


async def test_a_record_freed_by_the_other_process_of_our_id_is_taken_back(
        stack: LocalStack) -> None:
    registry = CollectorRegistry()
    async with _engines(stack, 2) as (layout, (ea, eb)):
        first = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=3600,
                           registry=registry)
        second = ClusterMembership(eb.oxia, layout, _member("a.w0"), refresh_s=3600)
        assert await first.refresh() and await second.refresh() and await first.refresh()
        await second.leave()
        assert await first.refresh()
        assert first.view().member("a.w0") == first.me
        assert _changes(registry, "a.w0", "reregistered") == 1


async def test_a_new_forward_address_is_announced(stack: LocalStack) -> None:
    async with _engines(stack, 2) as (layout, (ea, eb)):
        a = ClusterMembership(ea.oxia, layout, _member("a.w0", forward=""), refresh_s=3600)
        b = ClusterMembership(eb.oxia, layout, _member("b.w0"), refresh_s=0.1)
        async with _running(a, b):
            view = await _until(b, lambda v: "a.w0" in v.ids())
            # Without a forward listener a is no candidate.
            assert all(view.preferred(tp) == b.me for tp in PARTITIONS)
            a.update_me("127.0.0.1:4711")  # wakes a's loop, which puts the record again
            view = await _until(b, lambda v: (m := v.member("a.w0")) is not None
                                and m.forward == "127.0.0.1:4711")
            assert a.me in {view.preferred(tp) for tp in PARTITIONS}


async def test_a_suspect_is_skipped_until_its_time_runs_out(stack: LocalStack) -> None:
    now = [0.0]
    registry = CollectorRegistry()
    async with _engines(stack, 2) as (layout, (ea, eb)):
        a = ClusterMembership(ea.oxia, layout, _member("a.w0"), refresh_s=3600)
        b = ClusterMembership(eb.oxia, layout, _member("b.w0"), refresh_s=3600, registry=registry,
                       clock=lambda: now[0])
        assert await a.refresh() and await b.refresh()
        owners = {tp: b.view().preferred(tp) for tp in PARTITIONS}
        assert a.me in owners.values()
        b.suspect("a.w0", 2.0)
        b.suspect("b.w0", 2.0)  # never itself
        assert all(b.view().preferred(tp) == b.me for tp in PARTITIONS)
        assert "a.w0" in b.view().ids()  # still a member, only not preferred
        now[0] = 2.5
        assert {tp: b.view().preferred(tp) for tp in PARTITIONS} == owners
        assert _changes(registry, "b.w0", "suspected") == 1


# -- the view alone ----------------------------------------------------------------------

def test_a_view_prefers_writers_with_a_forward_listener() -> None:
    reader = _member("r.w0", roles=("read",))
    silent = _member("s.w0", forward="")
    writer = _member("w.w0")
    view = MemberView((writer, silent, reader))
    assert view.ids() == ["r.w0", "s.w0", "w.w0"]
    assert all(view.preferred(tp) == writer for tp in PARTITIONS)
    assert MemberView((reader, silent)).preferred(PARTITIONS[0]) is None
    assert MemberView((writer,), frozenset({"w.w0"})).preferred(PARTITIONS[0]) is None
    # The digest names the set of ids, whatever their order or records.
    assert MemberView((reader, writer)).digest == MemberView((writer, reader)).digest
    assert MemberView((reader, writer)).digest != MemberView((writer,)).digest


def test_a_record_round_trips_and_a_foreign_one_is_refused() -> None:
    import json

    import pytest

    me = _member("b1.w3")
    data = json.loads(me.to_record(pid=7, started_at_ms=1))
    assert data == {"v": 1, "member_id": "b1.w3", "broker_id": "b1", "pid": 7,
                    "incarnation": me.incarnation, "url": me.url, "forward": me.forward,
                    "roles": ["write", "read"], "started_at_ms": 1}
    assert BrokerMember.from_record(me.to_record()) == me
    for bad in (b"{", b"[]", json.dumps({**data, "v": 2}).encode(),
                json.dumps({**data, "member_id": "a/b"}).encode(),
                json.dumps({**data, "roles": "write"}).encode()):
        with pytest.raises(ValueError):
            BrokerMember.from_record(bad)
