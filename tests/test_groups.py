"""Consumer groups through HTTP on in-process brokers against the real Oxia and MinIO:
membership and generations, assignment, commits fenced by generation, consuming from
committed offsets, resets, and refusals that write nothing."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI

from app.errors import GroupNotEmpty, StaleGeneration, StorageUnavailable
from app.factory import create_app
from app.groups.committed_offsets import GroupOffsets, ResetTarget
from app.groups.group_records import CommittedOffset
from app.groups.membership import GroupMembership
from app.groups.store import GroupStore
from app.localstack.stack import LocalStack
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from app.wire import records
from tests.helpers.bodies import produce_body
from tests.helpers.stack import make_settings, open_engine

# Members live through the longest stall of a loaded machine (the default session), and
# only a member a test means to lose asks for a short one (the minimum is low enough for
# that); the broker settles a group at most every 100 ms.
FAST = {"group_min_session_timeout_ms": 200, "group_session_timeout_ms": 120_000}
SHORT_SESSION_MS = 400
# Bounds on waiting for an expiry: they only catch a member that never expires.
EXPIRY_BOUND_S = 60


@contextlib.asynccontextmanager
async def broker_app(stack: LocalStack, **overrides: Any
                     ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app: FastAPI = create_app(make_settings(stack, **{**FAST, **overrides}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://broker") as client:
        yield app, client


@contextlib.asynccontextmanager
async def broker(stack: LocalStack, **overrides: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with broker_app(stack, **overrides) as (_, client):
        yield client


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


async def _ok(response: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    return body


async def _join(http: httpx.AsyncClient, group: str, *topics: str, **extra: Any
                ) -> dict[str, Any]:
    return await _ok(await http.post(f"/groups/{group}/join",
                                     json={"topics": list(topics), **extra}))


async def _beat(http: httpx.AsyncClient, group: str, member: dict[str, Any]) -> httpx.Response:
    return await http.post(f"/groups/{group}/heartbeat", json={"member_id": member["member_id"]})


def _owned(answer: dict[str, Any]) -> set[tuple[str, int]]:
    return {(a["topic"], p) for a in answer["assignment"] for p in a["partitions"]}


async def _commit(http: httpx.AsyncClient, group: str, member: dict[str, Any] | None,
                  *offsets: tuple[str, int, int], generation: int | None = None
                  ) -> httpx.Response:
    body: dict[str, Any] = {"offsets": [{"topic": t, "partition": p, "offset": o}
                                        for t, p, o in offsets]}
    if member is not None:
        body |= {"member_id": member["member_id"],
                 "generation": member["generation"] if generation is None else generation}
    return await http.post(f"/groups/{group}/commit", json=body)


async def _committed(http: httpx.AsyncClient, group: str) -> dict[tuple[str, int], Any]:
    described = await _ok(await http.get(f"/groups/{group}"))
    return {(p["topic"], p["partition"]): p["committed_offset"]
            for p in described["partitions"]}


async def _create(http: httpx.AsyncClient, topic: str, partitions: int) -> None:
    await _ok(await http.post("/topics", json={"topic": topic, "partitions": partitions}), 201)


async def test_members_join_through_one_broker_and_heartbeat_through_another(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as a, broker(stack) as b:
        await _create(a, topic, 4)
        first = await _join(a, group, topic, client_id="worker-1")
        assert first["generation"] == 1 and len(_owned(first)) == 4
        second = await _join(b, group, topic)
        assert second["generation"] == 2 and second["members"] == 2
        # The first member learns of the rebalance from the other broker.
        seen = await _ok(await _beat(b, group, first))
        assert seen["generation"] == 2
        assert _owned(seen) | _owned(second) == {(topic, p) for p in range(4)}
        assert len(_owned(seen)) == len(_owned(second)) == 2
        assert not _owned(seen) & _owned(second)
        # Leaving moves its partitions at once: a new generation.
        left = await _ok(await a.post(f"/groups/{group}/leave",
                                      json={"member_id": second["member_id"]}))
        assert left == {"group": group, "member_id": second["member_id"], "left": True,
                        "generation": 3}
        assert len(_owned(await _ok(await _beat(a, group, first)))) == 4
        again = await _ok(await a.post(f"/groups/{group}/leave",
                                       json={"member_id": second["member_id"]}))
        assert again["left"] is False and again["generation"] == 3
        r = await _beat(b, group, second)
        assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"


async def test_a_member_that_stops_heartbeating_is_removed_and_its_partitions_move(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as a, broker(stack) as b:
        await _create(a, topic, 3)
        alive = await _join(a, group, topic)  # the default session: it outlives any stall
        dead = await _join(b, group, topic, session_timeout_ms=SHORT_SESSION_MS)
        assert dead["generation"] == 2
        with anyio.fail_after(EXPIRY_BOUND_S):
            now = await _ok(await _beat(a, group, alive))
            while now["generation"] == 2:
                await anyio.sleep(0.1)  # heartbeats are the protocol's clock
                now = await _ok(await _beat(a, group, alive))
        assert now["generation"] == 3 and now["members"] == 1 and len(_owned(now)) == 3
        r = await _beat(b, group, dead)
        assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"
        r = await _commit(b, group, dead, (topic, 0, 0), generation=3)
        assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"
        described = await _ok(await b.get(f"/groups/{group}"))
        assert [m["member_id"] for m in described["members"]] == [alive["member_id"]]


async def test_a_zombie_of_an_older_generation_is_refused_and_writes_nothing(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as http:
        await _create(http, topic, 2)
        await http.post("/produce", json=produce_body(topic, "a", "b", "c", partition=0))
        await http.post("/produce", json=produce_body(topic, "d", "e", partition=1))
        zombie = await _join(http, group, topic)
        await _ok(await _commit(http, group, zombie, (topic, 0, 1), (topic, 1, 1)))
        other = await _join(http, group, topic)
        for offsets in [((topic, 0, 3),), ((topic, 1, 2),), ((topic, 0, 0), (topic, 1, 0))]:
            r = await _commit(http, group, zombie, *offsets)
            assert r.status_code == 409 and r.json()["error_type"] == "StaleGeneration"
        assert await _committed(http, group) == {(topic, 0): 1, (topic, 1): 1}
        # In the current generation, a partition that is not its own is refused too.
        current = await _ok(await _beat(http, group, zombie))
        (theirs,) = _owned(other)
        r = await _commit(http, group, current, (theirs[0], theirs[1], 0))
        assert r.status_code == 409 and r.json()["error_type"] == "PartitionNotAssigned"
        # Without a member id, only a group without live members takes commits.
        r = await _commit(http, group, None, (topic, 0, 0))
        assert r.status_code == 409 and r.json()["error_type"] == "GroupNotEmpty"
        assert await _committed(http, group) == {(topic, 0): 1, (topic, 1): 1}
        (mine,) = _owned(current)
        await _ok(await _commit(http, group, current, (mine[0], mine[1], 2)))
        assert (await _committed(http, group))[mine] == 2


async def test_an_offset_written_by_a_newer_generation_fences_an_older_commit(
        stack: LocalStack, topic: str, group: str) -> None:
    """A commit that passed its check just before a rebalance and reached Oxia after the
    new owner's commit (the race the per-record generation closes)."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        late = await _join(http, group, topic)  # generation 1: it owned the partition
        newer = await _join(http, group, topic)
        owner = max([newer, await _ok(await _beat(http, group, late))], key=_owned)
        assert owner["generation"] == 2 and _owned(owner) == {(topic, 0)}
        await _ok(await _commit(http, group, owner, (topic, 0, 3)))
        async with open_engine(make_settings(stack)) as e:
            store = GroupStore(e.oxia, e.layout)

            async def count(_: str) -> int:
                return 1

            offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader)
            with pytest.raises(StaleGeneration):
                await offsets._write(group, tp, 1, late["generation"], late["member_id"])
            found = await store.offset(group, tp)
            assert found is not None and found.value.offset == 3
            assert found.value.generation == owner["generation"]


