"""Forwarding appends between brokers: the frames, the handshake, the not-written /
unknown rule, and forwarded appends committed through a real batcher and writer."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from app.batching.batcher import Batcher
from app.cluster import frames
from app.cluster.fences import Fence, FenceMetrics, ForwardFences
from app.cluster.forward import (
    ForwardClient,
    ForwardNotWritten,
    ForwardServer,
    ForwardUnknown,
    LateAnswer,
)
from app.cluster.forward_metrics import ForwardMetrics
from app.cluster.forward_server import ForwardHandler
from app.cluster.frames import FrameType
from app.errors import (
    BackPressureRejected,
    CommitInDoubt,
    PartitionFenced,
    StorageUnavailable,
    Unavailable,
)
from app.localstack.processes import free_port
from app.storage.appends import AppendGroup, AppendOutcome, AppendResult, ProducerSeq
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord
from tests.helpers.stack import Engine
from tests.test_metric_names import naming_problems

A, B = TopicPartition("fa", 0), TopicPartition("fb", 3)
SECRET = "a-cluster-secret-of-some-length!"


def _result(group: AppendGroup, start: int) -> AppendResult:
    n = len(group.records)
    return AppendResult(group.tp, start, start + n - 1, n, f"idx/{start}", "s3://b/k",
                        append_time_ms=1_700_000_000_000)


class FakeHandler:
    """Answers like a log (offsets per partition); can be held, or made to fail."""

    def __init__(self) -> None:
        self.calls: list[list[AppendGroup]] = []
        self.entered = anyio.Event()
        self.release: anyio.Event | None = None
        self.fail_with: BaseException | None = None
        self.next: dict[TopicPartition, int] = {}

    async def __call__(self, groups: list[AppendGroup], take_by: float, fence: Fence,
                       window_s: float) -> list[AppendOutcome]:
        self.calls.append(groups)
        self.entered.set()
        if self.release is not None:
            await self.release.wait()
        if self.fail_with is not None:
            raise self.fail_with
        out: list[AppendOutcome] = []
        for g in groups:
            start = self.next.get(g.tp, 1)
            self.next[g.tp] = start + len(g.records)
            out.append(_result(g, start))
        return out


@contextlib.asynccontextmanager
async def serving(handler: ForwardHandler, **options: Any
                  ) -> AsyncIterator[tuple[ForwardServer, anyio.abc.TaskGroup]]:
    options.setdefault("secret", SECRET)
    server = ForwardServer(handler, host="127.0.0.1", port=options.pop("port", 0), **options)
    async with anyio.create_task_group() as tg:
        await tg.start(server.run)
        try:
            yield server, tg
        finally:
            server.close()


@contextlib.asynccontextmanager
async def killable(handler: ForwardHandler) -> AsyncIterator[tuple[ForwardServer,
                                                                   anyio.CancelScope]]:
    """A server, and the scope that kills it (its connections cut, nothing answered)."""
    server = ForwardServer(handler, host="127.0.0.1", port=0, secret=SECRET)
    scope = anyio.CancelScope()

    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with scope:
            await server.run(task_status=task_status)

    async with anyio.create_task_group() as tg:
        await tg.start(run)
        yield server, scope
        server.close()


@contextlib.asynccontextmanager
async def client_of(address: str, **options: Any) -> AsyncIterator[ForwardClient]:
    options.setdefault("secret", SECRET)
    options.setdefault("deadline_s", 5.0)
    options.setdefault("answer_timeout_s", 10.0)
    client = ForwardClient(address, **options)
    try:
        yield client
    finally:
        await client.aclose()


def _values(group: AppendGroup) -> list[bytes]:
    return [p if isinstance(p, bytes) else p.value for p in group.records]


# -- frames -------------------------------------------------------------------------------

async def _read(parts: frames.Parts, max_payload: int = 1 << 20) -> frames.Frame:
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(parts))
    reader.feed_eof()
    got = await frames.read_frame(reader, max_payload)
    assert got is not None
    assert await frames.read_frame(reader, max_payload) is None  # a clean end
    return got


async def test_an_append_frame_carries_the_groups_bodies_as_they_are() -> None:
    batch = RecordBatch.of([b"one", b"two"])
    groups = [AppendGroup(A, batch, "key-1"),
              AppendGroup(B, [LogRecord(b"v", key=b"k", headers=(("h", b"x"),))])]
    fence = Fence(1_700_000_000_123, "m.w0.c0ffee.7")
    parts = frames.append(7, 150, 13_300, fence, groups)
    assert any(p is batch.body for p in parts)  # the encoded body itself, not a copy
    got = await _read(parts)
    assert got.type is FrameType.APPEND
    head = frames.parse_append_head(got.payload)
    assert (head.frame_id, head.deadline_ms, head.window_ms, head.fence) == (
        7, 150, 13_300, fence)
    parsed = frames.parse_append_groups(got.payload, head)
    assert [(g.tp, g.idempotency_key) for g in parsed] == [(A, "key-1"), (B, None)]
    assert _values(parsed[0]) == [b"one", b"two"]
    assert list(parsed[1].records) == [LogRecord(b"v", key=b"k", headers=(("h", b"x"),))]


async def test_an_append_frame_carries_each_groups_producer_sequence() -> None:
    groups = [AppendGroup(A, [b"x"], producer=ProducerSeq("p-1", 41)), AppendGroup(B, [b"y"]),
              AppendGroup(A, [b"z"], producer=ProducerSeq("p-1", 42))]
    got = await _read(frames.append(3, 150, 13_300, Fence(1, "m.w0.c0ffee.7"), groups))
    parsed = frames.parse_append_groups(got.payload, frames.parse_append_head(got.payload))
    assert [(g.tp, g.producer) for g in parsed] == [
        (A, ProducerSeq("p-1", 41)), (B, None), (A, ProducerSeq("p-1", 42))]


async def test_results_rebuild_each_outcome_as_it_was() -> None:
    groups = [AppendGroup(A, [b"x"]), AppendGroup(B, [b"y"]), AppendGroup(A, [b"z"])]
    duplicate = AppendResult(A, 4, 4, 1, "idx/4", "s3://b/k", True, 1_700_000_000_001)
    outcomes: list[AppendOutcome] = [
        duplicate, PartitionFenced("fb is fenced"), CommitInDoubt("the commit timed out")]
    got = await _read(frames.results(9, groups, outcomes))
    assert got.type is FrameType.RESULTS and frames.frame_id(got.payload) == 9
    back = frames.parse_results(got.payload, groups)
    assert back[0] == duplicate
    assert type(back[1]) is PartitionFenced and str(back[1]) == "fb is fenced"
    assert type(back[2]) is CommitInDoubt and back[2].maybe_written and back[2].retriable
    # Results for other groups than were sent are a broken peer, not an answer.
    with pytest.raises(frames.FrameError):
        frames.parse_results(got.payload, [*groups[1:], groups[0]])


def test_an_error_a_peer_names_that_this_broker_does_not_know_stays_on_the_safe_side(
) -> None:
    doubt = frames.rebuild_error("NewKindOfDoubt", "m", retriable=True, maybe_written=True)
    assert type(doubt) is CommitInDoubt and "NewKindOfDoubt" in str(doubt)
    refusal = frames.rebuild_error("NewRefusal", "m", retriable=False, maybe_written=False)
    assert type(refusal) is Unavailable and not refusal.retriable and not refusal.maybe_written
    flags = frames.rebuild_error("StorageUnavailable", "m", retriable=False,
                                 maybe_written=True)
    assert type(flags) is StorageUnavailable and not flags.retriable and flags.maybe_written


async def test_refused_and_expired_frames() -> None:
    got = await _read(frames.refused(3, BackPressureRejected("full")))
    assert (got.type, frames.frame_id(got.payload)) == (FrameType.REFUSED, 3)
    assert frames.parse_refused(got.payload) == "BackPressureRejected: full"
    got = await _read(frames.expired(4))
    assert (got.type, frames.frame_id(got.payload)) == (FrameType.EXPIRED, 4)


async def test_a_frame_over_the_limit_is_refused_before_its_payload_is_read() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"".join(frames.frame(FrameType.APPEND, b"x" * 100)))
    with pytest.raises(frames.FrameTooLarge):
        await frames.read_frame(reader, 99)


# -- the connection -----------------------------------------------------------------------

async def test_a_window_cut_to_a_produce_deadline_leaves_room_for_the_connect() -> None:
    """A frame's window ends before its groups' ``commit_by`` though it must still wait
    for a connection to be made: the connect timeout is taken off it then, and no
    longer once the connection is up."""
    windows: list[float] = []

    async def handler(groups: list[AppendGroup], take_by: float, fence: Fence,
                      window_s: float) -> list[AppendOutcome]:
        windows.append(window_s)
        return [_result(g, 1) for g in groups]

    async with serving(handler) as (server, _), client_of(
            server.address, deadline_s=1.0, answer_timeout_s=5.0) as client:
        for _ in range(2):
            before = time.monotonic()
            await client.append([AppendGroup(A, [b"x"], commit_by=before + 7.5)])
    # 7.5 s less the peer's buffering deadline (1 s) and the network's margin (1 s);
    # the first also less the connect timeout (the answer timeout, 5 s).
    first, second = windows
    assert 0 < first <= 0.5 and 5.0 <= second <= 5.5



async def test_forwarded_appends_are_answered_by_id_in_any_order() -> None:
    """Many APPENDs in flight on one connection, answered as their appends finish."""
    gates = {A: anyio.Event(), B: anyio.Event()}
    entered: list[TopicPartition] = []
    both_in = anyio.Event()

    async def handler(groups: list[AppendGroup], take_by: float, fence: Fence,
                      window_s: float) -> list[AppendOutcome]:
        entered.append(groups[0].tp)
        if len(entered) == 2:
            both_in.set()
        await gates[groups[0].tp].wait()
        return [_result(g, 10 if g.tp == A else 20) for g in groups]

    got: dict[TopicPartition, list[AppendOutcome]] = {}
    b_answered = anyio.Event()
    with anyio.fail_after(30):
        async with serving(handler) as (server, _), client_of(server.address) as client:
            async with anyio.create_task_group() as tg:
                async def forward(tp: TopicPartition) -> None:
                    got[tp] = await client.append([AppendGroup(tp, [tp.topic.encode()])])
                    if tp == B:
                        b_answered.set()

                tg.start_soon(forward, A)
                tg.start_soon(forward, B)
                await both_in.wait()
                gates[B].set()  # the second frame is answered first
                await b_answered.wait()
                assert A not in got
                gates[A].set()
    assert [o.start_offset for o in got[A] if isinstance(o, AppendResult)] == [10]
    assert [o.start_offset for o in got[B] if isinstance(o, AppendResult)] == [20]


async def test_handler_failures_answer_that_frame_and_the_connection_goes_on() -> None:
    handler = FakeHandler()
    registry = CollectorRegistry()
    metrics = ForwardMetrics(registry, member="b1.w0")
    with anyio.fail_after(30):
        async with serving(handler, metrics=metrics) as (server, _), \
                client_of(server.address, metrics=metrics) as client:
            handler.fail_with = BackPressureRejected("the buffer is full")
            with pytest.raises(ForwardNotWritten) as refused:
                await client.append([AppendGroup(A, [b"x"])])
            assert refused.value.reason == "refused"
            assert "BackPressureRejected" in str(refused.value)
            handler.fail_with = RuntimeError("a bug")  # may have written: per group
            (doubt,) = await client.append([AppendGroup(A, [b"x"])])
            assert isinstance(doubt, CommitInDoubt) and doubt.maybe_written
            handler.fail_with = None
            (ok,) = await client.append([AppendGroup(A, [b"x"])])
            assert isinstance(ok, AppendResult) and ok.start_offset == 1
    text = generate_latest(registry).decode()
    assert not naming_problems(text)
    assert 'llog_forward_frames_total{member="b1.w0",outcome="results"} 2.0' in text
    assert 'llog_forward_frames_total{member="b1.w0",outcome="refused"} 1.0' in text
    assert ('llog_forward_received_groups_total{member="b1.w0",outcome="refused"} 1.0'
            in text)
    assert ('llog_forward_received_groups_total{member="b1.w0",outcome="appended"} 2.0'
            in text)
    assert 'llog_forward_seconds_count{member="b1.w0"} 3.0' in text  # every answer


async def test_a_wrong_secret_is_refused_before_any_append_is_read() -> None:
    handler = FakeHandler()
    with anyio.fail_after(30):
        async with serving(handler) as (server, _):
            async with client_of(server.address, secret="not-the-secret") as client:
                with pytest.raises(ForwardNotWritten) as excinfo:
                    await client.append([AppendGroup(A, [b"x"])])
                assert excinfo.value.reason == "unreachable"
            async with client_of(server.address, secret=None) as client:
                with pytest.raises(ForwardNotWritten):
                    await client.append([AppendGroup(A, [b"x"])])
            # A client that sends its APPEND right behind a bad AUTH: the server refuses
            # the connection and closes it without reading the APPEND.
            host, port = server.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            hello = await frames.read_frame(reader, 1024)
            assert hello is not None and hello.type is FrameType.HELLO
            server_nonce = frames.parse_hello(hello.payload)
            nonce = b"n" * frames.NONCE_BYTES
            writer.writelines(frames.auth(nonce, frames.mac("wrong", "client", server_nonce,
                                                            nonce)))
            writer.writelines(frames.append(1, 1000, 1000, Fence(0, "x.1"),
                                            [AppendGroup(A, [b"sneaky"])]))
            answers = []
            with contextlib.suppress(ConnectionError):  # closed with the APPEND unread
                while (answer := await frames.read_frame(reader, 1024)) is not None:
                    answers.append(answer)
            writer.close()
            # At most the refusal of the connection (a reset may overtake it); no answer.
            assert all(a.type is FrameType.REFUSED
                       and frames.frame_id(a.payload) == frames.CONNECTION
                       and frames.parse_refused(a.payload).startswith("Unauthenticated")
                       for a in answers)
    assert handler.calls == []


async def test_a_client_does_not_forward_to_a_server_of_another_protocol_version(
) -> None:
    """Version 3 put the commit window into an APPEND's head, so an APPEND of version 2
    read as 3 would misplace every field after its deadline. A client that meets a
    server of version 2 (its HELLO says so) sends it nothing, not even AUTH: the frame
    is not written, and the forwarding broker appends it itself."""
    assert frames.PROTOCOL_VERSION == 3
    received: list[bytes] = []
    done = anyio.Event()

    async def old_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                         ) -> None:
        writer.writelines(frames.frame(FrameType.HELLO,
                                       struct.pack(">H32s", 2, b"n" * frames.NONCE_BYTES)))
        await writer.drain()
        try:
            received.append(await reader.read())  # until the client goes away
        except ConnectionError:
            received.append(b"")
        writer.close()
        done.set()

    server = await asyncio.start_server(old_server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with anyio.fail_after(30):
        async with server, client_of(f"127.0.0.1:{port}") as client:
            with pytest.raises(ForwardNotWritten) as excinfo:
                await client.append([AppendGroup(A, [b"x"])])
            await done.wait()
    assert excinfo.value.reason == "unreachable"
    assert "forward protocol version 2 and this broker 3" in str(excinfo.value)
    assert received == [b""]


async def test_a_server_refuses_a_client_of_another_protocol_version() -> None:
    """A client whose AUTH says version 2 is refused (id 0, naming both versions) and
    the connection closed before any APPEND is read."""
    handler = FakeHandler()
    with anyio.fail_after(30):
        async with serving(handler) as (server, _):
            host, port = server.address.rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            hello = await frames.read_frame(reader, 1024)
            assert hello is not None and hello.type is FrameType.HELLO
            frames.parse_hello(hello.payload)  # version 3: this client's own
            writer.writelines(frames.frame(
                FrameType.AUTH, struct.pack(">H32s", 2, b"n" * frames.NONCE_BYTES)))
            answers = []
            while (answer := await frames.read_frame(reader, 4096)) is not None:
                answers.append(answer)
            writer.close()
    (refusal,) = answers
    assert refusal.type is FrameType.REFUSED
    assert frames.frame_id(refusal.payload) == frames.CONNECTION
    assert frames.parse_refused(refusal.payload).startswith(
        "InvalidRequest: the peer speaks forward protocol version 2 and this broker 3")
    assert handler.calls == []


async def test_a_server_without_a_secret_is_not_trusted_by_a_client_with_one() -> None:
    handler = FakeHandler()
    with anyio.fail_after(30):
        async with serving(handler, secret=None) as (server, _):
            async with client_of(server.address) as client:
                with pytest.raises(ForwardNotWritten) as excinfo:
                    await client.append([AppendGroup(A, [b"x"])])
                assert "did not prove" in str(excinfo.value)
            async with client_of(server.address, secret=None) as client:  # both open
                (ok,) = await client.append([AppendGroup(A, [b"x"])])
                assert isinstance(ok, AppendResult)
    assert len(handler.calls) == 1


async def test_frames_over_the_limit_are_refused() -> None:
    handler = FakeHandler()
    with anyio.fail_after(30):
        async with serving(handler, max_frame_bytes=4096) as (server, _):
            # The client does not send a frame over its own limit: not written.
            async with client_of(server.address, max_frame_bytes=4096) as client:
                with pytest.raises(ForwardNotWritten) as excinfo:
                    await client.append([AppendGroup(A, [b"x" * 5000])])
                assert excinfo.value.reason == "refused"
                (ok,) = await client.append([AppendGroup(A, [b"x" * 100])])
                assert isinstance(ok, AppendResult)
            # The server refuses one over its limit and closes: the client cannot know
            # whether the server read it, so the frame's outcome is unknown.
            async with client_of(server.address) as client:
                with pytest.raises(ForwardUnknown) as unknown:
                    await client.append([AppendGroup(A, [b"x" * 5000])])
                assert unknown.value.reason == "broken"
    assert [len(c) for c in handler.calls] == [1]


async def test_a_refused_connection_is_not_written() -> None:
    async with client_of(f"127.0.0.1:{free_port()}") as client:
        with anyio.fail_after(30), pytest.raises(ForwardNotWritten) as excinfo:
            await client.append([AppendGroup(A, [b"x"])])
    assert excinfo.value.reason == "unreachable"


async def test_a_server_killed_mid_flight_leaves_every_sent_frame_unknown() -> None:
    handler = FakeHandler()
    handler.release = anyio.Event()  # never set: the appends hang in the handler
    errors: list[BaseException] = []
    all_failed = anyio.Event()
    with anyio.fail_after(30):
        async with killable(handler) as (server, kill):
            async with client_of(server.address) as client:
                async with anyio.create_task_group() as tg:
                    async def forward(tp: TopicPartition) -> None:
                        try:
                            await client.append([AppendGroup(tp, [b"x"])])
                        except (ForwardUnknown, ForwardNotWritten) as exc:
                            errors.append(exc)
                        if len(errors) == 3:
                            all_failed.set()

                    for tp in (A, B, A):
                        tg.start_soon(forward, tp)
                    while len(handler.calls) < 3:
                        await handler.entered.wait()
                        handler.entered = anyio.Event()
                    kill.cancel()  # the server dies, answering nothing
                    await all_failed.wait()
                # The next append finds no server: certainly not written.
                with pytest.raises(ForwardNotWritten) as after:
                    await client.append([AppendGroup(A, [b"y"])])
                assert after.value.reason == "unreachable"
    assert len(errors) == 3
    assert all(isinstance(e, ForwardUnknown) and e.reason == "broken" for e in errors)


async def test_closing_the_server_answers_what_it_read_then_closes() -> None:
    handler = FakeHandler()
    handler.release = anyio.Event()
    got: list[list[AppendOutcome]] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as server_tg:
            server = ForwardServer(handler, host="127.0.0.1", port=0, secret=SECRET)
            await server_tg.start(server.run)
            async with client_of(server.address) as client, \
                    anyio.create_task_group() as tg:
                async def forward() -> None:
                    got.append(await client.append([AppendGroup(A, [b"x"])]))

                tg.start_soon(forward)
                await handler.entered.wait()
                server.close()  # the frame in flight is still answered
                await anyio.wait_all_tasks_blocked()
                handler.release.set()
        # server.run returned: every connection is closed
        async with client_of(server.address) as client:
            with pytest.raises(ForwardNotWritten):
                await client.append([AppendGroup(A, [b"late"])])
    assert len(got) == 1 and isinstance(got[0][0], AppendResult)


async def test_no_answer_in_time_is_unknown_and_aclose_answers_every_waiter() -> None:
    handler = FakeHandler()
    handler.release = anyio.Event()
    with anyio.fail_after(30):
        async with serving(handler) as (server, _):
            async with client_of(server.address, deadline_s=0.01,
                                 answer_timeout_s=0.05) as client:
                with pytest.raises(ForwardUnknown) as excinfo:
                    await client.append([AppendGroup(A, [b"x"])])
                assert excinfo.value.reason == "timeout"
            client = ForwardClient(server.address, secret=SECRET, deadline_s=5,
                                   answer_timeout_s=60, commit_window_s=71)
            outcome: list[BaseException] = []
            async with anyio.create_task_group() as tg:
                async def forward() -> None:
                    try:
                        await client.append([AppendGroup(B, [b"x"])])
                    except ForwardUnknown as exc:
                        outcome.append(exc)

                tg.start_soon(forward)
                while len(handler.calls) < 2:
                    await handler.entered.wait()
                    handler.entered = anyio.Event()
                await client.aclose()
            with pytest.raises(ForwardNotWritten) as closed:
                await client.append([AppendGroup(B, [b"y"])])
            assert closed.value.reason == "closed"
            handler.release.set()
    assert len(outcome) == 1 and isinstance(outcome[0], ForwardUnknown)
    assert outcome[0].reason == "closed"


async def test_an_answer_after_the_timeout_still_settles_the_frame_until_released(
) -> None:
    """The frame that timed out keeps its place on the connection: the peer's answer,
    when it comes, is the outcome of each group (a slow peer, not a dead one). A place
    given up (``release``) drops a later answer, and its waiters stop at once; the
    connection serves other frames all along."""
    handler = FakeHandler()
    handler.release = anyio.Event()
    with anyio.fail_after(30):
        async with serving(handler) as (server, _), \
                client_of(server.address, deadline_s=0.01, answer_timeout_s=0.05) as client:
            with pytest.raises(ForwardUnknown) as slow:
                await client.append([AppendGroup(A, [b"x", b"y"]), AppendGroup(B, [b"z"])])
            late = slow.value.late
            assert slow.value.reason == "timeout" and late is not None
            assert await late.outcomes(time.monotonic()) is None  # not yet: no wait
            handler.release.set()
            outcomes = await late.outcomes(time.monotonic() + 20)
            assert outcomes is not None
            assert [(o.tp, o.start_offset, o.end_offset) for o in outcomes  # type: ignore[union-attr]
                    ] == [(A, 1, 2), (B, 1, 1)]
            late.release()  # what was answered stays answered
            assert await late.outcomes(time.monotonic()) == outcomes

            handler.release = anyio.Event()
            with pytest.raises(ForwardUnknown) as again:
                await client.append([AppendGroup(A, [b"w"])])
            given_up = again.value.late
            assert given_up is not None
            assert await _waited_while(given_up, given_up.release) is None
            handler.release.set()
            (ok,) = await client.append([AppendGroup(B, [b"v"])])  # the same connection
            assert isinstance(ok, AppendResult) and ok.start_offset == 2
    assert len(handler.calls) == 3


async def test_a_late_answer_the_connection_never_brings_ends_the_wait_when_it_breaks(
) -> None:
    handler = FakeHandler()
    handler.release = anyio.Event()  # never set
    with anyio.fail_after(30):
        async with killable(handler) as (server, kill), \
                client_of(server.address, deadline_s=0.01, answer_timeout_s=0.05) as client:
            with pytest.raises(ForwardUnknown) as slow:
                await client.append([AppendGroup(A, [b"x"])])
            late = slow.value.late
            assert late is not None
            assert await _waited_while(late, kill.cancel) is None


async def _waited_while(late: LateAnswer, act: Callable[[], None]
                        ) -> list[AppendOutcome] | None:
    """What a wait of an hour for ``late`` returns once ``act`` has run."""
    waited: list[list[AppendOutcome] | None] = []

    async def wait() -> None:
        waited.append(await late.outcomes(time.monotonic() + 3600))

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        act()
    return waited[0]


async def test_the_client_connects_again_after_the_peer_came_back() -> None:
    port = free_port()
    with anyio.fail_after(30):
        async with serving(FakeHandler(), port=port) as (server, _):
            address = server.address
            async with client_of(address) as client:
                (ok,) = await client.append([AppendGroup(A, [b"1"])])
                assert isinstance(ok, AppendResult)
                server.close()
                await anyio.wait_all_tasks_blocked()
        async with client_of(address) as again:
            with pytest.raises(ForwardNotWritten):
                await again.append([AppendGroup(A, [b"2"])])  # nobody listens
            async with serving(FakeHandler(), port=port):
                (ok,) = await again.append([AppendGroup(A, [b"3"])])
                assert isinstance(ok, AppendResult)


# -- through a real batcher and writer ----------------------------------------------------

class GatedLog:
    """The engine's writer behind a gate, to hold a flush slot busy."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()

    async def append(self, groups: Sequence[AppendGroup]) -> list[AppendOutcome]:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return await self.engine.writer.append_shared(groups)


