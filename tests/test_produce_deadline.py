"""A produce request's commit deadline (LLOG_PRODUCE_COMMIT_DEADLINE_MS, or the client's
shorter ``Llog-Commit-Deadline-Ms``), against the real Oxia and MinIO: no commit of its
records expects a control version read after it; records past it are answered
ProduceExpired, nothing written, and the groups beside them are committed without them;
so a resend made after the deadline lands once, however late the first attempt's upload
ends (docs/protocol.md, The produce commit deadline).

Faults wrap the store's methods; where one must outlast a deadline it waits for the
clock to pass that deadline (the deadline is the event)."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from app.broker.loop_watchdog import STAMP_S, LoopWatchdog, arrival_floor
from app.broker.produce_call import commit_deadline_ms
from app.errors import CommitInDoubt, InvalidRequest, ProduceExpired
from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from llog_client import ProduceExpired as ClientProduceExpired
from llog_client._config import COMMIT_DEADLINE_HEADER, ClientConfig
from llog_client._errors import LlogError as ClientLlogError
from llog_client._errors import _leaves
from llog_client._ops import Send
from llog_client._retry import ProduceLimits, RetryPolicy
from tests.helpers.bodies import produce_body
from tests.helpers.held_commits import hold_first_commit
from tests.helpers.stack import Engine, open_engine
from tests.test_routes import running_app

HEADER = "Llog-Commit-Deadline-Ms"
WINDOW = 64  # the idempotency keys a partition remembers


async def _past(deadline: float) -> None:
    """Until ``time.monotonic()`` has passed ``deadline`` (timers may fire a hair early)."""
    await anyio.sleep(max(0.0, deadline - time.monotonic()) + 0.01)


# A deadline far enough ahead that a loaded machine still reaches the upload before it
# (a group already late is answered without being uploaded): what these tests wait out.
AHEAD_S = 3.0


def _slow_uploads(e: Engine, until: Callable[[], Awaitable[None]], n: int = 1) -> list[str]:
    """The first ``n`` uploads of ``e``'s writer wait for ``until`` before they are
    sent; the keys of every upload, as they start."""
    real, started = e.s3.put, []

    async def put(key: str, body: bytes) -> None:
        started.append(key)
        if len(started) <= n:
            await until()
        await real(key, body)

    e.s3.put = put  # type: ignore[method-assign]
    return started


async def test_records_past_their_deadline_are_not_written_a_group_in_time_beside_them_is(
        engine: Engine, topic: str) -> None:
    """The upload outlasts one request's deadline: its group is answered ProduceExpired,
    not maybe written; a group of the same partition from another request, still in
    time, shared the blob and is committed from a second upload without it."""
    tp = TopicPartition(topic, 0)
    deadline = time.monotonic() + AHEAD_S
    uploads = _slow_uploads(engine, lambda: _past(deadline))
    late, in_time = await engine.writer.append_shared([
        AppendGroup(tp, [b"late"], "key-late", commit_by=deadline),
        AppendGroup(tp, [b"in time"], "key-in-time", commit_by=time.monotonic() + 3600)])
    assert isinstance(late, ProduceExpired) and late.retriable and not late.maybe_written
    assert isinstance(in_time, AppendResult) and in_time.start_offset == 1
    assert len(uploads) == 2 and in_time.wal_uri.endswith(uploads[1])
    assert (await engine.reader.read(tp, 1)).records == [(1, b"in time")]
    # Never committed, its key is not remembered: sent again, it is appended.
    (again,) = await engine.writer.append_shared([AppendGroup(tp, [b"late"], "key-late")])
    assert isinstance(again, AppendResult) and not again.duplicate and again.start_offset == 2


async def test_a_resend_after_the_deadline_lands_once_however_late_the_first_upload_ends(
        engine: Engine, settings: Settings, tp: TopicPartition) -> None:
    """Broker B's object store holds the first attempt's upload; its client gives up at
    the deadline and sends the records again, under the same key, through broker A,
    which commits them; more keyed appends than the partition remembers follow. Then
    B's upload ends: its attempt is answered ProduceExpired and writes nothing, so the
    log holds one copy."""
    released, deadline, held = anyio.Event(), time.monotonic() + AHEAD_S, anyio.Event()

    async def hold() -> None:
        held.set()
        await released.wait()

    uploads = _slow_uploads(engine, hold)
    outcome: list[Any] = []
    async with open_engine(settings) as other, anyio.create_task_group() as tg:

        async def first_attempt() -> None:
            outcome.extend(await engine.writer.append_shared(
                [AppendGroup(tp, [b"K"], "K", commit_by=deadline)]))

        tg.start_soon(first_attempt)
        with anyio.fail_after(60):
            await held.wait()  # the first attempt is under way, its upload held
        await _past(deadline)  # the client's timeout, after the deadline
        assert uploads
        (resend,) = await other.writer.append_shared([AppendGroup(tp, [b"K"], "K")])
        assert isinstance(resend, AppendResult) and resend.start_offset == 1
        for i in range(WINDOW + 2):
            (r,) = await other.writer.append_shared([AppendGroup(tp, [b"x"], f"other-{i}")])
            assert isinstance(r, AppendResult)
        released.set()
    (first,) = outcome
    assert isinstance(first, ProduceExpired) and not first.maybe_written
    records = (await engine.reader.read(tp, 1, max_records=1000)).records
    assert [v for _, v in records].count(b"K") == 1
    assert len(records) == WINDOW + 3


@pytest.mark.parametrize(("before", "after"), [(0, WINDOW), (WINDOW, WINDOW - 1)],
                         ids=["forgotten", "remembered"])
async def test_a_commit_that_lost_to_its_key_never_appends_it_once_the_key_may_be_forgotten(
        engine: Engine, settings: Settings, tp: TopicPartition, before: int,
        after: int) -> None:
    """Broker B reads the control record (``before`` keyed appends in, the window full
    or not) and its commit, under key K beside a group without a key, is held on the
    wire; meanwhile A commits K (a late first copy, or the client's resend) and
    ``after`` more keyed appends. B's commit conflicts and reads again. With K still in
    the window, B answers a duplicate. With more keyed appends since its first read
    than the window holds, not finding K shows nothing: B answers it CommitInDoubt
    rather than appending it blind; either way the log holds one copy, and the group
    without a key is appended."""
    for i in range(before):
        (r,) = await engine.writer.append_shared([AppendGroup(tp, [b"x"], f"before-{i}")])
        assert isinstance(r, AppendResult)
    held, release, answers = anyio.Event(), anyio.Event(), []
    async with open_engine(settings) as b, anyio.create_task_group() as tg:
        await b.writer.ensure_partition(tp)
        hold_first_commit(b, held, release)

        async def append_on_b() -> None:
            answers.extend(await b.writer.append_shared(
                [AppendGroup(tp, [b"K"], "K"), AppendGroup(tp, [b"no key"])]))

        tg.start_soon(append_on_b)
        await held.wait()
        (first,) = await engine.writer.append_shared([AppendGroup(tp, [b"K"], "K")])
        assert isinstance(first, AppendResult) and first.start_offset == before + 1
        for i in range(after):
            (r,) = await engine.writer.append_shared([AppendGroup(tp, [b"x"], f"after-{i}")])
            assert isinstance(r, AppendResult)
        release.set()
    keyed, unkeyed = answers
    if after < WINDOW:
        assert isinstance(keyed, AppendResult) and keyed.duplicate
        assert keyed.start_offset == first.start_offset
    else:
        assert type(keyed) is CommitInDoubt and keyed.retriable and keyed.maybe_written
    assert isinstance(unkeyed, AppendResult) and unkeyed.start_offset == before + after + 2
    records = (await engine.reader.read(tp, 1, max_records=1000)).records
    assert [v for _, v in records].count(b"K") == 1
    assert records[-1] == (unkeyed.start_offset, b"no key")


async def test_records_already_past_their_deadline_are_not_uploaded(
        engine: Engine, topic: str) -> None:
    """Groups whose deadline passed before the writer took them (they waited in the
    batcher) are answered ProduceExpired before any upload: the groups beside them are
    uploaded once without them, and a flush of late groups alone uploads nothing."""
    late_tp, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    uploads = _slow_uploads(engine, anyio.lowlevel.checkpoint, n=0)
    past = time.monotonic() - 1
    late, echo, in_time, beside = await engine.writer.append_shared([
        AppendGroup(late_tp, [b"late"], "key-late", commit_by=past),
        AppendGroup(late_tp, [b"late, again"], "key-late", commit_by=past),
        AppendGroup(late_tp, [b"in time"], commit_by=time.monotonic() + 3600),
        AppendGroup(other, [b"beside"])])
    assert isinstance(late, ProduceExpired) and not late.maybe_written
    assert isinstance(echo, ProduceExpired) and not echo.maybe_written
    assert isinstance(in_time, AppendResult) and in_time.start_offset == 1
    assert isinstance(beside, AppendResult) and beside.wal_uri == in_time.wal_uri
    assert len(uploads) == 1
    (alone,) = await engine.writer.append_shared(
        [AppendGroup(late_tp, [b"late"], "key-late", commit_by=past)])
    assert isinstance(alone, ProduceExpired) and len(uploads) == 1
    assert (await engine.reader.read(late_tp, 1)).records == [(1, b"in time")]


async def test_a_request_past_its_header_deadline_is_answered_produce_expired(
        stack: LocalStack, topic: str) -> None:
    """Over HTTP: the client's header shortens the deadline; an upload held past it has
    the entry answered ProduceExpired (409, retriable, not maybe written), nothing
    written, which the Python client knows as its own class."""
    async with running_app(stack) as (app, client):
        state = app.state.broker
        real = state.writer._s3.put
        held: list[float] = []

        async def put(key: str, body: bytes) -> None:
            if not held:
                held.append(time.monotonic())
                await _past(held[0] + 0.3)  # the upload began after the request came in
            await real(key, body)

        state.writer._s3.put = put
        r = await client.post("/produce", json=produce_body(topic, "late"),
                              headers={HEADER: "300"})
        assert r.status_code == 409, r.text
        (result,) = r.json()["results"]
        assert result["error_type"] == "ProduceExpired"
        assert result["retriable"] is True and result["maybe_written"] is False
        after = await client.post("/produce", json=produce_body(topic, "after"))
        assert after.status_code == 200 and after.json()["results"][0]["start_offset"] == 1
    assert _leaves(ClientLlogError)["ProduceExpired"] is ClientProduceExpired


@pytest.mark.parametrize("value", [b"0", b"-5", b"1.5", b"1e3", b"abc", b"", b"0" * 11,
                                   "\N{SUPERSCRIPT TWO}".encode("latin-1")])
async def test_a_malformed_deadline_header_is_refused_and_nothing_written(
        stack: LocalStack, topic: str, value: bytes) -> None:
    async with running_app(stack) as (_, client):
        r = await client.post("/produce", json=produce_body(topic, "no"),
                              headers={HEADER: value})
        assert r.status_code == 400, r.text
        assert r.json()["error_type"] == "InvalidRequest"
        after = await client.post("/produce", json=produce_body(topic, "after"))
        assert after.status_code == 200 and after.json()["results"][0]["start_offset"] == 1


def test_the_header_only_shortens_the_setting() -> None:
    s = Settings(produce_commit_deadline_ms=20_000)
    assert Settings().produce_commit_deadline_ms == 25_000
    assert commit_deadline_ms(None, s) == 20_000
    assert commit_deadline_ms("9000", s) == 9_000
    assert commit_deadline_ms(" 9000 ", s) == 9_000
    assert commit_deadline_ms("600000", s) == 20_000
    # A client with a very long timeout asks for more than any setting: the setting.
    assert commit_deadline_ms("99999999000", s) == 20_000
    assert commit_deadline_ms("9" * 40, s) == 20_000
    with pytest.raises(InvalidRequest):
        commit_deadline_ms("0", s)
    for bad in (999, 600_001):
        with pytest.raises(ValueError, match="produce_commit_deadline_ms"):
            Settings(produce_commit_deadline_ms=bad)


@pytest.mark.parametrize(("timeout_s", "sent"), [(30.0, "29000"), (10.0, "9000"),
                                                 (2.0, "1800"), (1e8, "600000"),
                                                 (math.inf, None)])
def test_the_python_client_asks_for_its_timeout_less_a_margin(timeout_s: float,
                                                              sent: str) -> None:
    config = ClientConfig(["http://b"], timeout_s, RetryPolicy(), ProduceLimits())
    _, headers = config.request(Send("POST", "/produce", b"{}", compressible=True))
    assert headers.get(COMMIT_DEADLINE_HEADER) == sent
    _, others = config.request(Send("POST", "/consume", b"{}"))
    assert COMMIT_DEADLINE_HEADER not in others


def test_a_request_first_seen_after_a_stall_counts_from_the_stall() -> None:
    """A paused process (or a blocked loop) may have left a request waiting since its
    loop last ran: its deadline counts from then, not from when it was first seen."""
    now = [100.0]
    watchdog = LoopWatchdog(15.0, lambda _: None, clock=lambda: now[0])
    watchdog.loop_stamp = 100.0  # the loop's last stamp
    assert watchdog.arrival_floor(100.1) == 100.1  # a loop that runs: as seen
    assert watchdog.arrival_floor(130.0) == 100.0 + STAMP_S  # 30 s of stall before it


async def test_a_stopped_watchdog_floors_no_arrival() -> None:
    """Its stamp stopped with it: a broker started later in the same process (tests,
    `llog dev`) must not count its requests from that old stamp."""
    watchdog = LoopWatchdog(15.0, lambda _: None)
    async with anyio.create_task_group() as tg:
        await tg.start(watchdog.run)
        tg.cancel_scope.cancel()
    seen = time.monotonic() + 60.0
    assert arrival_floor(seen) == seen