async def test_a_member_past_its_session_commits_nothing(
        stack: LocalStack, topic: str, group: str) -> None:
    """Its session ended, and nobody settled the group since: the record still lists it
    in the current generation, but its lease says it is gone."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b"))
        member = await _join(http, group, topic, session_timeout_ms=SHORT_SESSION_MS)
        store = GroupStore(e.oxia, e.layout)
        # Until the lease has expired, as any broker judges it.
        with anyio.fail_after(EXPIRY_BOUND_S):
            lease = await store.lease(group, member["member_id"])
            while lease is not None and lease.value.alive(now_ms()):
                await anyio.sleep(0.05)
                lease = await store.lease(group, member["member_id"])
        found = await store.group(group)
        assert found is not None and found.value.generation == member["generation"]
        assert found.value.member(member["member_id"]) is not None  # not settled yet
        r = await _commit(http, group, member, (topic, 0, 2))
        assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"
        r = await http.post("/consume", json={
            "topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": 1}],
            "group": group, "commit": True, "member_id": member["member_id"],
            "generation": member["generation"], "max_wait_ms": 0})
        assert r.status_code == 409 and r.json()["error_type"] == "UnknownMember"
        assert await store.offset(group, tp) is None  # nothing was written


async def test_a_rebalance_between_the_check_and_the_write_undoes_the_commit(
        stack: LocalStack, topic: str, group: str) -> None:
    """The commit passed its check in generation 1; a join starts generation 2 before
    its offsets reach Oxia. The commit is refused and what it wrote is put back: the
    older record where there was one, nothing where there was none."""
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await _create(http, topic, 2)
        for p in (0, 1):
            await http.post("/produce", json=produce_body(topic, "a", "b", "c", partition=p))
        member = await _join(http, group, topic)
        await _ok(await _commit(http, group, member, (topic, 0, 1)))
        rebalanced = anyio.Lock()
        joined: list[dict[str, Any]] = []

        class Racing(GroupStore):
            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                async with rebalanced:  # between the check and the first write
                    if not joined:
                        joined.append(await _join(http, group, topic))
                return await super().put_offset(group, tp, committed, expected_version)

        async def count(_: str) -> int:
            return 2

        store = Racing(e.oxia, e.layout)
        offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader)
        done = await offsets.commit(group, member["member_id"], member["generation"],
                                    [(TopicPartition(topic, 0), 3), (TopicPartition(topic, 1), 2)])
        assert joined and joined[0]["generation"] == member["generation"] + 1
        assert all(isinstance(o, StaleGeneration) for o in done), done
        before = await store.offset(group, TopicPartition(topic, 0))
        assert before is not None and (before.value.offset, before.value.generation) == (
            1, member["generation"])
        assert await store.offset(group, TopicPartition(topic, 1)) is None
        # In the new generation the same member commits what it still owns.
        now = await _ok(await _beat(http, group, member))
        (mine,) = _owned(now)
        await _ok(await _commit(http, group, now, (mine[0], mine[1], 3)))
        assert (await _committed(http, group))[mine] == 3


async def test_a_join_between_the_check_and_the_write_undoes_a_commit_without_member(
        stack: LocalStack, topic: str, group: str) -> None:
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b"))
        await _ok(await _commit(http, group, None, (topic, 0, 1)))
        joined: list[dict[str, Any]] = []

        class Racing(GroupStore):
            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                if not joined:  # a member joins between the check and the write
                    joined.append(await _join(http, group, topic))
                return await super().put_offset(group, tp, committed, expected_version)

        async def count(_: str) -> int:
            return 1

        store = Racing(e.oxia, e.layout)
        offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader)
        (done,) = await offsets.commit(group, None, None, [(tp, 2)])
        assert joined and isinstance(done, GroupNotEmpty), done
        found = await store.offset(group, tp)
        assert found is not None and found.value.offset == 1  # put back


async def test_a_store_failure_in_the_check_after_writing_puts_the_commit_back(
        stack: LocalStack, topic: str, group: str) -> None:
    """Oxia fails the lease read of the check made after the offsets are written: the
    commit answers that failure for its partition (a 503, not an exception group that
    surfaces as a 500) and what it wrote is put back."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        member = await _join(http, group, topic)
        await _ok(await _commit(http, group, member, (topic, 0, 1)))
        wrote: list[TopicPartition] = []

        class Failing(GroupStore):
            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                version = await super().put_offset(group, tp, committed, expected_version)
                wrote.append(tp)
                return version

            async def lease(self, group: str, member_id: str) -> Any:
                if wrote:  # the check after the write
                    raise StorageUnavailable("oxia: the lease's shard has no leader")
                return await super().lease(group, member_id)

        async def count(_: str) -> int:
            return 1

        store = Failing(e.oxia, e.layout)
        offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader)
        (done,) = await offsets.commit(group, member["member_id"], member["generation"],
                                       [(tp, 3)])
        assert wrote[:1] == [tp] and isinstance(done, StorageUnavailable), done
        found = await store.offset(group, tp)
        assert found is not None and found.value.offset == 1  # put back