@contextlib.asynccontextmanager
async def forwarding_to(engine: Engine, fences: ForwardFences | None = None,
                        received: anyio.Event | None = None, **client_options: Any
                        ) -> AsyncIterator[tuple[ForwardClient, Batcher, GatedLog]]:
    """A receiving broker's path: forward server → Batcher.enqueue → LogWriter; with
    ``fences``, a flush takes each frame's fence first, as the broker's does;
    ``received`` is set as a frame's groups are handed to the batcher."""
    log = GatedLog(engine)
    batcher = Batcher(log.append, max_bytes=1 << 20, max_delay_s=0.001,
                      buffer_max_bytes=1 << 24, max_inflight_flushes=1)

    async def handler(groups: list[AppendGroup], take_by: float, fence: Fence,
                      window_s: float) -> list[AppendOutcome]:
        # As the broker's: with a fence, a flush takes it first and commits the groups
        # only with a control version it read within the frame's window.
        if received is not None:
            received.set()
        if fences is None:
            return await batcher.enqueue(groups, take_by=take_by)
        return await batcher.enqueue(groups, take_by=take_by,
                                     claim=functools.partial(fences.take, fence),
                                     commit_within_s=window_s)

    async with anyio.create_task_group() as tg:
        await tg.start(batcher.run)
        async with serving(handler) as (server, _), \
                client_of(server.address, **client_options) as client:
            yield client, batcher, log
        batcher.close()


