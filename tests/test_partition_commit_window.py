"""A commit's deadlines, against the real Oxia and MinIO: forwarded groups past their
commit window (``AppendGroup.commit_by``) are never committed with a control version
read after it, the groups beside them are, uploaded again without them (repeats of the
late groups' keys too), as often as windows end; each commit request carries the
earliest of its deadlines (the window, the blob's commit horizon) to where it is sent,
which refuses it past that; and an unanswered commit is sent again as it was, windows
over or not, while the version it expects is current.

Where a fault must outlast a window, it waits for the clock to pass that window's end
(:func:`_past`): the deadline is the event."""

from __future__ import annotations

import dataclasses
import time

import anyio
import pytest

from app.errors import ForwardExpired, StorageUnavailable
from app.storage.appends import AppendGroup, AppendResult
from app.storage.keys import TopicPartition
from app.storage.writer import MAX_UPLOAD_ROUNDS
from app.stores.oxia.store import PutSpec
from tests.helpers.stack import Engine

# Windows far enough ahead that a loaded machine still reaches the upload or the commit
# inside them (a group already late is answered without being uploaded).
AHEAD_S = 1.5

async def _past(deadline: float) -> None:
    """Until ``time.monotonic()`` has passed ``deadline`` (the event loop's timers may
    fire a hair early: a hundredth of a second on top)."""
    await anyio.sleep(max(0.0, deadline - time.monotonic()) + 0.01)


def _forwarded(tp: TopicPartition, records: list[bytes], key: str | None = None, *,
               commit_by: float) -> AppendGroup:
    """A group another broker forwarded, due by the end of its commit window."""
    return AppendGroup(tp, records, key, commit_by=commit_by, expired_as=ForwardExpired)


def _is_commit(puts: list[PutSpec]) -> bool:
    """Whether a group of puts commits an append (its last, a control compare-and-set)."""
    last = puts[-1]
    return (last.key.endswith("/meta/control") and last.expected_version is not None
            and last.expected_version >= 0)


def _commit_puts(e: Engine, change=None):  # type: ignore[no-untyped-def]
    """Record the control compare-and-sets the writer sends (``change`` may alter
    one before it goes to the real store)."""
    real, seen = e.oxia.put_group, []

    async def put_group(puts: list[PutSpec]) -> list[int | Exception]:
        if _is_commit(puts):
            seen.append(puts[-1])
            if change is not None:
                puts = change(puts)
        return await real(puts)

    e.oxia.put_group = put_group  # type: ignore[method-assign]
    return seen


async def test_a_forwarded_group_past_its_window_is_never_committed_its_neighbours_are(
        engine: Engine, topic: str) -> None:
    """The late forwarded group is answered ForwardExpired, and never uploaded: this
    broker's own group of the same partition and another partition's forwarded group,
    in its window, commit from the one blob, without it."""
    late, other = TopicPartition(topic, 0), TopicPartition(topic, 1)
    outcomes = await engine.writer.append_shared([
        _forwarded(late, [b"forwarded"], "key-f", commit_by=time.monotonic() - 1),
        AppendGroup(late, [b"local"], "key-l"),
        _forwarded(other, [b"in time"], commit_by=time.monotonic() + 3600)])
    expired, local, in_time = outcomes
    assert isinstance(expired, ForwardExpired) and not expired.maybe_written
    assert isinstance(local, AppendResult) and local.start_offset == 1
    assert isinstance(in_time, AppendResult) and in_time.start_offset == 1
    assert local.wal_uri == in_time.wal_uri  # one upload, without the late group
    assert (await engine.reader.read(late, 1)).records == [(1, b"local")]
    assert (await engine.reader.read(other, 1)).records == [(1, b"in time")]
    # Its key was never committed: sent again, it is appended, not answered duplicate.
    (again,) = await engine.writer.append_shared([AppendGroup(late, [b"again"], "key-f")])
    assert isinstance(again, AppendResult) and not again.duplicate and again.start_offset == 2