async def test_consume_from_committed_offsets_and_commit_what_was_delivered(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as http:
        await _create(http, topic, 2)
        await http.post("/produce", json=produce_body(topic, *"abcde", partition=0))
        await http.post("/produce", json=produce_body(topic, *"xy", partition=1))

        async def consume(**extra: Any) -> list[dict[str, Any]]:
            body = {"topic_partitions": [
                {"topic": topic, "partition": p, "fetch_offset": "committed"} for p in (0, 1)],
                "group": group, "max_wait_ms": 0, **extra}
            results: list[dict[str, Any]] = (await _ok(await http.post(
                "/consume", json=body)))["results"]
            return results

        # Nothing committed: auto_offset_reset decides.
        latest = await consume(auto_offset_reset="latest")
        assert [(r["next_offset"], r["records"]) for r in latest] == [(6, []), (3, [])]
        first = await consume()
        assert [[x["value"] for x in r["records"]] for r in first] == [list("abcde"), ["x", "y"]]
        # At-least-once: commit after processing; reading resumes one past it.
        await _ok(await _commit(http, group, None, (topic, 0, 3)))
        resumed = await consume()
        assert [x["offset"] for x in resumed[0]["records"]] == [4, 5]
        assert "committed_offset" not in resumed[0]
        # At-most-once: commit what is delivered, before the answer leaves.
        delivered = await consume(commit=True, max_bytes=1)
        assert [x["offset"] for x in delivered[0]["records"]] == [4]
        assert delivered[0]["committed_offset"] == 4
        # Without members, describe lists the partitions the group committed.
        described = await _ok(await http.get(f"/groups/{group}"))
        assert [(p["partition"], p["committed_offset"], p["high_watermark"], p["lag"])
                for p in described["partitions"]] == [(0, 4, 5, 1)]


async def test_commit_on_consume_needs_the_member_to_own_its_partitions(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as http:
        await _create(http, topic, 2)
        await http.post("/produce", json=produce_body(topic, "a", partition=0))
        member = await _join(http, group, topic)
        newer = await _join(http, group, topic)
        body: dict[str, Any] = {
            "topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": "committed"}],
            "group": group, "commit": True, "member_id": member["member_id"],
            "generation": member["generation"], "max_wait_ms": 0}
        r = await http.post("/consume", json=body)
        assert r.status_code == 409 and r.json()["error_type"] == "StaleGeneration"
        mine = _owned(newer)
        body |= {"member_id": newer["member_id"], "generation": newer["generation"]}
        r = await http.post("/consume", json=body)
        if (topic, 0) in mine:
            assert (await _ok(r))["results"][0]["committed_offset"] == 1
        else:
            assert r.status_code == 409 and r.json()["error_type"] == "PartitionNotAssigned"
            assert await _committed(http, group) == {(topic, 0): None, (topic, 1): None}