def _fences(engine: Engine) -> tuple[ForwardFences, CollectorRegistry]:
    registry = CollectorRegistry()
    return ForwardFences(engine.oxia, engine.layout, FenceMetrics(registry)), registry


def _fence_claims(registry: CollectorRegistry, side: str, outcome: str) -> float:
    return registry.get_sample_value("llog_forward_fences_total", {
        "member": "", "side": side, "outcome": outcome}) or 0.0


async def test_a_frame_abandoned_before_a_flush_took_it_is_never_written(
        engine: Engine, topic: str) -> None:
    """The frame waits in the receiver's buffer (its only flush slot is held) when its
    forwarder gives up on it and wins its fence (as one whose answer was lost would):
    the flush that later takes the frame writes nothing of it and answers it expired,
    so the forwarder's own append of the groups is their only copy."""
    local, forwarded = TopicPartition(topic, 0), TopicPartition(topic, 1)
    fences, registry = _fences(engine)
    sent_at = time.time_ns() // 1_000_000
    received = anyio.Event()
    with anyio.fail_after(60):
        async with forwarding_to(engine, fences, received, deadline_s=30.0,
                                 fence_prefix="fwd", clock_ms=lambda: sent_at
                                 ) as (client, batcher, log):
            log.gate = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(batcher.submit, [AppendGroup(local, [b"local"])])
                await log.entered.wait()  # the only flush slot is held
                answers: list[BaseException] = []

                async def forward() -> None:
                    with pytest.raises(ForwardNotWritten) as excinfo:
                        await client.append([AppendGroup(forwarded, [b"fenced"], "key-1")])
                    answers.append(excinfo.value)

                tg.start_soon(forward)
                await received.wait()  # buffered behind the held flush
                assert await fences.abandon(Fence(sent_at, "fwd.1")) == "abandoned"
                log.gate.set()
            # The flush after the held one took the frame and lost its fence; this
            # append's flush is that one or a later one.
            (after,) = await batcher.submit([AppendGroup(local, [b"after"])])
    assert isinstance(after, AppendResult)
    assert [getattr(a, "reason", None) for a in answers] == ["expired"]
    assert await engine.reader.high_watermark(forwarded) == 0
    assert _fence_claims(registry, "receiver", "abandoned") == 1
    assert _fence_claims(registry, "forwarder", "abandoned") == 1


