"""Every order of the events that decide whether a long-poll can be left waiting on a
record already committed: a seeded sample of the orders in every run, all of them
(explored exhaustively) in the long form (``scripts/test --all -m long``).

The events: two long-poll looks of one partition on this broker, a commit by another
broker and its change notification (which may come any time after the commit, even while
this broker's own write is in flight), a commit by this broker (it lands in Oxia, then is
acknowledged: the tail cache gets its records and waiters are woken), and, in one of the
two scenarios, a lookup made ahead of a catch-up read (app/storage/plan_ahead.py).

The code under test is the real one: ``ConsumeService`` (the watch's clock, the tail
cache, misses read, high watermarks noted, partitions marked fresh), ``LogReader``'s
planning (a lookup made ahead taken, or one made now; its answer assembled),
``PlanAhead``, ``PartitionWatch``, ``OwnWrites`` and ``OxiaChangeListener``'s delivery,
and a ``MemoryTailCache``. Only storage is a model: a log of records and a control record
with a version, whose reads park at *gates*. Read-ahead is not among the events: it
fetches chunks of compacted objects, which never change, and decides no high watermark.
Nor is the notification of this broker's own commit: at worst it is reported late as
someone else's, and a reported change only ever makes a partition stale, never fresh.

Each actor is a coroutine driven by hand: it runs until it parks at a gate (an Oxia or
S3 round trip, during which anything else may happen), waits for an event set by another
(a lookup under way), or ends. A schedule picks which parked actor goes next; a depth-first
search over those choices replays every schedule from the start, so every order of the
steps (respecting what must come first: a notification after its commit) is run once.
The sample picks uniformly among the parked actors at each step from a fixed seed.

After all events, a long-poll at the one offset the cache could answer "nothing yet" for
(its high watermark + 1) must get the record there when it is committed: otherwise that
long-poll waits for a write that may never come.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from app.broker import consume
from app.broker.answer_budget import AnswerBudget
from app.broker.consume import ConsumeService, Fetch
from app.broker.metrics import ConsumeMetrics
from app.broker.watch import OxiaChangeListener, PartitionWatch
from app.errors import LlogError
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control, IndexEntry
from app.storage.own_writes import OwnWrites
from app.storage.plan_ahead import PlanAhead
from app.storage.read_plan import ReadPlan, SpanFetch, min_budget, trim_to_total
from app.storage.reader import LogReader, ReadOutcome, ReadRequest, ReadResult
from app.storage.spans import Span
from app.tailcache import MemoryTailCache

pytestmark = pytest.mark.slow
# Orders run by the sampled form: a few seconds, where every order (tens of thousands of
# them) takes most of a minute.
SAMPLE = 3000
SEED = 20261205

TP = TopicPartition("t", 0)
BIG = 1 << 20
LAYOUT = KeyLayout("llog", "bucket")
METRICS = ConsumeMetrics(CollectorRegistry())  # counters only: shared by every run


class Gate:
    """Where an actor parks: a round trip to storage, during which others may run."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __await__(self) -> Generator[Gate, None, None]:
        yield self