async def test_a_binary_answer_commits_too(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as http:
        await _create(http, topic, 2)
        for p in (0, 1):
            await http.post("/produce", json=produce_body(topic, "a", "b", partition=p))
        member = await _join(http, group, topic)
        body: dict[str, Any] = {
            "topic_partitions": [{"topic": topic, "partition": p, "fetch_offset": "committed"}
                                 for p in (0, 1)],
            "group": group, "commit": True, "member_id": member["member_id"],
            "generation": member["generation"], "max_wait_ms": 0}
        r = await http.post("/consume", json=body, headers={"accept": records.CONTENT_TYPE})
        assert r.status_code == 200 and r.headers["content-type"] == records.CONTENT_TYPE
        answers = records.parse(r.content)
        assert [(a.partition, a.next_offset) for a in answers
                if isinstance(a, records.Records)] == [(0, 3), (1, 3)]
        assert await _committed(http, group) == {(topic, 0): 2, (topic, 1): 2}


async def test_a_rebalance_during_the_long_poll_fails_the_commit_and_withholds_records(
        stack: LocalStack, topic: str, group: str) -> None:
    # The long-poll's own deadline is far beyond the bound below: only the write wakes it.
    async with broker_app(stack, max_wait_ms_ceiling=600_000) as (app, http):
        await _create(http, topic, 1)
        member = await _join(http, group, topic)
        body: dict[str, Any] = {
            "topic_partitions": [{"topic": topic, "partition": 0, "fetch_offset": "committed"}],
            "group": group, "commit": True, "member_id": member["member_id"],
            "generation": member["generation"], "max_wait_ms": 600_000}
        answer: dict[str, Any] = {}

        async def consume() -> None:
            answer.update(await _ok(await http.post("/consume", json=body)))

        service = app.state.broker.consume
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                parked = False
                while not parked:  # the request passed its check and waits for records
                    await anyio.sleep(0.01)
                    parked = service.statistics().long_polls > 0
                await _join(http, group, topic)  # a new generation
                await http.post("/produce", json=produce_body(topic, "a"))  # wakes it
        (result,) = answer["results"]
        assert result["ok"] is False and result["error_type"] == "StaleGeneration"
        assert "records" not in result
        assert await _committed(http, group) == {(topic, 0): None}


async def test_reset_offsets_is_refused_while_a_member_lives(
        stack: LocalStack, topic: str, group: str) -> None:
    async with broker(stack) as http:
        await _create(http, topic, 3)
        for p in range(3):
            await http.post("/produce", json=produce_body(topic, *"abcd", partition=p))
        member = await _join(http, group, topic)
        r = await http.post(f"/groups/{group}/reset-offsets", json={"topic_partitions": [
            {"topic": topic, "to": "earliest"}]})
        assert r.status_code == 409 and r.json()["error_type"] == "GroupNotEmpty"
        assert set((await _committed(http, group)).values()) == {None}
        await _ok(await http.post(f"/groups/{group}/leave",
                                  json={"member_id": member["member_id"]}))
        r = await http.post(f"/groups/{group}/reset-offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "to": "latest"},
            {"topic": topic, "partition": 1, "offset": 2},
            {"topic": topic, "partition": 2, "timestamp_ms": 0}]})
        results = (await _ok(r))["results"]
        assert [x["offset"] for x in results] == [4, 2, 0]
        assert await _committed(http, group) == {(topic, 0): 4, (topic, 1): 2, (topic, 2): 0}
        r = await http.post(f"/groups/{group}/reset-offsets", json={"topic_partitions": [
            {"topic": topic, "to": "earliest"}]})
        assert [x["offset"] for x in (await _ok(r))["results"]] == [0, 0, 0]
        r = await http.post(f"/groups/{group}/reset-offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0, "offset": 5}]})
        # The log's state refuses it, not the request's shape: a conflict, not a 400.
        assert r.status_code == 409, r.text
        assert r.json()["error_type"] == "OffsetBeyondHighWatermark"
        assert "high watermark" in r.json()["error"]


async def test_bad_input_is_a_4xx_and_writes_nothing(stack: LocalStack, topic: str,
                                                     group: str) -> None:
    async with broker(stack, group_max_members=2, group_max_topics=2) as http:
        await http.post("/produce", json=produce_body(topic, "a"))
        for path, body in [
            ("/groups/a..b%2F/join", {"topics": [topic]}),
            ("/groups/../join", {"topics": [topic]}),
            (f"/groups/{group}/join", {"topics": []}),
            (f"/groups/{group}/join", {"topics": ["bad/topic"]}),
            (f"/groups/{group}/join", {"topics": [topic], "session_timeout_ms": 50}),
            (f"/groups/{group}/commit", {"member_id": "m", "offsets": [
                {"topic": topic, "partition": 0, "offset": 1}]}),
            ("/consume", {"topic_partitions": [{"topic": topic, "partition": 0,
                                                "fetch_offset": "committed"}]}),
            ("/consume", {"topic_partitions": [{"topic": topic, "partition": 0,
                                                "fetch_offset": 1}], "commit": True}),
        ]:
            r = await http.post(path, json=body)
            assert r.status_code in (400, 404), (path, body, r.text)
        # A reset entry names exactly one target: none, or two, is one 400 in these words.
        for entry in ({"topic": topic}, {"topic": topic, "to": "earliest", "offset": 1}):
            r = await http.post(f"/groups/{group}/reset-offsets",
                                json={"topic_partitions": [entry]})
            assert r.status_code == 400, r.text
            assert "exactly one of to, timestamp_ms and offset" in r.text
        # Beyond the high watermark (1): refused by the log's state, with nothing written.
        r = await http.post(f"/groups/{group}/commit", json={"offsets": [
            {"topic": topic, "partition": 0, "offset": 2}]})
        assert r.status_code == 409, r.text
        assert r.json()["error_type"] == "OffsetBeyondHighWatermark"
        r = await http.post(f"/groups/{group}/join", json={"topics": ["a", "b", "c"]})
        assert r.status_code == 413
        r = await http.get(f"/groups/{group}")
        assert r.status_code == 404 and r.json()["error_type"] == "UnknownGroup"
        await _join(http, group, topic)
        await _join(http, group, topic)
        r = await http.post(f"/groups/{group}/join", json={"topics": [topic]})
        assert r.status_code == 409 and r.json()["error_type"] == "GroupFull"
        described = await _ok(await http.get(f"/groups/{group}"))
        assert len(described["members"]) == 2 and described["generation"] == 2
        assert await _committed(http, group) == {(topic, 0): None}
        async with open_engine(make_settings(stack)) as e:
            assert len(await GroupStore(e.oxia, e.layout).leases(group)) == 2


async def test_groups_are_listed_a_page_at_a_time(stack: LocalStack, topic: str) -> None:
    prefix = f"p{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i}" for i in range(5)]
    async with broker(stack, group_list_max=3) as http:
        for name in names:
            await _join(http, name, topic)
        seen: list[str] = []
        after: str | None = f"{prefix}"
        while after is not None:
            page = await _ok(await http.get("/groups", params={"after": after, "limit": 2}))
            seen += [g["group"] for g in page["groups"] if g["group"].startswith(prefix)]
            after = page["next_after"] if page["groups"] and page["groups"][-1][
                "group"].startswith(prefix) else None
        assert seen == names
        r = await http.get("/groups", params={"limit": 4})
        assert r.status_code == 400