async def test_a_frame_a_flush_took_commits_only_within_its_window_and_is_never_abandoned(
        engine: Engine, topic: str) -> None:
    """A flush took the frame (and its fence) and its write is held past the forwarder's
    wait: the forwarder's claim loses, so it must not append the groups (they are in
    doubt). The held flush, its commit window over by the time it is let go, commits
    none of them: once the forwarder has waited the window out, its answer in doubt is
    final, and a client's resend under the same keys cannot race a late first copy."""
    tp = TopicPartition(topic, 0)
    fences, registry = _fences(engine)
    # The receiver may read a version to commit with for 0.1 s after it began to claim
    # the frame: that is over long before the forwarder stops waiting.
    window = 0.1
    with anyio.fail_after(60):
        async with forwarding_to(engine, fences, deadline_s=1.0, answer_timeout_s=0.2,
                                 commit_window_s=window) as (client, batcher, log):
            log.gate = anyio.Event()
            async with anyio.create_task_group() as tg:
                errors: list[ForwardUnknown] = []
                unanswered = anyio.Event()

                async def forward() -> None:
                    with pytest.raises(ForwardUnknown) as excinfo:
                        await client.append([AppendGroup(tp, [b"slow"], "key-1")])
                    errors.append(excinfo.value)
                    unanswered.set()

                tg.start_soon(forward)
                await log.entered.wait()  # taken (fence and all) by a flush, held
                await unanswered.wait()  # the forwarder's 1.2 s wait runs out
                fence = errors[0].fence
                assert fence is not None
                assert await fences.abandon(fence) == "taken"
                log.gate.set()
            # The held flush is over once the next one, on the only slot, is.
            (after,) = await batcher.submit([AppendGroup(tp, [b"after"])])
    assert isinstance(after, AppendResult) and after.start_offset == 1
    assert (await engine.reader.read(tp, 1)).records == [(1, b"after")]
    # What the forwarder waits out once it finds the frame taken: the window it sent.
    assert errors[0].window_s == pytest.approx(window)
    assert _fence_claims(registry, "receiver", "taken") == 1
    assert _fence_claims(registry, "forwarder", "taken") == 1