class ModelLog:
    """The partition as Oxia and S3 hold it: committed records and the control record's
    high watermark and version (one version per commit)."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.version = 0

    def commit(self, value: bytes) -> tuple[int, int]:
        offset = len(self.records) + 1
        self.records[offset] = value
        self.version += 1
        return offset, self.version

    @property
    def high_watermark(self) -> int:
        return len(self.records)


class ModelReader(LogReader):
    """The real reader's planning and assembly over :class:`ModelLog`: the control record
    is read at a gate, and so are the records (the S3 fetch). Partitions are planned one
    after the other rather than in a task group, so that the search drives them."""

    def __init__(self, log: ModelLog, group: _Group) -> None:
        super().__init__(None, None, LAYOUT, read_ahead=4)  # type: ignore[arg-type]
        self.log = log
        self.plans = PlanAhead(4, clock=lambda: 0.0)  # every lookup is recent
        self.run_ahead_in(group)  # type: ignore[arg-type]

    async def _plan_all(self, requests: Sequence[ReadRequest], max_bytes: int | None,
                        skip_strays: bool) -> list[ReadPlan | LlogError]:
        plans: list[ReadPlan | LlogError] = []
        for request in requests:
            try:
                plans.append(await self._plan(request, min_budget(request.max_bytes, max_bytes),
                                              skip_strays))
            except LlogError as exc:
                plans.append(exc)
        trim_to_total(plans, max_bytes)
        return plans

    async def _look_up(self, tp: TopicPartition, offset: int) -> Any:
        await Gate("reads the control record")
        return Control(sequence_counter=self.log.high_watermark), []

    async def _resolve(self, tp: TopicPartition, offset: int, control: Control,
                       budget: int | None, max_records: int | None, stray_floor: int,
                       first_page: Any = None, room: Any = None) -> list[Span]:
        # Index entries up to the control record's high watermark never change: when
        # they are read does not matter.
        return [Span(o, IndexEntry("WAL", 1, f"s3://b/{o}", byte_offset=0,
                                   byte_length=len(self.log.records[o])))
                for o in range(offset, control.sequence_counter + 1)]

    async def _fetch(self, units: list[SpanFetch]) -> None:
        await Gate("fetches the records")
        for unit in units:
            unit.records = [self.log.records[unit.span.end]]


class _Group:
    """Stands in for the task group plan-ahead runs its lookups in: each is an actor."""

    def __init__(self, spawn: Callable[[str, Coroutine[Any, Any, None]], None]) -> None:
        self._spawn = spawn
        self.started = 0

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
        self.started += 1
        self._spawn(f"lookup{self.started}", fn(*args))


class Schedule:
    """Actors driven by hand; ``choose`` picks among the parked ones at each step."""

    def __init__(self, choose: Callable[[list[str]], str]) -> None:
        self._choose = choose
        self._actors: dict[str, Coroutine[Any, Any, None]] = {}
        self._parked: dict[str, Gate] = {}
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._new: list[str] = []
        self.trace: list[str] = []

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        assert name not in self._actors
        self._actors[name] = coro
        self._new.append(name)  # runs once the current step is over, as a task would

    def _advance(self, name: str) -> None:
        """Run ``name`` until it parks at a gate, waits for an event, or ends."""
        coro = self._actors[name]
        while True:
            try:
                yielded = coro.send(None)
            except StopIteration:
                del self._actors[name]
                return
            if isinstance(yielded, Gate):
                self._parked[name] = yielded
                return
            if isinstance(yielded, asyncio.Future):
                if not yielded.done():
                    self._waiting[name] = yielded
                    return
            else:
                assert yielded is None, yielded  # a checkpoint: nobody else is running

    def _settle(self) -> None:
        """Start the actors spawned meanwhile, and resume those whose event was set."""
        progress = True
        while progress:
            progress = False
            while self._new:
                self._advance(self._new.pop(0))
                progress = True
            for name, future in list(self._waiting.items()):
                if future.done():
                    del self._waiting[name]
                    self._advance(name)
                    progress = True

    def finish(self, name: str) -> None:
        """Run only ``name``, to its end (the others stay where they are)."""
        self._settle()
        while name in self._actors:
            assert name in self._parked, f"{name} waits on another actor"
            del self._parked[name]
            self._advance(name)
            self._settle()

    def run(self) -> None:
        self._settle()
        while self._parked:
            name = self._choose(sorted(self._parked))
            gate = self._parked.pop(name)
            self.trace.append(f"{name}: {gate.what}")
            self._advance(name)
            self._settle()
        assert not self._actors, f"stuck: {sorted(self._actors)} (waiting on nothing)"


class Broker:
    """One broker's wake-up path over the model log, and the events of one scenario."""

    def __init__(self, schedule: Schedule, log: ModelLog) -> None:
        self.schedule = schedule
        self.log = log
        self.watch = PartitionWatch()
        self.cache = MemoryTailCache(BIG, store_id="test")
        self.own = OwnWrites(16, on_foreign=self.watch.notify_remote)
        self.listener = OxiaChangeListener(None, LAYOUT, self.watch,
                                           self.own.claims)
        self.reader = ModelReader(log, _Group(schedule.spawn))
        self.service = ConsumeService(self.reader, self.cache, self.watch,
                                      METRICS, answers=AnswerBudget(1 << 30, max_wait_s=1),
                                      max_long_polls=4)
        self.answers: dict[str, ReadOutcome] = {}

    async def look(self, name: str, offset: int, max_bytes: int = BIG) -> None:
        await Gate("starts")  # captures the watch's clock, asks the cache, reads on a miss
        (self.answers[name],) = await self.service.consume(
            [Fetch(TP, offset)], max_wait_s=0, min_bytes=1, max_bytes=max_bytes)

    async def remote_commit(self, value: bytes) -> None:
        await Gate("commits")
        _, version = self.log.commit(value)
        self.schedule.spawn("remote-notice", self.remote_notice(version))

    async def remote_notice(self, version: int) -> None:
        await Gate("is delivered")
        self.listener._deliver(TP, version)

    async def own_commit(self, value: bytes) -> None:
        await Gate("commits")
        with self.own.writing(TP):
            offset, version = self.log.commit(value)
            await Gate("is acknowledged")  # the answer of Oxia's write comes back
            self.own.wrote(TP, version)
        self.cache.put(TP, offset, [value])  # the batcher's on_committed
        self.watch.notify(TP)