class _Window(GroupStore):
    """A store that runs ``between`` once, when a write matching ``when`` is about to be
    sent (``after=False``) or has landed (``after=True``): a window driven directly."""

    def __init__(self, *args: Any, when: Any, between: Any, after: bool) -> None:
        super().__init__(*args)
        self._when, self._between, self._after, self.ran = when, between, after, False

    async def put_offset(self, group: str, tp: TopicPartition, committed: CommittedOffset,
                         expected_version: int) -> int:
        hit = not self.ran and self._when(committed)
        if hit and not self._after:
            self.ran = True
            await self._between()
        version = await super().put_offset(group, tp, committed, expected_version)
        if hit and self._after:
            self.ran = True
            await self._between()
        return version


def _pending_of(offset: int) -> Any:
    return lambda c: c.pending is not None and c.pending.offset == offset


def _confirming(offset: int) -> Any:
    return lambda c: c.pending is None and c.offset == offset


async def _one_partition_offsets(e: Any, store_factory: Any) -> tuple[GroupStore, GroupOffsets]:
    async def count(_: str) -> int:
        return 1

    store = store_factory(e.oxia, e.layout)
    return store, GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader)


@pytest.mark.parametrize("confirming", [False, True],
                         ids=["before-its-check", "before-its-confirmation"])