async def test_each_commit_request_carries_the_earliest_of_its_deadlines(
        engine: Engine, topic: str) -> None:
    """A partition with a forwarded group: its window, when that ends before the blob's
    commit horizon; a partition of this broker's own groups: the horizon."""
    forwarded, own = TopicPartition(topic, 0), TopicPartition(topic, 1)
    seen = _commit_puts(engine)
    before = time.monotonic()
    commit_by = before + 600  # the default horizon is 1800 s
    outcomes = await engine.writer.append_shared([
        _forwarded(forwarded, [b"f"], commit_by=commit_by), AppendGroup(own, [b"o"])])
    after = time.monotonic()
    assert all(isinstance(o, AppendResult) for o in outcomes)
    by_partition = {p.partition_key: p.send_by for p in seen}
    assert by_partition[forwarded.partition_key] == commit_by
    horizon = by_partition[own.partition_key]
    assert horizon is not None and before + 1700 < horizon <= after + 1800


async def test_a_commit_request_not_sent_in_time_is_tried_again_never_in_doubt(
        engine: Engine, tp: TopicPartition) -> None:
    """A request refused where it is sent was never sent: the commit tries again (it
    is not in doubt) and commits once."""
    def due_now(puts: list[PutSpec]) -> list[PutSpec]:
        if len(seen) > 1:
            return puts
        return [dataclasses.replace(p, send_by=time.monotonic()) for p in puts]

    seen = _commit_puts(engine, due_now)
    (result,) = await engine.writer.append_shared([AppendGroup(tp, [b"once"])])
    assert isinstance(result, AppendResult) and result.start_offset == 1
    assert len(seen) == 2
    assert (await engine.reader.read(tp, 1)).records == [(1, b"once")]
    assert engine.metrics.registry.get_sample_value(
        "llog_cas_retries_total", {"op": "commit", "reason": "not_sent"}) == 1


async def test_a_repeat_of_a_late_forwarded_groups_key_is_committed_in_its_place(
        engine: Engine, tp: TopicPartition) -> None:
    """A client's resend, sent straight to this broker, shares a flush with its first
    copy, forwarded and past its window: the first copy is answered ForwardExpired,
    unwritten, which answers nothing of the resend: the resend is uploaded again in its
    place and committed, and a later repeat of the key in the flush is its duplicate."""
    first_copy, resend, again = await engine.writer.append_shared([
        _forwarded(tp, [b"first copy"], "key-1", commit_by=time.monotonic() - 1),
        AppendGroup(tp, [b"resend"], "key-1"),
        AppendGroup(tp, [b"resend, again"], "key-1")])
    assert isinstance(first_copy, ForwardExpired)
    assert isinstance(resend, AppendResult) and not resend.duplicate
    assert resend.start_offset == 1
    assert isinstance(again, AppendResult) and again.duplicate and again.start_offset == 1
    assert (await engine.reader.read(tp, 1)).records == [(1, b"resend")]


async def test_windows_that_end_upload_after_upload_do_not_use_up_the_rounds(
        engine: Engine, tp: TopicPartition) -> None:
    """Forwarders with different windows share a flush, and the object store is slow:
    each upload outlasts one more window, so each commit finds one more forwarded group
    late. Those uploads are not counted against the writer's limit (each answers a
    group), so this broker's own group is committed after more uploads than the limit."""
    now = time.monotonic()
    windows = [now + AHEAD_S * (i + 1) for i in range(MAX_UPLOAD_ROUNDS + 1)]
    real, uploads = engine.s3.put, []

    async def slow_put(key: str, body: bytes) -> None:
        if len(uploads) < len(windows):
            await _past(windows[len(uploads)])  # this upload outlasts one more window
        uploads.append(key)
        await real(key, body)

    engine.s3.put = slow_put  # type: ignore[method-assign]
    outcomes = await engine.writer.append_shared(
        [_forwarded(tp, [b"forwarded"], commit_by=w) for w in windows]
        + [AppendGroup(tp, [b"local"])])
    assert all(isinstance(o, ForwardExpired) for o in outcomes[:-1]), outcomes
    local = outcomes[-1]
    assert isinstance(local, AppendResult) and local.start_offset == 1
    assert (await engine.reader.read(tp, 1)).records == [(1, b"local")]