async def test_a_frame_whose_window_leaves_no_time_to_commit_is_expired_unwritten(
        engine: Engine, topic: str) -> None:
    """A window over by the time the receiver's claim is won leaves it no time to read a
    version to commit with: the flush that takes the frame writes nothing of it and
    answers it expired, so the forwarder appends it itself."""
    tp = TopicPartition(topic, 0)
    fences, registry = _fences(engine)
    with anyio.fail_after(60):
        async with forwarding_to(engine, fences, commit_window_s=0) as (client, _, _):
            with pytest.raises(ForwardNotWritten) as excinfo:
                await client.append([AppendGroup(tp, [b"no time"], "key-1")])
    assert excinfo.value.reason == "expired"
    assert await engine.reader.high_watermark(tp) == 0
    assert _fence_claims(registry, "receiver", "taken") == 1


async def test_a_forwarded_append_commits_with_the_right_offsets(engine: Engine,
                                                                 topic: str) -> None:
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with anyio.fail_after(60):
        async with forwarding_to(engine) as (client, _, _):
            first = await client.append([
                AppendGroup(p0, RecordBatch.of([b"a", b"b", b"c"])),
                AppendGroup(p1, [LogRecord(b"v", key=b"k", headers=(("h", b"1"),))],
                            "key-1")])
            second = await client.append([AppendGroup(p0, [b"d"])])
            again = await client.append([AppendGroup(p1, [b"other"], "key-1")])
    a, b = first
    assert isinstance(a, AppendResult) and (a.start_offset, a.end_offset, a.count) == (1, 3, 3)
    assert isinstance(b, AppendResult) and (b.start_offset, b.end_offset) == (1, 1)
    assert a.wal_uri == b.wal_uri and a.append_time_ms > 0  # one flush, one blob
    (d,) = second
    assert isinstance(d, AppendResult) and (d.start_offset, d.end_offset) == (4, 4)
    (dup,) = again  # the key's first append answers: nothing written twice
    assert isinstance(dup, AppendResult) and dup.duplicate and dup.start_offset == 1
    read = await engine.reader.read(p0, 1)
    assert read.records == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert await engine.reader.high_watermark(p1) == 1