async def test_a_refused_commit_is_never_the_position_a_new_owner_reads(
        stack: LocalStack, topic: str, group: str, confirming: bool) -> None:
    """The commit of offset 3 is written (pending). A member joins and the new generation
    reads its position before the commit's check, or after the check and before its
    confirmation (the read then fences it: the confirmation fails). Either way the commit
    is refused and the position read is one past the confirmed offset (1), never past the
    refused one, then and after."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        member = await _join(http, group, topic)
        await _ok(await _commit(http, group, member, (topic, 0, 1)))
        seen: list[int | Any] = []

        async def rebalance_and_read() -> None:
            await _join(http, group, topic)
            seen.extend(await offsets.positions(group, [tp], "latest"))

        store, offsets = await _one_partition_offsets(e, lambda *a: _Window(
            *a, when=_confirming(3) if confirming else _pending_of(3),
            between=rebalance_and_read, after=not confirming))
        (done,) = await offsets.commit(group, member["member_id"], member["generation"],
                                       [(tp, 3)])
        assert isinstance(done, StaleGeneration), done
        assert seen == [2]  # one past the confirmed 1, not past the refused 3
        assert await offsets.positions(group, [tp], "latest") == [2]
        found = await store.offset(group, tp)
        assert found is not None and found.value.pending is None and found.value.offset == 1


@pytest.mark.parametrize("after", [False, True], ids=["before-its-write", "after-its-write"])
async def test_a_member_that_joins_while_a_reset_is_written_refuses_the_reset(
        stack: LocalStack, topic: str, group: str, after: bool) -> None:
    """The reset moved the group to a new generation; a member joins before its offsets
    are written, or before they are confirmed, and reads its position: the reset is
    refused, and the member's position (the old one) is what the group keeps, so its
    commits never land over a reset it did not see."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c", "d"))
        await _ok(await _commit(http, group, None, (topic, 0, 1)))
        joined: list[dict[str, Any]] = []
        seen: list[int | Any] = []

        async def join_and_read() -> None:
            joined.append(await _join(http, group, topic))
            seen.extend(await offsets.positions(group, [tp], "latest"))

        store, offsets = await _one_partition_offsets(e, lambda *a: _Window(
            *a, when=_pending_of(3), between=join_and_read, after=after))
        (done,) = await offsets.reset(group, [ResetTarget(tp, offset=3)])
        assert isinstance(done, GroupNotEmpty), done
        assert seen == [2]
        assert await offsets.positions(group, [tp], "latest") == [2]
        (member,) = joined
        await _ok(await _commit(http, group, member, (topic, 0, 2)))
        assert (await _committed(http, group))[(topic, 0)] == 2


