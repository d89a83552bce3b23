"""The read role's services, and those that need the log reader (topic administration,
consumer groups): built and started by :func:`start_read_side`, or, on a broker without
the read role, :meth:`ReadSide.disabled`'s stand-ins, each refusing with its role's
refusal (app/broker/roles.py)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from app.broker import roles
from app.broker.answer_budget import AnswerBudget
from app.broker.answering import READ_FACTOR
from app.broker.consume import ConsumeService
from app.broker.forget_topic import ForgetTopic
from app.broker.topic_view import TopicDirectory
from app.broker.watch import OxiaChangeListener, PartitionWatch
from app.groups.service import GroupService
from app.storage.keys import KeyLayout
from app.storage.reader import LogReader
from app.storage.topic_admin import TopicAdmin
from app.storage.topic_catalog import Topic
from app.storage.topic_deletion import TopicDeleter
from app.storage.writer import LogWriter
from app.stores.oxia.store import OxiaStore
from app.stores.s3.store import S3Store
from app.tailcache import TailCache

if TYPE_CHECKING:
    from app.broker.process import BrokerProcess


@dataclass(frozen=True)
class ReadSide:
    reader: LogReader
    answers: AnswerBudget  # what answers in flight, and reads ahead, hold their bytes in
    consume: ConsumeService
    admin: TopicAdmin
    deleter: TopicDeleter
    groups: GroupService

    @classmethod
    def disabled(cls) -> ReadSide:
        return cls(roles.disabled(LogReader, roles.READ),
                   roles.disabled(AnswerBudget, roles.READ),
                   roles.disabled(ConsumeService, roles.READ),
                   roles.disabled(TopicAdmin, roles.ADMIN),
                   roles.disabled(TopicDeleter, roles.ADMIN),
                   roles.disabled(GroupService, roles.GROUPS))


async def start_read_side(process: BrokerProcess, oxia: OxiaStore, s3: S3Store,
                          layout: KeyLayout, tg: anyio.abc.TaskGroup,
                          stack: contextlib.AsyncExitStack, *, topics: TopicDirectory,
                          cache: TailCache, watch: PartitionWatch, writer: LogWriter,
                          forget: ForgetTopic) -> ReadSide:
    """Build the read side and start its loops in ``tg`` (watched,
    app/service_health.py); the change listener, last, once it listens."""
    s, r, limits = process.settings, process.settings.read_path, process.settings.limits
    answers = AnswerBudget(limits.max_answer_bytes_in_flight,
                           max_wait_s=limits.answer_bytes_wait_ms / 1000)
    reader = LogReader(
        oxia, s3, layout, object_cache_bytes=r.read_object_cache_bytes,
        fetch_concurrency=r.read_fetch_concurrency,
        max_concurrent_fetches=r.read_max_concurrent_fetches,
        read_ahead=r.read_ahead_max_inflight,
        wal_object_max_bytes=r.read_wal_object_max_bytes,
        # Reading ahead holds its bytes in the answers' budget, and only when they fit
        # at once.
        admit=lambda n: answers.try_hold(math.ceil(n * READ_FACTOR)))
    reader.run_ahead_in(tg)
    admin = TopicAdmin(oxia, layout, reader, topics.catalog)
    deleter = await _start_deleter(process, admin, forget, tg)

    async def partitions_of(topic: str) -> int:
        found = await topics.topic(topic)
        return 0 if found is None or found.deleting is not None else found.partitions

    groups = GroupService(oxia, layout, reader, s.consumer_groups, partitions_of,
                          broker_id=s.broker_id, registry=process.registry)
    consume = ConsumeService(
        reader, cache, watch, process.consume_metrics,
        max_long_polls=limits.max_concurrent_long_polls,
        max_streams=limits.max_concurrent_streams, answers=answers)
    listener = OxiaChangeListener(oxia.client, layout, watch, writer.own.claims)
    stack.callback(listener.close)
    with anyio.fail_after(30):
        await tg.start(process.health.watched, listener.run)
    return ReadSide(reader, answers, consume, admin, deleter, groups)


async def _start_deleter(process: BrokerProcess, admin: TopicAdmin, forget: ForgetTopic,
                         tg: anyio.abc.TaskGroup) -> TopicDeleter:
    s = process.settings

    async def forget_deleted(topic: Topic) -> None:
        await forget(topic.name, topic.partitions)

    # The records go once every broker has seen the mark: its topic cache's time to
    # live, and a second for an append placed just before it to be flushed.
    deleter = TopicDeleter(admin, by=s.broker_id, on_deleted=forget_deleted,
                           settle_s=s.topic_rules.topic_cache_ttl_s + 1,
                           registry=process.registry)
    await tg.start(process.health.watched, deleter.run)
    return deleter
