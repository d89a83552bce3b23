"""The history's clients: each records every operation it makes, with its outcome, as the
broker answered it (JSON or binary bodies, through any broker).

An answer is ``ok`` only when the broker said so; ``fail`` only when nothing can have
been written (an error whose ``maybe_written`` is false, a whole request refused with a
4xx, a connection that could not be made); every other end (a timeout, a cut
connection, a 5xx, an error that may have written) is ``info``. A producer with
idempotency keys resends an ``info`` append under the same key as a new operation, as a
client retrying would; one without never resends.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from typing import Any

import anyio
import httpx

from app.storage import columnar
from app.wire import produce as binary_produce
from app.wire import records as binary_records
from llog_client import AsyncLlogClient, AsyncProducer, LlogError
from llog_client._partitioner import partition_for_key
from tests.history.model import Recorder

# As the Python client's default: a fault shorter than this (a pause, a slow store) is
# waited out, not resent (set_timeout: --client-timeout-s).
TIMEOUT_S = 30.0
DEADLINE: dict[str, str] = {}


def set_timeout(seconds: float) -> None:
    """Every client's timeout, and the commit deadline producers ask for with it, as the
    Python client does: the timeout less a second. The broker commits nothing of a
    request with a control version read after it, so a resend made once the timeout
    fired cannot meet a late first copy."""
    global TIMEOUT_S
    TIMEOUT_S = seconds
    DEADLINE["llog-commit-deadline-ms"] = str(round((seconds - 1.0) * 1000))


set_timeout(TIMEOUT_S)
Brokers = Callable[[], list[str]]


class Producer:
    def __init__(self, name: str, rec: Recorder, brokers: Brokers, topic: str,
                 partitions: int, rng: random.Random, *, idem: bool, binary: bool,
                 keyed: bool) -> None:
        self.name, self.rec, self.brokers = name, rec, brokers
        self.topic, self.partitions, self.rng = topic, partitions, rng
        self.idem, self.binary, self.keyed = idem, binary, keyed
        self._seq = 0

    async def run(self, stop: anyio.Event) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            retry: tuple[int, list[str], str] | None = None
            while not stop.is_set():
                if retry is None:
                    partition = self.rng.randrange(self.partitions)
                    values = [self._value() for _ in range(self.rng.randint(1, 4))]
                    retry = (partition, values, f"{self.name}.{self._seq}")
                outcome = await self._append(http, *retry)
                if outcome != "info" or not self.idem:
                    retry = None
                await anyio.sleep(self.rng.uniform(0, 0.02))

    def _value(self) -> str:
        self._seq += 1
        return f"{self.name}-{self._seq}"

    async def _append(self, http: httpx.AsyncClient, partition: int, values: list[str],
                      key: str) -> str:
        url = self.rng.choice(self.brokers())
        idem = key if self.idem else None
        self.rec.add(self.name, "invoke", "produce", {
            "topic": self.topic, "partition": partition, "values": values,
            "idem": idem, "binary": self.binary, "via": url})
        try:
            r = await self._post(http, url, partition, values, idem)
        except httpx.ConnectError as exc:  # no connection: the request was never sent
            self.rec.add(self.name, "fail", "produce", {"error": type(exc).__name__})
            await anyio.sleep(0.1)
            return "fail"
        except httpx.HTTPError as exc:
            self.rec.add(self.name, "info", "produce", {"error": type(exc).__name__})
            return "info"
        return self._answered(r)

    async def _post(self, http: httpx.AsyncClient, url: str, partition: int,
                    values: list[str], idem: str | None) -> httpx.Response:
        if self.binary:
            body = binary_produce.build([(self.topic, partition, idem, columnar.encode(
                [v.encode() for v in values]), "bytes-batch-v3")])
            return await http.post(f"{url}/produce", content=body, headers={
                "content-type": "application/vnd.llog.produce", **DEADLINE})
        records: list[Any] = ([{"value": v, "key": f"k{partition}"} for v in values]
                              if self.keyed else list(values))
        entry: dict[str, Any] = {"topic": self.topic, "partition": partition,
                                 "records": records}
        if idem is not None:
            entry["idempotency_key"] = idem
        return await http.post(f"{url}/produce", json={"topic_partitions": [entry]},
                               headers=DEADLINE)

    def _answered(self, r: httpx.Response) -> str:
        try:
            body = r.json()
        except ValueError:
            body = {}
        results = body.get("results") if isinstance(body, dict) else None
        if not results:
            kind = "fail" if 400 <= r.status_code < 500 else "info"
            self.rec.add(self.name, kind, "produce", {"status": r.status_code,
                                                      "error": body.get("error_type")})
            return kind
        result = results[0]
        if result.get("ok"):
            first, last = int(result["start_offset"]), int(result["end_offset"])
            self.rec.add(self.name, "ok", "produce", {
                "offsets": list(range(first, last + 1)),
                "duplicate": bool(result.get("duplicate"))})
            return "ok"
        kind = "info" if result.get("maybe_written", True) else "fail"
        self.rec.add(self.name, kind, "produce", {"error": result.get("error_type")})
        return kind


class RoutingProducer:
    """Produces through the Python client (``llog_client``) routing each request to the
    broker that appends its partition (``route="preferred"``), with the client's own
    retries and commit deadline; every call has an idempotency key, and a call of unknown
    outcome is made again under the same key, as an application would."""

    def __init__(self, name: str, rec: Recorder, urls: list[str], topic: str,
                 partitions: int, rng: random.Random) -> None:
        self.name, self.rec, self.urls = name, rec, urls
        self.topic, self.partitions, self.rng = topic, partitions, rng
        self._seq = 0

    async def run(self, stop: anyio.Event) -> None:
        async with AsyncLlogClient(self.urls, timeout_s=TIMEOUT_S,
                                   route="preferred") as client:
            retry: tuple[int, list[str], str] | None = None
            while not stop.is_set():
                if retry is None:
                    self._seq += 1
                    values = [f"{self.name}-{self._seq}-{i}"
                              for i in range(self.rng.randint(1, 4))]
                    retry = (self.rng.randrange(self.partitions), values,
                             f"{self.name}.{self._seq}")
                if await self._append(client, *retry) != "info":
                    retry = None
                await anyio.sleep(self.rng.uniform(0, 0.02))

    async def _append(self, client: AsyncLlogClient, partition: int, values: list[str],
                      key: str) -> str:
        self.rec.add(self.name, "invoke", "produce", {
            "topic": self.topic, "partition": partition, "values": values, "idem": key,
            "binary": False, "via": "routed"})
        try:
            result = await client.produce(self.topic, values, partition=partition,
                                          idempotency_key=key)
        except LlogError as exc:
            kind = "info" if exc.maybe_written else "fail"
            self.rec.add(self.name, kind, "produce", {"error": exc.error_type})
            return kind
        except Exception as exc:  # whatever escaped the client: unknown outcome
            self.rec.add(self.name, "info", "produce", {"error": type(exc).__name__})
            return "info"
        self.rec.add(self.name, "ok", "produce", {
            "offsets": [offset for _, offset in result.offsets()],
            "duplicate": any(b.duplicate for b in result.batches)})
        return "ok"


class BatchingProducer:
    """Records through ``llog_client.AsyncProducer`` (batches per partition, many
    partitions per binary request, several requests in flight, its own retries under
    each batch's idempotency key), as an application would: ``lanes`` tasks each send
    one record, keyed, and await it; each task is a process of the history. A record
    whose outcome is unknown is not sent again (a new record follows): the checker
    holds the producer to storing each record once."""

    def __init__(self, name: str, rec: Recorder, urls: list[str], topic: str,
                 partitions: int, rng: random.Random, lanes: int = 16) -> None:
        self.name, self.rec, self.urls = name, rec, urls
        self.topic, self.partitions, self.rng, self.lanes = topic, partitions, rng, lanes

    async def run(self, stop: anyio.Event) -> None:
        async with AsyncProducer(self.urls, linger_ms=5, request_timeout_s=TIMEOUT_S,
                                 delivery_timeout_ms=TIMEOUT_S * 2000) as producer, \
                anyio.create_task_group() as tg:
            for lane in range(self.lanes):
                tg.start_soon(self._lane, producer, f"{self.name}-{lane}", stop)

    async def _lane(self, producer: AsyncProducer, process: str, stop: anyio.Event) -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            value = f"{process}-{seq}"
            key = f"k{self.rng.randrange(64)}".encode()
            partition = partition_for_key(key, self.partitions)  # the broker's rule
            self.rec.add(process, "invoke", "produce", {
                "topic": self.topic, "partition": partition, "values": [value],
                "idem": None, "binary": True, "via": "producer"})
            try:
                meta = await (await producer.send(self.topic, value.encode(), key=key))
            except LlogError as exc:
                kind = "info" if exc.maybe_written else "fail"
                self.rec.add(process, kind, "produce", {"error": exc.error_type})
            except Exception as exc:  # whatever escaped the producer: unknown outcome
                self.rec.add(process, "info", "produce", {"error": type(exc).__name__})
            else:
                self.rec.add(process, "ok", "produce", {
                    "offsets": [meta.offset], "duplicate": meta.duplicate,
                    "placed": meta.partition})
            await anyio.sleep(self.rng.uniform(0, 0.02))


class Streamer:
    """Follows one partition as Server-Sent Events (``GET /topics/{t}/stream``) through
    any broker, resuming with ``Last-Event-ID`` after a cut, an ``end`` (a drain) or an
    error. Each ``records`` event is recorded as a poll at the offset the stream stood at
    (invoked when the previous event came): a skipped or repeated offset shows."""

    def __init__(self, name: str, rec: Recorder, brokers: Brokers, topic: str,
                 partition: int, rng: random.Random) -> None:
        self.name, self.rec, self.brokers = name, rec, brokers
        self.topic, self.partition, self.rng = topic, partition, rng
        self.offset: int | None = None  # None: from the log start
        self.last_id: str | None = None
        self._open = False  # a read invoked and not yet completed

    async def run(self, stop: anyio.Event) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, read=10.0)) as http:
            while not stop.is_set():
                with anyio.move_on_after(self.rng.uniform(5, 20)):  # reconnect now and then
                    await self._follow(http, stop)
                await anyio.sleep(0.05)

    async def _follow(self, http: httpx.AsyncClient, stop: anyio.Event) -> None:
        url = self.rng.choice(self.brokers())
        params = {"partitions": str(self.partition), "heartbeat_ms": "1000",
                  "from": "earliest" if self.offset is None else str(self.offset)}
        headers = {"last-event-id": self.last_id} if self.last_id else {}
        self._invoke(url)
        ended: dict[str, Any] = {"error": "stream closed"}  # how the open read ends
        try:
            async with http.stream("GET", f"{url}/topics/{self.topic}/stream",
                                   params=params, headers=headers) as r:
                if r.status_code != 200:
                    ended = {"status": r.status_code}
                    self.rec.add(self.name, "fail", "poll", ended)
                    self._open = False
                    return
                event: dict[str, str] = {}
                async for line in r.aiter_lines():
                    if line:
                        name, _, value = line.partition(":")
                        event[name] = value.removeprefix(" ")
                        continue
                    if self._dispatch(event, url) or stop.is_set():
                        return
                    event = {}
        except httpx.HTTPError as exc:
            ended = {"error": type(exc).__name__}
        finally:
            if self._open:
                self.rec.add(self.name, "info", "poll", ended)
                self._open = False

    def _invoke(self, url: str) -> None:
        self._open = True
        self.rec.add(self.name, "invoke", "poll", {
            "topic": self.topic, "partition": self.partition,
            "offset": 0 if self.offset is None else self.offset, "wait_ms": 1,
            "via": f"{url} (stream)"})

    def _dispatch(self, event: dict[str, str], url: str) -> bool:
        """Record one event; True when the stream ends with it."""
        kind = event.get("event")
        if kind == "records":
            data = json.loads(event["data"])
            records = [[r["offset"], r.get("value")] for r in data["records"]]
            self.rec.add(self.name, "ok", "poll", {"records": records, "log_start": None})
            self._open = False
            self.offset = int(data["next_offset"])
            self.last_id = event.get("id", self.last_id)
            self._invoke(url)
            return False
        if kind in ("end", "error"):
            data = json.loads(event.get("data") or "{}")
            error = data.get("error_type") or kind
            self.rec.add(self.name, "fail", "poll", {"error": error})
            self._open = False
            if error == "OffsetOutOfRange":
                self.offset, self.last_id = None, None
            return True
        return False


class Poller:
    """Reads one partition in order through any broker: plain fetches and long-polls,
    JSON or binary answers."""

    def __init__(self, name: str, rec: Recorder, brokers: Brokers, topic: str,
                 partition: int, rng: random.Random, *, binary: bool) -> None:
        self.name, self.rec, self.brokers = name, rec, brokers
        self.topic, self.partition, self.rng, self.binary = topic, partition, rng, binary
        self.offset: int | str = "earliest"

    async def run(self, stop: anyio.Event) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            while not stop.is_set():
                await self.once(http)

    async def once(self, http: httpx.AsyncClient) -> None:
        url = self.rng.choice(self.brokers())
        wait_ms = self.rng.choice((0, 0, 1000))
        asked = self.offset
        if asked == "earliest" and self.rng.random() < 0.5:
            asked = 0  # the log start too, as the API says, wherever it moved
        self.rec.add(self.name, "invoke", "poll", {
            "topic": self.topic, "partition": self.partition,
            "offset": 0 if asked == "earliest" else asked, "wait_ms": wait_ms, "via": url})
        try:
            result = await fetch(http, url, self.topic, self.partition, asked, wait_ms,
                                 binary=self.binary)
        except httpx.HTTPError as exc:
            kind = "fail" if isinstance(exc, httpx.ConnectError) else "info"
            self.rec.add(self.name, kind, "poll", {"error": type(exc).__name__})
            await anyio.sleep(0.1)
            return
        if result.get("ok"):
            self.rec.add(self.name, "ok", "poll", {
                "records": result["records"], "log_start": result.get("log_start_offset")})
            self.offset = int(result["next_offset"])
            return
        self.rec.add(self.name, "fail", "poll", {"error": result.get("error_type")})
        if result.get("error_type") == "OffsetOutOfRange":
            self.offset = "earliest"
        await anyio.sleep(0.05)


async def fetch(http: httpx.AsyncClient, url: str, topic: str, partition: int,
                offset: int | str, wait_ms: int, *, binary: bool = False,
                group: dict[str, Any] | None = None) -> dict[str, Any]:
    """One partition's consume result as a dict: ``records`` as [offset, value] pairs."""
    body: dict[str, Any] = {"topic_partitions": [
        {"topic": topic, "partition": partition, "fetch_offset": offset}],
        "max_wait_ms": wait_ms, **(group or {})}
    headers = {"accept": "application/vnd.llog.records"} if binary else {}
    r = await http.post(f"{url}/consume", json=body, headers=headers)
    if r.status_code != 200:
        try:
            error = r.json().get("error_type")
        except ValueError:
            error = None
        if r.status_code >= 500 or error is None:
            raise httpx.HTTPStatusError(f"{r.status_code}", request=r.request, response=r)
        return {"ok": False, "error_type": error}
    if binary:
        (parsed,) = binary_records.parse(r.content)
        if isinstance(parsed, binary_records.Failed):
            return {"ok": False, **parsed.error}
        return {"ok": True, "log_start_offset": parsed.log_start_offset,
                "next_offset": parsed.next_offset,
                "records": [[parsed.first_offset + i, _text(v)]
                            for i, v in enumerate(parsed.records)]}
    (result,) = r.json()["results"]
    if result.get("ok"):
        result["records"] = [[rec["offset"], rec.get("value")] for rec in result["records"]]
    return dict(result)


def _text(payload: object) -> str:
    value = getattr(payload, "value", payload)
    return bytes(value).decode() if isinstance(value, bytes | bytearray | memoryview) \
        else str(value)


class GroupMember:
    """A member of a consumer group: joins, heartbeats, reads its partitions from the
    committed offsets (then from its own position), and either commits what it read
    (at-least-once) or reads with ``commit: true`` (at-most-once); now and then it
    leaves and joins again, so the group rebalances."""

    def __init__(self, name: str, rec: Recorder, brokers: Brokers, group: str, topic: str,
                 rng: random.Random, *, mode: str) -> None:
        self.name, self.rec, self.brokers = name, rec, brokers
        self.group, self.topic, self.rng, self.mode = group, topic, rng, mode
        self.member: dict[str, Any] | None = None
        self.positions: dict[int, int] = {}

    async def run(self, stop: anyio.Event) -> None:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            while not stop.is_set():
                try:
                    await self._step(http)
                except httpx.HTTPError:
                    self.member = None  # join again: the outcome of what ran is recorded
                    await anyio.sleep(0.2)
            if self.member is not None:
                # The broker it chooses may be down (a fault not yet healed): the
                # member's session then expires instead, as a crashed client's would.
                with contextlib.suppress(httpx.HTTPError):
                    await self._leave(http)

    def _url(self) -> str:
        return self.rng.choice(self.brokers())

    async def _step(self, http: httpx.AsyncClient) -> None:
        if self.member is None:
            await self._join(http)
            return
        if self.rng.random() < 0.01:
            await self._leave(http)
            return
        r = await http.post(f"{self._url()}/groups/{self.group}/heartbeat",
                            json={"member_id": self.member["member_id"]})
        if r.status_code != 200:
            self.member = None
            return
        self._assigned(r.json())
        mine = [p for a in self.member["assignment"] for p in a["partitions"]]
        if not mine:
            await anyio.sleep(0.2)
            return
        await self._read(http, self.rng.choice(mine))

    async def _join(self, http: httpx.AsyncClient) -> None:
        r = await http.post(f"{self._url()}/groups/{self.group}/join", json={
            "topics": [self.topic], "client_id": self.name, "session_timeout_ms": 6000})
        if r.status_code == 200:
            self.positions.clear()
            self._assigned(r.json())
        else:
            await anyio.sleep(0.2)

    def _assigned(self, answer: dict[str, Any]) -> None:
        if self.member is None or answer["generation"] != self.member["generation"]:
            self.positions.clear()  # partitions gained are read from the committed offsets
        self.member = answer

    async def _leave(self, http: httpx.AsyncClient) -> None:
        assert self.member is not None
        await http.post(f"{self._url()}/groups/{self.group}/leave",
                        json={"member_id": self.member["member_id"]})
        self.member = None

    async def _read(self, http: httpx.AsyncClient, partition: int) -> None:
        assert self.member is not None
        process = f"{self.name}/{partition}"
        position = self.positions.get(partition)
        group: dict[str, Any] = {"group": self.group}
        if self.mode == "at_most_once":
            group.update(commit=True, member_id=self.member["member_id"],
                         generation=self.member["generation"])
        self.rec.add(process, "invoke", "group_poll", {
            "group": self.group, "member": self.name, "mode": self.mode, "topic": self.topic,
            "partition": partition, "offset": position, "generation":
            self.member["generation"]})
        try:
            result = await fetch(http, self._url(), self.topic, partition,
                                 "committed" if position is None else position,
                                 self.rng.choice((0, 500)), group=group)
        except httpx.HTTPError as exc:
            self.rec.add(process, "info", "group_poll", {"error": type(exc).__name__})
            raise
        if not result.get("ok"):
            self.rec.add(process, "fail", "group_poll", {"error": result.get("error_type")})
            self.positions.pop(partition, None)
            return
        self.rec.add(process, "ok", "group_poll", {"records": result["records"]})
        self.positions[partition] = int(result["next_offset"])
        if result["records"] and self.mode == "at_least_once":
            await self._commit(http, partition, int(result["records"][-1][0]))

    async def _commit(self, http: httpx.AsyncClient, partition: int, offset: int) -> None:
        assert self.member is not None
        process = f"{self.name}/{partition}"
        self.rec.add(process, "invoke", "group_commit", {
            "group": self.group, "member": self.name, "topic": self.topic,
            "partition": partition, "offset": offset})
        try:
            r = await http.post(f"{self._url()}/groups/{self.group}/commit", json={
                "member_id": self.member["member_id"], "generation": self.member["generation"],
                "offsets": [{"topic": self.topic, "partition": partition, "offset": offset}]})
        except httpx.HTTPError as exc:
            self.rec.add(process, "info", "group_commit", {"error": type(exc).__name__})
            raise
        kind = "ok" if r.status_code == 200 else "fail" if r.status_code < 500 else "info"
        self.rec.add(process, kind, "group_commit", {"status": r.status_code})