async def test_an_expired_forward_is_not_stored(engine: Engine, topic: str) -> None:
    """The receiver's only flush slot is busy past the forward's deadline: the forward
    is answered expired, never flushed, and the local append beside it commits."""
    local, forwarded = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with anyio.fail_after(60):
        async with forwarding_to(engine, deadline_s=0.001) as (client, batcher, log):
            log.gate = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(batcher.submit, [AppendGroup(local, [b"local"])])
                await log.entered.wait()  # the only flush slot is held
                with pytest.raises(ForwardNotWritten) as excinfo:
                    await client.append([AppendGroup(forwarded, [b"late"])])
                log.gate.set()
            assert excinfo.value.reason == "expired"
            # The receiver flushes again later: still nothing of the expired frame.
            (after,) = await batcher.submit([AppendGroup(local, [b"after"])])
    assert isinstance(after, AppendResult) and after.start_offset == 2
    assert await engine.reader.high_watermark(forwarded) == 0
    assert (await engine.reader.read(local, 1)).records == [(1, b"local"), (2, b"after")]


async def test_records_forwarded_inside_their_deadline_are_flushed_even_if_slow(
        engine: Engine, topic: str) -> None:
    """Once a flush took them (and their fence), their deadline no longer applies: the
    flush, held a while, commits them within their window, and the answer says so."""
    tp = TopicPartition(topic, 0)
    fences, _ = _fences(engine)
    with anyio.fail_after(60):
        async with forwarding_to(engine, fences, deadline_s=5.0) as (client, _, log):
            log.gate = anyio.Event()
            answers: list[list[AppendOutcome]] = []
            async with anyio.create_task_group() as tg:
                async def forward() -> None:
                    answers.append(await client.append([AppendGroup(tp, [b"slow"])]))

                tg.start_soon(forward)
                await log.entered.wait()  # taken by a flush, which is held
                log.gate.set()
    (outcome,) = answers[0]
    assert isinstance(outcome, AppendResult) and outcome.start_offset == 1
    assert (await engine.reader.read(tp, 1)).records == [(1, b"slow")]