def run_scenario(choose: Callable[[list[str]], str], *, ahead: bool) -> list[str]:
    """Set up, run the events in the order ``choose`` picks, and check the invariant;
    the order the steps ran in."""
    schedule = Schedule(choose)
    log = ModelLog()
    broker = Broker(schedule, log)
    for value in (b"r1", b"r2"):
        log.commit(value)
    # Before the events: a consumer on this broker read record 1, one record per
    # answer (a lookup of offset 2 is then made ahead, and left parked before its
    # read of the control record) or all of them (none is).
    schedule.spawn("setup", broker.look("setup", 1, max_bytes=1 if ahead else BIG))
    schedule.finish("setup")
    assert broker.reader.plans.statistics().kept == (1 if ahead else 0)
    # ... then another broker committed record 3, and this one heard of it.
    _, version = log.commit(b"r3")
    broker.listener._deliver(TP, version)
    assert broker.watch.is_stale(TP)

    # Two long-polls: the consumer of record 1, now at offset 2, and another one. With
    # a lookup made ahead the other one starts at offset 1 (at offset 2, whichever read
    # started first would take the lookup, and a read that began before a change never
    # marks it seen anyway); without, both are at offset 2.
    offsets = {"read1": 2, "read2": 1 if ahead else 2}
    for name, offset in offsets.items():
        schedule.spawn(name, broker.look(name, offset))
    schedule.spawn("remote", broker.remote_commit(b"remote"))
    schedule.spawn("own", broker.own_commit(b"own"))
    schedule.run()

    for name, offset in offsets.items():
        answer = broker.answers[name]
        assert isinstance(answer, ReadResult), answer
        assert list(answer.records) == [
            (o, log.records[o]) for o in range(offset, answer.next_offset)]
    # The invariant: a long-poll now is not told "nothing yet" about a committed record.
    last = log.high_watermark
    at = (broker.cache.high_watermark(TP) or 0) + 1
    if at <= last:
        schedule.spawn("final", broker.look("final", at))
        schedule.finish("final")
        answer = broker.answers["final"]
        assert isinstance(answer, ReadResult) and answer.records, (
            f"a long-poll at offset {at} is told nothing is there, though records up to "
            f"{last} are committed and no notice is to come; the order was:\n  "
            + "\n  ".join(schedule.trace))
    return schedule.trace


