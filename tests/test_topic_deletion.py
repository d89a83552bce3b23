"""Topic deletion in the background (app/storage/topic_deletion.py) and describe a page at
a time, on the real Oxia and MinIO: a delete too long to wait for answers 202 and goes
on; while it does, nobody writes, reads or re-creates the topic; a deleter that dies is
taken over from where its record says, only after its record stood still for a whole
lease; one that stalled past half its lease empties nothing more, and can neither renew
its lease nor remove the record; a partition it cannot empty fails the deletion, not the
broker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest
from prometheus_client import CollectorRegistry

from app.errors import CorruptData, UnknownTopic
from app.localstack.stack import LocalStack
from app.storage.appends import AppendGroup
from app.storage.keys import TopicPartition
from app.storage.metadata import now_ms
from app.storage.topic_admin import TopicAdmin
from app.storage.topic_catalog import TopicCatalog
from app.storage.topic_deletion import DeletionRun, TopicDeleter
from app.storage.writer import LogWriter
from tests.helpers.asgi import in_process_broker
from tests.helpers.bodies import consume_body, produce_body
from tests.helpers.compaction import compaction_settings
from tests.helpers.stack import Engine, open_engine

_WAIT_S = 60  # an outer bound only: every wait below ends on an event


@pytest.fixture
async def own(stack: LocalStack) -> AsyncIterator[Engine]:
    """An engine on a root prefix of its own: a deleter lists every deletion of its
    catalog, and other tests' must not be among them."""
    async with open_engine(compaction_settings(stack)) as engine:
        yield engine