@pytest.mark.parametrize("landed", [False, True], ids=["not_landed", "landed"])
async def test_an_unanswered_commit_is_settled_though_a_forwarded_groups_window_ended(
        engine: Engine, tp: TopicPartition, landed: bool) -> None:
    """The first commit of a partition holding this broker's group and a forwarded one
    goes unanswered until the forwarded group's window has ended; it never reached Oxia,
    or it landed. Neither leaves a group in doubt: with the version it expected still
    current, the very same compare-and-set (that version, read in time) is sent again,
    past the window, and commits both once; landed, the next attempt finds it."""
    commit_by = time.monotonic() + AHEAD_S
    real, sent = engine.oxia.put_group, []

    async def first_unanswered(puts: list[PutSpec]) -> list[int | Exception]:
        if not _is_commit(puts):
            return await real(puts)
        sent.append(puts[-1])
        if len(sent) > 1:
            return await real(puts)
        if landed:
            await real(puts)
        await _past(commit_by)  # no answer until the window has ended
        return [StorageUnavailable("DEADLINE_EXCEEDED (the answer was lost)")] * len(puts)

    engine.oxia.put_group = first_unanswered  # type: ignore[method-assign]
    local, forwarded = await engine.writer.append_shared([
        AppendGroup(tp, [b"local"]), _forwarded(tp, [b"forwarded"], commit_by=commit_by)])
    assert isinstance(local, AppendResult) and local.start_offset == 1
    assert isinstance(forwarded, AppendResult) and forwarded.start_offset == 2
    assert (await engine.reader.read(tp, 1)).records == [(1, b"local"), (2, b"forwarded")]
    assert sent[0].send_by == commit_by
    if landed:
        assert len(sent) == 1  # found committed, not sent again
    else:
        first, again = sent
        assert (again.key, again.value) == (first.key, first.value)
        assert again.expected_version == first.expected_version
        assert again.send_by is not None and again.send_by > commit_by  # the horizon


async def test_an_echo_is_committed_within_its_own_window_not_only_its_originals(
        engine: Engine, tp: TopicPartition) -> None:
    """A repeat of an earlier group's key in the flush (an echo) is answered by that
    group's commit, so that commit keeps the echo's window too: the request carries
    the earlier of the two as its ``send_by``."""
    seen = _commit_puts(engine)
    now = time.monotonic()
    original, echo = await engine.writer.append_shared([
        _forwarded(tp, [b"copy 1"], "key-e", commit_by=now + 3600),
        _forwarded(tp, [b"copy 2"], "key-e", commit_by=now + 600)])
    assert isinstance(original, AppendResult) and not original.duplicate
    assert isinstance(echo, AppendResult) and echo.duplicate
    assert [p.send_by for p in seen] == [now + 600]


async def test_an_echo_whose_window_ends_before_the_commit_is_answered_on_its_own(
        engine: Engine, tp: TopicPartition) -> None:
    """The upload outlasts an echo's window, not its original's: the echo is answered
    ForwardExpired, unwritten, and no longer rides the original, which commits from the
    same upload within its own window; the key is in the log once."""
    now = time.monotonic()
    echo_by = now + AHEAD_S
    real, uploads = engine.s3.put, []

    async def slow_put(key: str, body: bytes) -> None:
        uploads.append(key)
        await _past(echo_by)
        await real(key, body)

    engine.s3.put = slow_put  # type: ignore[method-assign]
    seen = _commit_puts(engine)
    original, echo = await engine.writer.append_shared([
        _forwarded(tp, [b"copy 1"], "key-e", commit_by=now + 600),
        _forwarded(tp, [b"copy 2"], "key-e", commit_by=echo_by)])
    assert isinstance(echo, ForwardExpired) and not echo.maybe_written
    assert isinstance(original, AppendResult) and original.start_offset == 1
    assert len(uploads) == 1 and [p.send_by for p in seen] == [now + 600]
    assert (await engine.reader.read(tp, 1)).records == [(1, b"copy 1")]
