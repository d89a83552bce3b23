"""The Python client's consumer-group calls and its group consumer, against a real
broker on the real stack."""

from __future__ import annotations

import uuid

import pytest

from llog_client import (
    AsyncLlogClient,
    GroupNotEmpty,
    LlogClient,
    RetryPolicy,
    StaleGeneration,
    UnknownMember,
)
from tests.helpers.stack import Broker

FAST = RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.5)


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


def test_join_commit_fetch_describe_reset_and_leave(broker: Broker, topic: str,
                                                    group: str) -> None:
    with LlogClient(broker.url, retry=FAST) as llog:
        llog.create_topic(topic, 2)
        llog.produce(topic, ["a", "b", "c"], partition=0)
        llog.produce(topic, ["x"], partition=1)
        member = llog.join_group(group, topic, client_id="unit")
        assert member.generation == 1 and set(member.assignment) == {(topic, 0), (topic, 1)}
        got = llog.fetch_group(group, {(topic, 0): "committed", (topic, 1): "latest"})
        assert [len(f.records) for f in got if not isinstance(f, Exception)] == [3, 0]
        assert llog.commit_offsets(group, {(topic, 0): 2}, member=member) == {(topic, 0): 2}
        (again, _) = llog.fetch_group(group, {(topic, 0): "committed", (topic, 1): 1})
        assert not isinstance(again, Exception) and [r.offset for r in again.records] == [3]
        other = llog.join_group(group, [topic])
        with pytest.raises(StaleGeneration):
            llog.commit_offsets(group, {(topic, 0): 3}, member=member)
        assert llog.heartbeat(group, member.member_id).generation == other.generation == 2
        described = llog.describe_group(group)
        assert {m.member_id for m in described.members} == {member.member_id, other.member_id}
        assert {(p.partition, p.lag) for p in described.partitions} == {(0, 1), (1, None)}
        with pytest.raises(GroupNotEmpty):
            llog.reset_offsets(group, topic, to="earliest")
        assert llog.leave_group(group, member.member_id)
        assert llog.leave_group(group, other.member_id)
        assert not llog.leave_group(group, other.member_id)
        with pytest.raises(UnknownMember):
            llog.heartbeat(group, other.member_id)
        assert llog.reset_offsets(group, topic, to="latest") == {(topic, 0): 3, (topic, 1): 1}
        assert llog.reset_offsets(group, topic, partition=0, offset=1) == {(topic, 0): 1}
        page = llog.list_groups(after=group[:-1], limit=1)
        assert page.groups and page.groups[0].group <= group


def test_a_group_consumer_commits_what_was_processed_and_the_next_resumes_there(
        broker: Broker, topic: str, group: str) -> None:
    with LlogClient(broker.url, retry=FAST) as llog:
        llog.create_topic(topic, 2)
        for p in (0, 1):
            llog.produce(topic, [f"{p}-{i}" for i in range(5)], partition=p)
        seen: list[tuple[int, int]] = []
        with llog.group_consumer(group, [topic], max_wait_ms=100) as first:
            for record in first:
                seen.append((record.partition, record.offset))
                if len(seen) == 4:
                    break  # the fourth was taken, and not processed
        committed = {p.partition: p.committed_offset
                     for p in llog.describe_group(group).partitions}
        processed: dict[int, int] = {}
        for partition, offset in seen[:3]:
            processed[partition] = offset
        assert committed == processed
        with llog.group_consumer(group, topic, max_wait_ms=100) as second:
            while len(seen) < 11:
                seen.extend((r.partition, r.offset) for r in second.poll())
        assert sorted(set(seen)) == [(p, o) for p in (0, 1) for o in range(1, 6)]
        final = llog.describe_group(group)
        assert final.members == () and {p.lag for p in final.partitions} == {0}


async def test_the_async_client_has_the_same_calls(broker: Broker, topic: str,
                                                   group: str) -> None:
    async with AsyncLlogClient(broker.url, retry=FAST) as llog:
        await llog.produce(topic, ["a", "b"], partition=0)
        member = await llog.join_group(group, [topic])
        (fetched,) = await llog.fetch_group(group, {(topic, 0): "committed"})
        assert not isinstance(fetched, Exception) and len(fetched.records) == 2
        await llog.commit_offsets(group, {(topic, 0): 2}, member=member)
        assert (await llog.heartbeat(group, member.member_id)).generation == 1
        assert (await llog.describe_group(group)).partitions[0].lag == 0
        assert await llog.leave_group(group, member.member_id)
        assert (await llog.list_groups(after=group[:-1])).groups
        assert await llog.reset_offsets(group, topic, partition=0, timestamp_ms=0) == {
            (topic, 0): 0}