class FakeClock:
    """A monotonic clock a test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Blocking(TopicAdmin):
    """The real admin, except that emptying ``stop_at`` waits until ``release`` is set
    (a deleter that hangs there, or dies there when its task is cancelled)."""

    def __init__(self, engine: Engine, catalog: TopicCatalog, stop_at: int) -> None:
        super().__init__(engine.oxia, engine.layout, engine.reader, catalog)
        self.stop_at = stop_at
        self.reached = anyio.Event()
        self.release = anyio.Event()

    async def empty(self, tp: TopicPartition) -> None:
        if tp.partition == self.stop_at:
            self.reached.set()
            await self.release.wait()
        await super().empty(tp)


class _Broken(TopicAdmin):
    """The real admin, except that partition 1 cannot be emptied (corrupt data)."""

    async def empty(self, tp: TopicPartition) -> None:
        if tp.partition == 1:
            raise CorruptData("a control record that does not parse")
        await super().empty(tp)


async def _written(engine: Engine, catalog: TopicCatalog, topic: str, partitions: int) -> None:
    await catalog.create(topic, partitions)
    await engine.writer.append_shared([AppendGroup(TopicPartition(topic, p), [b"r", b"s"])
                                       for p in range(partitions)])


async def _stalled_at(tg: anyio.abc.TaskGroup, deleter: TopicDeleter, admin: _Blocking,
                      topic: str) -> DeletionRun:
    """``deleter`` started on ``topic`` in ``tg``, once it is held at ``admin.stop_at``."""
    await tg.start(deleter.run)
    _, run = await deleter.start(topic)
    assert run is not None
    with anyio.fail_after(_WAIT_S):
        await admin.reached.wait()
    return run


def _admin(engine: Engine, catalog: TopicCatalog) -> TopicAdmin:
    return TopicAdmin(engine.oxia, engine.layout, engine.reader, catalog)


async def _taken_over(taker: TopicDeleter, clock: FakeClock) -> DeletionRun:
    """``taker`` takes the one abandoned deletion over: it sees the record, then sees
    it unchanged a whole lease later (by its own clock)."""
    assert await taker.resume_abandoned() == []  # seen once: not yet
    clock.now += taker.lease_ms / 1000
    (run,) = await taker.resume_abandoned()
    with anyio.fail_after(_WAIT_S):
        await run.done.wait()
    return run


async def _emptied(engine: Engine, topic: str, partitions: int) -> bool:
    for p in range(partitions):
        control = await engine.reader.read_control(TopicPartition(topic, p))
        assert control is not None
        if control.log_start != control.sequence_counter + 1:
            return False
    return True


async def test_a_delete_too_long_to_wait_for_goes_on_in_the_background(
        stack: LocalStack, topic: str) -> None:
    async with in_process_broker(stack, topic_delete_wait_ms=0, topic_cache_ttl_s=0.5) as http:
        r = await http.post("/topics", json={"topic": topic, "partitions": 3})
        assert r.status_code == 201, r.text
        r = await http.post("/produce", json=produce_body(topic, "a", "b", partition=2))
        assert r.status_code == 200, r.text

        r = await http.delete(f"/topics/{topic}")
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "deleting" and r.json()["partitions"] == 3
        # Until it is gone: listed and described as deleting, and its name is taken.
        r = await http.post("/topics", json={"topic": topic})
        assert r.status_code == 409 and "being deleted" in r.json()["error"]
        with anyio.fail_after(_WAIT_S):
            while (r := await http.get(f"/topics/{topic}")).status_code == 200:
                assert r.json()["status"] == "deleting", r.text
                assert r.json()["partition_states"] == []
                await anyio.sleep(0.05)
        assert r.status_code == 404
        assert topic not in [t["topic"] for t in (await http.get("/topics")).json()["topics"]]
        # Deleted: the records are gone, and the offsets are not reused.
        r = await http.post("/produce", json=produce_body(topic, "c", partition=2))
        assert r.json()["results"][0]["start_offset"] == 3


async def test_a_topic_being_deleted_is_neither_written_nor_read_nor_changed(
        stack: LocalStack, engine: Engine, topic: str) -> None:
    catalog = TopicCatalog(engine.oxia, engine.layout)
    await _written(engine, catalog, topic, 2)
    # Marked by a deleter elsewhere that holds a live lease: this broker only sees it.
    await catalog.mark_deleting(topic, "elsewhere", now_ms(), 600_000)
    async with in_process_broker(stack) as http:
        r = await http.post("/produce", json=produce_body(topic, "x", partition=0))
        assert r.status_code == 404 and "being deleted" in r.json()["error"], r.text
        r = await http.post("/consume", json=consume_body(topic, 1, 0, max_wait_ms=0))
        assert r.json()["results"][0]["error_type"] == "UnknownTopic", r.text
        r = await http.post("/offsets", json={"topic_partitions": [
            {"topic": topic, "partition": 0}]})
        assert r.json()["results"][0]["error_type"] == "UnknownTopic", r.text
        r = await http.patch(f"/topics/{topic}", json={"partitions": 4})
        assert r.status_code == 404, r.text
        r = await http.post("/groups/g-deleting/join", json={"topics": [topic]})
        assert r.status_code == 200 and r.json()["assignment"] == [], r.text
        r = await http.get("/topics")
        (listed,) = [t for t in r.json()["topics"] if t["topic"] == topic]
        assert listed["status"] == "deleting"
        assert listed["deletion"]["partitions_emptied"] == 0
        # Deleting again is deleting once: someone else holds it.
        r = await http.delete(f"/topics/{topic}")
        assert r.status_code == 202 and r.json()["status"] == "deleting", r.text
    # A writer outside a broker (a backfill's, new to the partition) refuses it too.
    fresh = LogWriter(engine.oxia, engine.s3, engine.layout, engine.metrics)
    (refused,) = await fresh.append_shared([AppendGroup(TopicPartition(topic, 1), [b"x"])])
    assert isinstance(refused, UnknownTopic) and "being deleted" in str(refused), refused
    control = await engine.reader.read_control(TopicPartition(topic, 0))
    assert control is not None and control.sequence_counter == 2  # nothing written
    control = await engine.reader.read_control(TopicPartition(topic, 1))
    assert control is not None and control.sequence_counter == 2


async def test_a_deleter_that_died_is_taken_over_where_its_record_says(
        own: Engine, topic: str) -> None:
    engine, catalog = own, TopicCatalog(own.oxia, own.layout)
    await _written(engine, catalog, topic, 5)
    first = _Blocking(engine, catalog, stop_at=3)
    # A short lease, so that it renews (and records how far it got) often.
    dying = TopicDeleter(first, by="dying", lease_ms=400)
    async with anyio.create_task_group() as tg:
        await _stalled_at(tg, dying, first, topic)
        with anyio.fail_after(_WAIT_S):  # polled: the record is what the test watches
            while (marked := await catalog.get(topic)) is None or \
                    marked.deleting is None or marked.deleting.emptied < 3:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()  # the process dies inside partition 3
    marked = await catalog.get(topic)
    assert marked is not None and marked.deleting is not None
    assert marked.deleting.emptied == 3 and marked.deleting.by.startswith("dying/")

    registry, clock = CollectorRegistry(), FakeClock()
    taker = TopicDeleter(_admin(engine, catalog), by="taker", registry=registry,
                         monotonic=clock)
    async with anyio.create_task_group() as tg:
        await tg.start(taker.run)
        run = await _taken_over(taker, clock)
        tg.cancel_scope.cancel()
    assert run.deleted and await catalog.get(topic) is None
    assert await _emptied(engine, topic, 5)
    assert registry.get_sample_value("llog_topic_deletions_total", {"outcome": "deleted"}) == 1
    # Partitions 0 to 2 were emptied by the first deleter; the taker went on from 3.
    assert registry.get_sample_value("llog_topic_deletion_partitions_total") == 2


async def test_a_live_deleter_is_not_taken_over_however_late_its_lease_says(
        own: Engine, topic: str) -> None:
    engine, catalog = own, TopicCatalog(own.oxia, own.layout)
    await _written(engine, catalog, topic, 2)
    # A holder whose wall clock is far behind: its lease_until_ms passed long ago.
    await catalog.mark_deleting(topic, "behind", now_ms() - 3_600_000, 1_000)
    clock = FakeClock()
    taker = TopicDeleter(_admin(engine, catalog), by="taker", monotonic=clock)
    assert await taker.resume_abandoned() == []
    marked = await catalog.get(topic)
    assert marked is not None and marked.deleting is not None
    await catalog.hold_deletion(marked, marked.deleting.by, now_ms(), 1)  # it renews
    clock.now += taker.lease_ms / 1000
    assert await taker.resume_abandoned() == []  # the record moved: the holder lives
    held = await catalog.get(topic)
    assert held is not None and held.deleting is not None and held.deleting.by == "behind"


async def test_a_deleter_that_stalled_empties_nothing_more_nor_removes_the_record(
        own: Engine, topic: str) -> None:
    engine, catalog = own, TopicCatalog(own.oxia, own.layout)
    await _written(engine, catalog, topic, 4)
    slow = _Blocking(engine, catalog, stop_at=1)
    registry, stalled_clock = CollectorRegistry(), FakeClock()
    stalled = TopicDeleter(slow, by="stalled", registry=registry, monotonic=stalled_clock)
    async with anyio.create_task_group() as tg:
        run = await _stalled_at(tg, stalled, slow, topic)
        # It hangs inside partition 1; another broker takes over a lease later, and
        # finishes; the topic is created again and written.
        clock = FakeClock()
        taker = TopicDeleter(_admin(engine, catalog), by="taker", monotonic=clock)
        await tg.start(taker.run)
        taken = await _taken_over(taker, clock)
        assert taken.deleted and await catalog.get(topic) is None
        await catalog.create(topic, 4)
        again = [p for p in range(4) if p != 1]
        await engine.writer.append_shared([AppendGroup(TopicPartition(topic, p), [b"new"])
                                           for p in again])
        # The stalled one wakes up past half its lease (by its own clock).
        stalled_clock.now += stalled.lease_ms / 1000
        slow.release.set()
        with anyio.fail_after(_WAIT_S):
            await run.done.wait()
        tg.cancel_scope.cancel()
    assert not run.deleted
    assert registry.get_sample_value("llog_topic_deletions_total",
                                     {"outcome": "lease_lost"}) == 1
    recreated = await catalog.get(topic)
    assert recreated is not None and recreated.deleting is None  # the new topic stands
    for p in again:  # only the partition it was inside is beyond this guarantee
        control = await engine.reader.read_control(TopicPartition(topic, p))
        assert control is not None and control.log_start <= control.sequence_counter, p


async def test_a_partition_that_cannot_be_emptied_fails_the_deletion_not_the_broker(
        own: Engine, topic: str) -> None:
    engine, catalog = own, TopicCatalog(own.oxia, own.layout)
    await _written(engine, catalog, topic, 3)
    registry = CollectorRegistry()
    deleter = TopicDeleter(_Broken(engine.oxia, engine.layout, engine.reader, catalog),
                           by="broken", registry=registry, settle_s=0)
    async with anyio.create_task_group() as tg:
        await tg.start(deleter.run)
        _, run = await deleter.start(topic)
        assert run is not None
        with anyio.fail_after(_WAIT_S):
            await run.done.wait()
        # The deleter's loop lives on: another topic is deleted by it.
        other = topic + "-other"
        await _written(engine, catalog, other, 1)
        _, second = await deleter.start(other)
        assert second is not None
        with anyio.fail_after(_WAIT_S):
            await second.done.wait()
        tg.cancel_scope.cancel()
    assert not run.deleted and second.deleted
    assert registry.get_sample_value("llog_topic_deletions_total", {"outcome": "failed"}) == 1
    marked = await catalog.get(topic)
    assert marked is not None and marked.deleting is not None  # a taker finishes it later


async def test_describe_answers_a_page_of_partitions_at_a_time(stack: LocalStack,
                                                               topic: str) -> None:
    async with in_process_broker(stack) as http:
        await http.post("/topics", json={"topic": topic, "partitions": 5})
        await http.post("/produce", json=produce_body(topic, "a", partition=3))
        seen: list[int] = []
        start: int | None = 0
        while start is not None:
            r = await http.get(f"/topics/{topic}",
                               params={"from_partition": start, "max_partitions": 2})
            assert r.status_code == 200, r.text
            seen += [p["partition"] for p in r.json()["partition_states"]]
            start = r.json().get("next_partition")
        assert seen == [0, 1, 2, 3, 4]
        whole = (await http.get(f"/topics/{topic}")).json()
        assert whole["next_partition"] is None
        assert [p["high_watermark"] for p in whole["partition_states"]] == [0, 0, 0, 1, 0]
        r = await http.get(f"/topics/{topic}", params={"max_partitions": 1_001})
        assert r.status_code == 400, r.text