async def test_a_pending_commit_left_by_a_failed_withdrawal_is_counted_and_read_by_nobody(
        stack: LocalStack, topic: str, group: str) -> None:
    """Oxia refuses every write after the refused commit's own: its pending offset stays.
    That is counted (llog_group_putback_failures_total), no reader takes it for the
    position, and the next generation's first read drops it."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        member = await _join(http, group, topic)
        await _ok(await _commit(http, group, member, (topic, 0, 1)))

        class Stuck(GroupStore):
            refusing = False

            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                if self.refusing:
                    raise StorageUnavailable("oxia: no leader for the shard")
                version = await super().put_offset(group, tp, committed, expected_version)
                if committed.pending is not None:
                    await _join(http, group, topic)  # the check after writing refuses it
                    self.refusing = True
                return version

        failures: list[None] = []

        async def count(_: str) -> int:
            return 1

        store = Stuck(e.oxia, e.layout)
        offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader,
                               putback_failed=lambda: failures.append(None))
        (done,) = await offsets.commit(group, member["member_id"], member["generation"],
                                       [(tp, 3)])
        assert isinstance(done, StaleGeneration) and failures == [None], done
        left = await store.offset(group, tp)
        assert left is not None and left.value.pending is not None  # still there
        assert (await _committed(http, group))[(topic, 0)] == 1
        store.refusing = False
        assert await offsets.positions(group, [tp], "latest") == [2]
        dropped = await store.offset(group, tp)
        assert dropped is not None and dropped.value.pending is None


async def test_a_confirmation_that_applied_unanswered_is_never_answered_as_refused(
        stack: LocalStack, topic: str, group: str) -> None:
    """The commit's confirmation lands and its answer is lost; before the retry reads the
    record, the member leaves, another joins, reads its position (one past the commit)
    and commits further. The commit must not say "nothing was committed": it answers
    that it may have been (StorageUnavailable saying so)."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c", "d", "e"))
        first = await _join(http, group, topic)
        await _ok(await _commit(http, group, first, (topic, 0, 1)))
        seen: list[int | Any] = []

        class LostAnswer(GroupStore):
            fired = False

            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                version = await super().put_offset(group, tp, committed, expected_version)
                if not self.fired and committed.pending is None and committed.offset == 3:
                    self.fired = True
                    await _ok(await http.post(f"/groups/{group}/leave",
                                              json={"member_id": first["member_id"]}))
                    second = await _join(http, group, topic)
                    seen.extend(await offsets.positions(group, [tp], "latest"))
                    await _ok(await _commit(http, group, second, (topic, 0, 4)))
                    raise StorageUnavailable("oxia: the answer was lost")
                return version

        store, offsets = await _one_partition_offsets(e, LostAnswer)
        (done,) = await offsets.commit(group, first["member_id"], first["generation"],
                                       [(tp, 3)])
        assert seen == [4]  # the commit of 3 was read as the position
        assert isinstance(done, StorageUnavailable) and "may have been committed" in str(
            done), done