class _Replay:
    """Chooses as ``prefix`` says, then the first name; remembers each choice made and
    how many there were to choose from."""

    def __init__(self, prefix: list[int]) -> None:
        self.prefix = prefix
        self.made: list[tuple[int, int]] = []

    def __call__(self, names: list[str]) -> str:
        at = len(self.made)
        i = self.prefix[at] if at < len(self.prefix) else 0
        self.made.append((i, len(names)))
        return names[i]

    def next_prefix(self) -> list[int] | None:
        """The choices of the next schedule in depth-first order; None after the last."""
        made = list(self.made)
        while made and made[-1][0] + 1 >= made[-1][1]:
            made.pop()
        if not made:
            return None
        return [i for i, _ in made[:-1]] + [made[-1][0] + 1]


def explore(*, ahead: bool) -> int:
    """Run every schedule (depth-first over the choices, replaying each from the start);
    how many were run."""
    prefix: list[int] | None = []
    traces: set[tuple[str, ...]] = set()
    while prefix is not None:
        replay = _Replay(prefix)
        traces.add(tuple(run_scenario(replay, ahead=ahead)))
        prefix = replay.next_prefix()
    return len(traces)


def sample(*, ahead: bool, runs: int = SAMPLE, seed: int = SEED) -> int:
    """Run ``runs`` schedules chosen at random from ``seed``; how many differed."""
    rng = random.Random(seed)
    traces = {tuple(run_scenario(rng.choice, ahead=ahead)) for _ in range(runs)}
    return len(traces)


# Async only for the running event loop anyio's events need; the search itself never
# gives the loop a turn.

async def test_a_lookup_made_ahead_never_hides_a_commit_heard_of_before_the_read() -> None:
    """One of the reads takes the lookup made ahead of it, whenever that was read."""
    orders = sample(ahead=True)
    print(f"{orders} orders sampled")
    assert orders > SAMPLE // 2  # the sample is of different orders, not one many times


async def test_two_reads_in_flight_never_mark_a_newer_change_seen() -> None:
    """Both reads read the control record themselves (nothing was looked up ahead)."""
    orders = sample(ahead=False)
    print(f"{orders} orders sampled")
    assert orders > SAMPLE // 2


@pytest.mark.long
@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "not-ahead"])
async def test_every_order_keeps_a_committed_record_visible(ahead: bool) -> None:
    orders = explore(ahead=ahead)
    print(f"{orders} orders explored")
    assert orders > 10_000


async def test_a_partition_turns_fresh_only_once_the_cache_knows_what_was_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The file tail cache notes a high watermark in a worker thread: a look made
    meanwhile must not find the partition fresh and the cache still behind."""

    async def noted_in_a_thread(cache: Any, fn: Callable[..., Any], *args: Any) -> Any:
        if fn is consume._note_all:
            await Gate("notes the high watermark")
        return fn(*args)

    monkeypatch.setattr(consume, "run_cache_write", noted_in_a_thread)
    # The read goes up to its noting the high watermark; then the long-poll looks.
    schedule = Schedule(lambda names: "read" if len(schedule.trace) < 3 or
                        "poll" not in names else "poll")
    log = ModelLog()
    broker = Broker(schedule, log)
    log.commit(b"r1")
    log.commit(b"r2")
    schedule.spawn("setup", broker.look("setup", 1))
    schedule.finish("setup")  # the cache knows records up to 2, and the log is fresh
    _, version = log.commit(b"r3")
    broker.listener._deliver(TP, version)  # another broker committed record 3
    schedule.spawn("read", broker.look("read", 3))  # reads record 3, then notes it
    schedule.spawn("poll", broker.look("poll", 3))  # a long-poll's look meanwhile
    schedule.run()
    assert schedule.trace[:4] == ["read: starts", "read: reads the control record",
                                  "read: fetches the records", "poll: starts"]
    answer = broker.answers["poll"]
    assert isinstance(answer, ReadResult)
    assert list(answer.records) == [(3, b"r3")]
