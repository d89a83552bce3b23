"""Compactor claims on the real Oxia: an unanswered create is settled, never leaked."""

from __future__ import annotations

import pytest

from app.compaction.claims import Claims
from app.errors import StorageUnavailable
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import CompactorClaim
from tests.helpers.stack import Engine, make_settings, open_engine


def _lose_the_next_answer(e: Engine, *, also_fail_reads: int = 0) -> None:
    """The next ephemeral create is applied by Oxia but its answer is lost; the next
    ``also_fail_reads`` reads fail too."""
    real_put, real_get = e.oxia.put, e.oxia.get
    state = {"armed": True, "reads": also_fail_reads}

    async def put(key: str, value: bytes, partition_key: str, **kw: object) -> int:
        version = await real_put(key, value, partition_key, **kw)  # type: ignore[arg-type]
        if state["armed"] and kw.get("ephemeral"):
            state["armed"] = False
            raise StorageUnavailable("the answer was lost")
        return version

    async def get(key: str, partition_key: str) -> object:
        if state["reads"]:
            state["reads"] -= 1
            raise StorageUnavailable("Oxia is unreachable")
        return await real_get(key, partition_key)

    e.oxia.put = put  # type: ignore[method-assign,assignment]
    e.oxia.get = get  # type: ignore[method-assign,assignment]


async def _holder(e: Engine, tp: TopicPartition) -> str | None:
    found = await e.oxia.get(e.layout.compactor_claim(tp), tp.partition_key)
    return None if found is None else CompactorClaim.from_json(found.value).compactor_id


async def test_an_unanswered_claim_is_settled_by_reading_it_back(stack: LocalStack,
                                                                tp: TopicPartition) -> None:
    settings = make_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        mine, theirs = Claims(a.oxia, a.layout, "a"), Claims(b.oxia, b.layout, "b")
        _lose_the_next_answer(a)
        async with mine.held(tp) as held:
            assert held  # created, answer lost, read back: ours
            assert await _holder(b, tp) == "a"
        assert await _holder(b, tp) is None  # released: nothing leaked
        async with theirs.held(tp) as held:
            assert held


async def test_a_claim_that_cannot_be_read_back_is_settled_next_time(
        stack: LocalStack, tp: TopicPartition) -> None:
    settings = make_settings(stack)
    async with open_engine(settings) as a, open_engine(settings) as b:
        mine, theirs = Claims(a.oxia, a.layout, "a"), Claims(b.oxia, b.layout, "b")
        _lose_the_next_answer(a, also_fail_reads=1)
        with pytest.raises(StorageUnavailable):
            await mine.acquire(tp)
        assert await _holder(b, tp) == "a"  # applied, unknown to its owner
        async with mine.held(tp) as held:  # settles the leftover first, then claims
            assert held
        assert await _holder(b, tp) is None
        async with theirs.held(tp) as held:
            assert held


async def test_a_session_the_server_lost_is_replaced_at_the_next_claim(
        stack: LocalStack, tp: TopicPartition) -> None:
    """The server ends the session (as it does when a stalled process misses its
    keep-alives) while the client still counts on it: the claim under it is gone, and
    the next claim is taken under a new session at once instead of failing until the
    client's own keep-alive check gives up on the old one."""
    from oxia.internal.proto.io.streamnative.oxia import proto as pb

    settings = make_settings(stack, oxia_session_timeout_ms=30_000)
    async with open_engine(settings) as a, open_engine(settings) as b:
        claims = Claims(a.oxia, a.layout, "a")
        assert await claims.acquire(tp) is not None
        client = a.oxia.client
        shard = client._service_discovery.get_shard(tp.partition_key).shard
        lost = client._session_manager.get_session(shard)
        client._service_discovery.get_stub(shard).close_session(
            pb.CloseSessionRequest(shard=shard, session_id=lost.session_id()))
        assert await _holder(b, tp) is None  # the claim went with the session
        async with claims.held(tp) as held:
            assert held
            assert await _holder(b, tp) == "a"
        assert client._session_manager.get_session(shard).session_id() != lost.session_id()
        assert lost.is_closed()  # its keep-alives stopped