async def test_while_upgrading_commits_are_written_directly_and_put_back_if_refused(
        stack: LocalStack, topic: str, group: str) -> None:
    """LLOG_GROUP_PENDING_COMMITS=false, for a rolling upgrade from a release that reads
    no pending commit: records carry none (an older release reads them as it wrote
    them), a commit is answered once checked, and a refused one is put back."""
    tp = TopicPartition(topic, 0)
    async with broker(stack) as http, open_engine(make_settings(stack)) as e:
        await http.post("/produce", json=produce_body(topic, "a", "b", "c"))
        member = await _join(http, group, topic)
        written: list[CommittedOffset] = []

        class Recording(GroupStore):
            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                written.append(committed)
                return await super().put_offset(group, tp, committed, expected_version)

        async def count(_: str) -> int:
            return 1

        store = Recording(e.oxia, e.layout)
        offsets = GroupOffsets(store, GroupMembership(store, e.settings, count), e.reader,
                               pending=False)
        assert await offsets.commit(group, member["member_id"], member["generation"],
                                    [(tp, 1)]) == [1]
        assert [(c.offset, c.pending) for c in written] == [(1, None)]  # one direct write
        joined: list[dict[str, Any]] = []

        class Racing(Recording):
            async def put_offset(self, group: str, tp: TopicPartition,
                                 committed: CommittedOffset, expected_version: int) -> int:
                version = await super().put_offset(group, tp, committed, expected_version)
                if not joined:
                    joined.append(await _join(http, group, topic))  # before the check
                return version

        racing = Racing(e.oxia, e.layout)
        offsets = GroupOffsets(racing, GroupMembership(racing, e.settings, count), e.reader,
                               pending=False)
        (done,) = await offsets.commit(group, member["member_id"], member["generation"],
                                       [(tp, 3)])
        assert isinstance(done, StaleGeneration), done
        back = await racing.offset(group, tp)
        assert back is not None and (back.value.offset, back.value.pending) == (1, None)
        assert all(c.pending is None for c in written)
