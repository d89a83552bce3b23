"""ReadAhead (app/storage/read_ahead.py): bounded background fetches that never fail a
read. Pure logic: the fetches are coroutines of the test."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from app.errors import StorageUnavailable
from app.storage.read_ahead import ReadAhead


async def test_without_a_task_group_nothing_is_read_ahead() -> None:
    ahead = ReadAhead(4)
    assert not ahead.start("k", _never)
    await ahead.wait("k")  # nothing under way: returns at once
    assert ahead.statistics().started == 0


async def _never() -> None:
    raise AssertionError("not to be run")


async def test_one_read_ahead_per_blob_and_at_most_max_inflight() -> None:
    ahead = ReadAhead(2)
    release = anyio.Event()
    ran: list[str] = []

    def fetch(key: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await release.wait()
            ran.append(key)
        return run

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            ahead.run_in(tg)
            assert ahead.start("a", fetch("a"))
            assert not ahead.start("a", fetch("a"))  # that blob is under way
            assert ahead.start("b", fetch("b"))
            assert not ahead.start("c", fetch("c"))  # two at once at most
            assert ahead.statistics().inflight == 2
            release.set()
            await ahead.wait("a")
            await ahead.wait("b")
            assert ahead.start("c", fetch("c"))  # room again
            await ahead.wait("c")
    assert sorted(ran) == ["a", "b", "c"]
    stats = ahead.statistics()
    assert (stats.inflight, stats.started, stats.failed) == (0, 3, 0)


async def test_a_failed_read_ahead_is_counted_and_its_waiters_released() -> None:
    ahead = ReadAhead(1)

    async def failing() -> None:
        raise StorageUnavailable("S3 GET failed")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:  # survives the failure
            ahead.run_in(tg)
            assert ahead.start("a", failing)
            await ahead.wait("a")
            done = anyio.Event()

            async def fine() -> None:
                done.set()

            assert ahead.start("a", fine)  # the blob may be read ahead again
            await done.wait()
    stats = ahead.statistics()
    assert (stats.inflight, stats.started, stats.failed) == (0, 2, 1)


async def test_a_read_ahead_starts_only_if_its_bytes_are_admitted_and_gives_them_back(
) -> None:
    held: list[int] = []
    room = [100]

    def admit(n: int) -> Callable[[], None] | None:
        if n > room[0]:
            return None
        room[0] -= n
        held.append(n)

        def give_back() -> None:
            room[0] += n
            held.remove(n)
        return give_back

    ahead = ReadAhead(4, admit)
    release = anyio.Event()

    async def fetch() -> None:
        await release.wait()

    async def failing() -> None:
        raise StorageUnavailable("S3 GET failed")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            ahead.run_in(tg)
            assert ahead.start("a", fetch, 60)
            assert not ahead.start("b", _never, 50)  # no room for it now: not started
            assert held == [60]
            assert ahead.start("c", failing, 40)  # a failed one gives its bytes back too
            await ahead.wait("c")
            assert held == [60]
            release.set()
            await ahead.wait("a")
    assert held == [] and room == [100]
    stats = ahead.statistics()
    assert (stats.started, stats.failed, stats.declined) == (2, 1, 1)
