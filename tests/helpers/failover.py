"""Steady produce and consume load through brokers while a server fails, and the checks
that nothing acknowledged was lost.

Producers behave as a careful client does: every entry carries an idempotency key; an
entry the broker may have written (``maybe_written``, or no answer at all) is sent again
with the same key; an entry the broker says it did not write (retriable, not
``maybe_written``) is sent again with a *new* key. So a broker that wrongly says
"nothing was written" leaves a second copy in the log, which :meth:`FailoverLoad.verify`
reports. A key keeps a resend single only while it is among its partition's 64 most
recent (docs/protocol.md, Idempotent appends): a load whose resends may come seconds
later, after more appends than that (a forward in doubt until a dead broker's fence is
settled), sends producer sequences instead (``sequenced``): each producer's entry for a
partition names the producer and its place in the producer's sequence, which the
partition remembers however many appends come between, while fewer than 64 other
producers commit there. The same rules, by construction: resent under the same
sequence; told "not written", under a new producer id from sequence 0. Without keys
(``keyed=False``) an entry that may have been written is given up instead
(``in_doubt``: it may be stored, once). A request may carry entries for several
partitions (``entries_per_request``); each entry is judged on its own result.
Consumers long-poll every partition through every broker from offset 1 and check each
offset follows the previous one. :func:`outage_problems` judges whether
acknowledgements kept coming all through a server's outage.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import httpx

from app.localstack.stack import LocalStack
from app.settings import Settings
from app.storage.keys import TopicPartition
from tests.helpers.bodies import consume_body
from tests.helpers.stack import make_settings, open_engine

RETRY_PAUSE_S = 0.05


@dataclass
class Produce:
    """One entry, from its first send to its acknowledgement."""

    producer: str
    started: float
    acked: float = 0.0
    attempts: int = 0
    partition: int = -1


@dataclass(frozen=True)
class Failure:
    """One produce attempt that was not acknowledged: when it was sent, and what came
    back (``maybe_written``: no answer, an in-doubt one, or a proxy's 5xx)."""

    producer: str
    sent: float
    error: str
    maybe_written: bool


@dataclass
class Figures:
    """Produce latency around a failure at ``failed_at`` (monotonic seconds)."""

    first_ack_after_s: float
    window_s: float
    during: list[float]
    before: list[float]
    errors: dict[str, int]

    @staticmethod
    def _p(values: list[float], q: float) -> float:
        if not values:
            return 0.0
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> dict[str, Any]:
        ms = 1000
        return {
            "first_ack_after_failure_ms": round(self.first_ack_after_s * ms),
            "window_s": self.window_s,
            "produces_in_window": len(self.during),
            "p50_ms_before": round(self._p(self.before, 0.5) * ms, 1),
            "p99_ms_before": round(self._p(self.before, 0.99) * ms, 1),
            "p50_ms_during": round(self._p(self.during, 0.5) * ms, 1),
            "p99_ms_during": round(self._p(self.during, 0.99) * ms, 1),
            "max_ms_during": round(max(self.during, default=0.0) * ms, 1),
            "failed_attempts": self.errors,
        }


def late_from(acked: Iterable[float], failed_at: float, session_s: float) -> float | None:
    """Where the late part of an outage begins: two session timeouts after the lost
    server's partitions were first acknowledged again (None while they are not).

    Not a fixed time after the failure: how long the election takes is the machine's
    business (more than 10 s was seen on a loaded one). A session a broker held with
    the lost server's shards either survived the new leader or expired at most one
    session timeout after it took over, so by this point the brokers have met its end."""
    first = min((t for t in acked if t >= failed_at), default=None)
    return None if first is None else first + 2 * session_s


def outage_problems(acked: Iterable[float], *, failed_at: float, restored_at: float,
                    session_s: float, late_least: int) -> list[str]:
    """What went wrong while a server was down from ``failed_at`` until ``restored_at``,
    given when its partitions' entries were ``acked``: none acknowledged at all while it
    was down (early), or fewer than ``late_least`` from :func:`late_from` until it was
    back (late: acknowledgements stopped part way, e.g. when sessions expired). Counts,
    not latencies: how soon is a figure for bench/."""
    acked = sorted(acked)
    down_s = restored_at - failed_at
    during = [t for t in acked if failed_at <= t < restored_at]
    if not during:
        return [f"no entry of the lost server's partitions was acknowledged in the "
                f"{down_s:.1f} s it was down: acknowledgements never resumed while it "
                f"was down"]
    late = during[0] + 2 * session_s
    early_n = sum(1 for t in during if t < late)
    late_n = sum(1 for t in during if t >= late)
    if late_n >= late_least:
        return []
    return [f"acknowledgements stopped during the outage: the lost server's partitions "
            f"had {early_n} acknowledged from the failure until +{late - failed_at:.1f} s "
            f"(first at +{during[0] - failed_at:.1f} s, then two {session_s:g} s session "
            f"timeouts), then {late_n} (at least {late_least} wanted) in the "
            f"{max(0.0, restored_at - late):.1f} s until it was back at "
            f"+{down_s:.1f} s; the last at +{during[-1] - failed_at:.1f} s"]


@dataclass
class FailoverLoad:
    urls: list[str]
    topic: str
    partitions: int
    producers_per_broker: int = 2
    pause_s: float = 0.01
    # False: entries carry no idempotency key, so one that may have been written is
    # given up (``in_doubt``), never sent again.
    keyed: bool = True
    # With ``keyed``: each entry carries its producer's sequence (``producer_id``,
    # ``sequence``) rather than an idempotency key (see the module).
    sequenced: bool = False
    # Entries (each of another partition) in one produce request.
    entries_per_request: int = 1
    # The brokers' LLOG_ROOT_PREFIX when not the stack's own.
    root_prefix: str | None = None
    acked: dict[tuple[int, int], str] = field(default_factory=dict)
    produces: list[Produce] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    # (broker index, partition) -> offset -> value, as each consumer saw them.
    consumed: dict[tuple[int, int], dict[int, str]] = field(default_factory=dict)
    consume_errors: Counter[str] = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    in_doubt: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._stopping = anyio.Event()
        self._progress = anyio.Event()
        self._final: dict[int, int] | None = None
        self._drained = anyio.Event()
        self._running_consumers = 0
        self._rng = random.Random(7)
        # (producer, partition) -> [producer id's epoch, the next entry's sequence]
        self._sequences: dict[tuple[str, int], list[int]] = {}

    # -- progress ----------------------------------------------------------------------

    @property
    def acknowledged(self) -> int:
        return sum(1 for p in self.produces if p.acked)

    async def wait_acked(self, count: int) -> None:
        """Until ``count`` entries are acknowledged (callers bound it)."""
        await self.wait_for(lambda: self.acknowledged >= count)

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Until ``done()``, asked again after each acknowledgement (callers bound it:
        when acknowledgements stop, nothing asks again)."""
        while not done():
            self._progress = anyio.Event()
            await self._progress.wait()

    def acked_times(self, partitions: Iterable[int], sent_since: float = 0.0
                    ) -> list[float]:
        """When each entry first sent to one of ``partitions`` at or after
        ``sent_since`` was acknowledged."""
        wanted = set(partitions)
        return [p.acked for p in self.produces
                if p.acked and p.partition in wanted and p.started >= sent_since]

    def acked_since(self, since: float) -> Counter[str]:
        """Acknowledged entries first sent at or after ``since``, per producer."""
        return Counter(p.producer for p in self.produces if p.acked and p.started >= since)

    def figures(self, failed_at: float, window_s: float) -> Figures:
        """Latency of entries first sent in ``window_s`` after the failure, against
        those sent in the same time before it."""
        acked = [p for p in self.produces if p.acked]
        after = [p.acked for p in acked if p.acked >= failed_at and p.started >= failed_at]
        return Figures(
            first_ack_after_s=(min(after) - failed_at) if after else float("inf"),
            window_s=window_s,
            during=[p.acked - p.started for p in acked
                    if failed_at <= p.started < failed_at + window_s],
            before=[p.acked - p.started for p in acked
                    if failed_at - window_s <= p.started < failed_at],
            errors=dict(self.errors),
        )

    # -- producers -----------------------------------------------------------------------

    async def _producer(self, client: httpx.AsyncClient, name: str) -> None:
        i = 0
        while not self._stopping.is_set():
            i += 1
            if self.entries_per_request == 1:
                p = self._rng.randrange(self.partitions)
                parts = {p: [f"{name}-{i}-{j}" for j in range(self._rng.randint(1, 3))]}
            else:
                chosen = self._rng.sample(range(self.partitions), self.entries_per_request)
                parts = {p: [f"{name}-{i}-{p}-{j}" for j in range(self._rng.randint(1, 3))]
                         for p in chosen}
            await self._until_acked(client, name, i, parts)
            await anyio.sleep(self.pause_s)

    async def _until_acked(self, client: httpx.AsyncClient, name: str, i: int,
                           parts: dict[int, list[str]]) -> None:
        """One request with an entry per partition of ``parts``, sent again for the
        entries not acknowledged yet until each is (or, keyless, may have been written)."""
        produce = Produce(name, time.monotonic(), partition=next(iter(parts)))
        self.produces.append(produce)
        keys = dict.fromkeys(parts, 0)
        pending = dict(parts)
        while pending:
            produce.attempts += 1
            entries: list[dict[str, Any]] = []
            for p, values in pending.items():
                entry: dict[str, Any] = {"topic": self.topic, "partition": p,
                                         "records": values}
                if self.keyed and self.sequenced:
                    epoch, sequence = self._sequences.setdefault((name, p), [0, 0])
                    entry["producer_id"] = f"{name}-{p}-{epoch}"
                    entry["sequence"] = sequence
                elif self.keyed:
                    suffix = f"{keys[p]}" if len(parts) == 1 else f"{p}-{keys[p]}"
                    entry["idempotency_key"] = f"{name}-{i}-{suffix}"
                entries.append(entry)
            sent = time.monotonic()
            try:
                r = await client.post("/produce", json={"topic_partitions": entries})
            except httpx.TransportError as exc:  # no answer: it may have been written
                error = f"transport:{type(exc).__name__}"
                self.errors[error] += 1
                self.failures.append(Failure(name, sent, error, maybe_written=True))
                if not self.keyed:
                    self.in_doubt.update(v for values in pending.values() for v in values)
                    break
                await anyio.sleep(RETRY_PAUSE_S)
                continue
            retry_after = float(r.headers.get("retry-after", RETRY_PAUSE_S))
            for (p, values), result in zip(list(pending.items()),
                                           self._results(r, len(pending)), strict=True):
                if result.get("ok"):
                    self._record(p, result, values)
                    del pending[p]
                    if self.sequenced:
                        self._sequences[(name, p)][1] += 1
                    continue
                error = result.get("error_type", f"http:{r.status_code}")
                self.errors[error] += 1
                self.failures.append(Failure(name, sent, error,
                                             bool(result.get("maybe_written"))))
                if not result.get("retriable"):
                    self.problems.append(f"not retriable: {r.status_code} {result}")
                    raise AssertionError(self.problems[-1])
                if result.get("maybe_written") and not self.keyed:
                    self.in_doubt.update(values)  # sending it again could store it twice
                    del pending[p]
                elif not result.get("maybe_written"):
                    # The broker says nothing was written: a new producer id (or key)
                    # proves it.
                    if self.sequenced:
                        self._sequences[(name, p)] = [self._sequences[(name, p)][0] + 1, 0]
                    else:
                        keys[p] += 1
            if pending:
                await anyio.sleep(retry_after)
        if not self.in_doubt.intersection(v for values in parts.values() for v in values):
            produce.acked = time.monotonic()
            self._progress.set()

    @classmethod
    def _results(cls, r: httpx.Response, entries: int) -> list[dict[str, Any]]:
        """Each entry's result; a refusal of the whole request stands for every entry."""
        try:
            body = r.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "results" in body:
            return [dict(result) for result in body["results"]]
        return [cls._result(r)] * entries

    @staticmethod
    def _result(r: httpx.Response) -> dict[str, Any]:
        try:
            body = r.json()
        except ValueError:  # not the broker's answer (a proxy's 502): as the client does,
            server_side = r.status_code >= 500  # a server-side one may have been written
            return {"error_type": f"http:{r.status_code}", "retriable": server_side,
                    "maybe_written": server_side}
        if "results" in body:
            return dict(body["results"][0])
        # Refused as a whole: with 503 nothing was written, and it may be sent again.
        return {**body, "retriable": r.status_code == 503}

    def _record(self, p: int, result: dict[str, Any], values: list[str]) -> None:
        offsets = range(result["start_offset"], result["end_offset"] + 1)
        for offset, value in zip(offsets, values, strict=True):
            earlier = self.acked.setdefault((p, offset), value)
            if earlier != value:
                self.problems.append(f"partition {p} offset {offset} acknowledged for "
                                     f"{earlier!r} and {value!r}")

    # -- consumers ------------------------------------------------------------------------

    async def _consumer(self, client: httpx.AsyncClient, broker: int, p: int) -> None:
        self._running_consumers += 1
        try:
            await self._consume(client, broker, p)
        finally:
            self._running_consumers -= 1
            if not self._running_consumers:
                self._drained.set()

    async def _consume(self, client: httpx.AsyncClient, broker: int, p: int) -> None:
        seen = self.consumed.setdefault((broker, p), {})
        offset = 1
        while True:
            if self._final is not None and offset > self._final[p]:
                return
            try:
                r = await client.post("/consume", json=consume_body(
                    self.topic, offset, p, max_wait_ms=1000))
            except httpx.TransportError as exc:
                self.consume_errors[f"transport:{type(exc).__name__}"] += 1
                await anyio.sleep(RETRY_PAUSE_S)
                continue
            result = self._result(r)
            if r.status_code != 200 or not result.get("ok"):
                self.consume_errors[result.get("error_type", f"http:{r.status_code}")] += 1
                await anyio.sleep(RETRY_PAUSE_S)
                continue
            for record in result["records"]:
                if record["offset"] != offset:
                    self.problems.append(f"broker {broker} partition {p}: offset "
                                         f"{record['offset']} where {offset} was due")
                seen[record["offset"]] = record["value"]
                offset = record["offset"] + 1

    # -- the run ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self, stack: LocalStack, *, drain_s: float = 60.0
                      ) -> AsyncIterator[FailoverLoad]:
        """Producers and consumers run inside; on exit producers finish their entry, and
        consumers catch up with what storage holds (within ``drain_s``)."""
        async with contextlib.AsyncExitStack() as stack_:
            clients = [await stack_.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=60)) for url in self.urls]
            async with anyio.create_task_group() as consumers:
                for b, client in enumerate(clients):
                    for p in range(self.partitions):
                        consumers.start_soon(self._consumer, client, b, p)
                async with anyio.create_task_group() as producers:
                    for b, client in enumerate(clients):
                        for n in range(self.producers_per_broker):
                            producers.start_soon(self._producer, client, f"b{b}p{n}")
                    yield self
                    self._stopping.set()
                self._final = await high_watermarks(stack, self.topic, self.partitions,
                                                    root_prefix=self.root_prefix)
                with anyio.move_on_after(drain_s):  # consumers end once past the marks
                    await self._drained.wait()
                if not self._drained.is_set():
                    behind = {k: (max(v, default=0), self._final[k[1]])
                              for k, v in self.consumed.items()
                              if max(v, default=0) < self._final[k[1]]}
                    raise AssertionError(f"consumers (broker, partition): (offset reached, "
                                         f"high watermark) after {drain_s} s: {behind}; "
                                         f"consume errors {dict(self.consume_errors)}")

    def first_acked_since(self, since: float) -> dict[str, float]:
        """Seconds from ``since`` to each producer's first acknowledgement of an entry
        sent at or after it (a figure: how soon each broker served again)."""
        first: dict[str, float] = {}
        for p in self.produces:
            if p.acked and p.started >= since:
                first[p.producer] = min(first.get(p.producer, p.acked), p.acked)
        return {name: round(t - since, 2) for name, t in sorted(first.items())}

    def unserved_since(self, since: float) -> set[str]:
        """Producers with no entry first sent at or after ``since`` acknowledged yet."""
        producers = {f"b{b}p{n}" for b in range(len(self.urls))
                     for n in range(self.producers_per_broker)}
        return producers - set(self.acked_since(since))

    async def wait_all_served_since(self, since: float, within_s: float) -> None:
        """Until every producer (so every broker) had an entry sent at or after
        ``since`` acknowledged, or ``within_s`` passed. The brokers need not come back
        at the same pace: on a loaded machine one may sit out an Oxia call's deadline
        and a retry pause while the other serves hundreds of entries."""
        with anyio.move_on_after(within_s):
            await self.wait_for(lambda: not self.unserved_since(since))

    async def assert_all_served_since(self, since: float) -> None:
        """Every producer had entries acknowledged after ``since`` (so did each broker),
        and every broker is alive and ready: none needed a restart."""
        assert not self.unserved_since(since), self.acked_since(since)
        async with httpx.AsyncClient(timeout=30) as client:
            for url in self.urls:
                assert (await client.get(f"{url}/health/ready")).status_code == 200

    async def verify(self, stack: LocalStack) -> dict[int, int]:
        """Storage against the acknowledgements and every consumer; returns the high
        watermark of each partition."""
        stored = await read_all(stack, self.topic, self.partitions,
                                root_prefix=self.root_prefix)
        problems = list(self.problems)
        values = Counter(v for records in stored.values() for v in records.values())
        problems += [f"{v!r} stored {n} times" for v, n in values.items() if n > 1]
        unacked = set(values) - set(self.acked.values()) - self.in_doubt
        problems += [f"{v!r} stored but never acknowledged" for v in sorted(unacked)]
        for (p, offset), value in self.acked.items():
            if stored[p].get(offset) != value:
                problems.append(f"partition {p} offset {offset}: acknowledged {value!r}, "
                                f"stored {stored[p].get(offset)!r}")
        for (b, p), seen in self.consumed.items():
            if seen != stored[p]:
                problems.append(f"broker {b} partition {p}: consumed {len(seen)} records, "
                                f"storage holds {len(stored[p])}")
        assert not problems, "\n".join(problems[:20])
        return {p: len(records) for p, records in stored.items()}


