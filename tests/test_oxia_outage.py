"""A commit that Oxia does not answer: waited out within its budget, and never reported
as "not written" once its compare-and-set went unanswered."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import anyio
import psutil
import pytest

from app.errors import CommitInDoubt
from app.localstack.stack import LocalStack, StackConfig
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from tests.helpers.selection import starts_servers
from tests.helpers.stack import Engine, make_settings, open_engine


@pytest.fixture(scope="module")
@starts_servers(slow=True)
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A stack of its own: pausing the session's Oxia would stall every other test."""
    with LocalStack(StackConfig.ephemeral(tmp_path_factory.mktemp("outage"))) as running:
        yield running


def _pause(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, "the server did not stop"
        time.sleep(0.01)


class PauseBeforeCommit:
    """A writer hook: once armed, when the next blob is uploaded Oxia stops answering
    for a while (a leader gone until another is elected), so the commit's CAS goes
    unanswered."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.resume_after_s: float | None = None

    def __call__(self, step: str) -> None:
        if step != "after_blob_put" or self.resume_after_s is None:
            return
        _pause(self.pid)
        threading.Timer(self.resume_after_s, os.kill, (self.pid, signal.SIGCONT)).start()
        self.resume_after_s = None


@dataclass
class Outcome:
    engine: Engine
    tp: TopicPartition
    outcome: object


@contextlib.asynccontextmanager
async def append_in_outage(stack: LocalStack, topic: str, value: bytes, *, budget_s: float,
                           outage_s: float) -> AsyncIterator[Outcome]:
    """``value`` appended (with key ``k1``) after one record by a writer that rides out
    outages up to ``budget_s``, while Oxia stops answering for ``outage_s`` once the
    blob is uploaded: the commit's outcome, and the writer's engine."""
    assert stack.oxia is not None
    settings = make_settings(stack, oxia_request_timeout_s=1.0)
    hook = PauseBeforeCommit(stack.oxia.pid)
    tp = TopicPartition(topic, 0)
    async with open_engine(settings, crash_hook=hook, outage_s=budget_s) as e:
        await e.writer.append_shared([AppendGroup(tp, [b"before"])])
        hook.resume_after_s = outage_s
        with anyio.fail_after(30):
            (outcome,) = await e.writer.append_shared([AppendGroup(tp, [value], "k1")])
        yield Outcome(e, tp, outcome)


async def test_a_commit_rides_out_an_outage_shorter_than_its_budget(
        own_stack: LocalStack, topic: str) -> None:
    async with append_in_outage(own_stack, topic, b"during", budget_s=10.0,
                                outage_s=2.5) as done:
        assert isinstance(done.outcome, AppendResult), done.outcome
        assert (done.outcome.start_offset, done.outcome.end_offset) == (2, 2)
        result = await done.engine.reader.read(done.tp, 1)
    assert [v for _, v in result.records] == [b"before", b"during"]


async def test_an_unanswered_commit_past_its_budget_is_in_doubt_never_unwritten(
        own_stack: LocalStack, topic: str) -> None:
    async with append_in_outage(own_stack, topic, b"maybe", budget_s=1.5,
                                outage_s=4.0) as done:
        # Its CAS reached Oxia and went unanswered: it may land once Oxia is back.
        assert isinstance(done.outcome, CommitInDoubt), done.outcome
        assert done.outcome.maybe_written
    async with open_engine(make_settings(own_stack, oxia_request_timeout_s=1.0)) as e:
        with anyio.fail_after(30):  # rides out the rest of the outage
            (again,) = await e.writer.append_shared(
                [AppendGroup(done.tp, [b"maybe"], "k1")])
        assert isinstance(again, AppendResult), again
        result = await e.reader.read(done.tp, 1)
    # The retry with the same key leaves exactly one copy, whichever way it went.
    assert [v for _, v in result.records] == [b"before", b"maybe"]