async def high_watermarks(stack: LocalStack, topic: str, partitions: int, *,
                          root_prefix: str | None = None) -> dict[int, int]:
    async with open_engine(_settings(stack, root_prefix)) as e:
        return {p: (await e.reader.read(TopicPartition(topic, p), 1, max_records=1)
                    ).high_watermark for p in range(partitions)}


async def read_all(stack: LocalStack, topic: str, partitions: int, *,
                   root_prefix: str | None = None) -> dict[int, dict[int, str]]:
    """Every partition from offset 1, straight from storage; offsets must be contiguous."""
    out: dict[int, dict[int, str]] = {}
    async with open_engine(_settings(stack, root_prefix)) as e:
        for p in range(partitions):
            records: dict[int, str] = {}
            offset = 1
            while True:
                result = await e.reader.read(TopicPartition(topic, p), offset)
                for o, payload in result.records:
                    assert o == offset, f"partition {p}: offset {o} where {offset} was due"
                    assert isinstance(payload, bytes)
                    records[o] = payload.decode()
                    offset += 1
                if offset > result.high_watermark:
                    break
            out[p] = records
    return out


def _settings(stack: LocalStack, root_prefix: str | None) -> Settings:
    return make_settings(stack) if root_prefix is None else make_settings(
        stack, root_prefix=root_prefix)
