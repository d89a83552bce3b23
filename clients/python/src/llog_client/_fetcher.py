"""The consumer's requests, free of I/O like :mod:`llog_client._ops`: one ``POST
/consume`` over all of its partitions answered in LLR1 (:mod:`llog_client._records`),
retried as reads are; and ``POST /offsets`` by time over many partitions. The two
senders at the end put a :class:`FetchSend` on the wire for the sync and the async
client."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from llog_client import _wire as wire
from llog_client._config import ClientConfig, broken_of, reply_of
from llog_client._errors import LlogError
from llog_client._fastlane import Lane, usable
from llog_client._group_ops import offset_results
from llog_client._models import Resume, TopicPartitionKey
from llog_client._ops import Op, Pause, Send, failure
from llog_client._records import CONTENT_TYPE, PartitionBatch, PartitionFailure, parse
from llog_client._retry import RetryPolicy
from llog_client._wire import Broken, Outcome, Reply

Results = list[PartitionBatch | PartitionFailure]
# The headers of a consume asked for in LLR1. Answers come raw unless ``compressed``:
# the broker compresses an answer it was asked to, and that costs it more than sending
# the bytes over a fast network (a reader of 4 MiB answers of 1 KiB records on the
# broker's own machine: 88 MiB/s in zstd, 158 raw).
_BINARY = {"content-type": "application/json", "accept": CONTENT_TYPE}
_RAW = {**_BINARY, "accept-encoding": "identity"}


@dataclass(frozen=True)
class FetchSend:
    """A consume request whose answer is LLR1: the driver answers with its results, or
    with the :data:`~llog_client._wire.Outcome` of a refusal or a failed connection."""

    body: bytes
    wait_s: float
    compressed: bool = False

    @property
    def send(self) -> Send:  # what the client's settings (URL, timeout) are read for
        return Send("POST", "/consume", self.body, wait_s=self.wait_s)


@dataclass(frozen=True)
class Wait:
    """The consumer's worker waits until something changes (a poll takes an answer, a
    seek, a commit asked for, close), or for ``timeout_s`` (None: no limit)."""

    timeout_s: float | None


Action = Send | FetchSend | Pause | Wait
Answer = Results | Outcome | None


def consume_body(positions: Sequence[tuple[TopicPartitionKey, Resume]], *, max_wait_ms: int,
                 max_bytes: int, group: str | None, reset: str,
                 commit_as: tuple[str, int] | None) -> bytes:
    """The request: every partition from its position; with a ``group``,
    ``"committed"`` positions read from its offsets; ``commit_as`` (member id,
    generation) asks the broker to commit what it answers (at-most-once)."""
    request: dict[str, Any] = {
        "topic_partitions": [{"topic": t, "partition": p, "fetch_offset": position}
                             for (t, p), position in positions],
        "max_wait_ms": max_wait_ms, "max_bytes": max_bytes}
    if group is not None:
        request.update(group=group, auto_offset_reset=reset)
    if commit_as is not None:
        request.update(commit=True, member_id=commit_as[0], generation=commit_as[1])
    return wire.dumps(request)


def fetch(send: FetchSend, policy: RetryPolicy,
          stopping: Callable[[], bool] = lambda: False) -> Generator[Action, Answer, Results]:
    """The results of ``send``; what the broker or the connection refuses is retried
    within the policy (a read changes nothing: a consume that commits commits again only
    what it delivers again), then raised; not retried once ``stopping`` (the consumer
    closes: it waits for no more than the request under way)."""
    attempt = 0
    while True:
        outcome = yield send
        if isinstance(outcome, list):
            return outcome
        assert isinstance(outcome, Reply | Broken)
        error = failure(outcome, idempotent=True)
        attempt += 1
        if not error.retriable or attempt >= policy.max_attempts or stopping():
            raise error
        yield Pause(policy.delay_s(attempt - 1, error.retry_after_s))


def partition_error(failed: PartitionFailure) -> LlogError:
    return wire.entry_error({"topic": failed.topic, "partition": failed.partition,
                             **failed.error}, Reply(200, None))


def offsets_at(keys: Sequence[TopicPartitionKey], timestamp_ms: int, policy: RetryPolicy
               ) -> Op[dict[TopicPartitionKey, int]]:
    """The first offset of each partition appended at or after ``timestamp_ms``
    (``high_watermark + 1`` where every record is older): one request."""
    body = wire.dumps({"topic_partitions": [
        {"topic": t, "partition": p, "timestamp_ms": timestamp_ms} for t, p in keys]})
    return (yield from offset_results(Send("POST", "/offsets", body), len(keys), policy))


# -- on the wire ------------------------------------------------------------------------


def _headers(send: FetchSend) -> Mapping[str, str]:
    return _BINARY if send.compressed else _RAW


def _answer(status: int, content_type: str, content: bytes,
            reply: Callable[[], Reply]) -> Results | Outcome:
    if status != 200 or not content_type.startswith(CONTENT_TYPE):
        return reply()
    try:
        return parse(content)
    except LlogError as exc:  # an answer outside the contract: not retried
        return Reply(status=200, body=None, text=str(exc))


class Sender:
    """Puts a :class:`FetchSend` on the wire for a sync driver (the async one runs it on
    a worker thread): through the fast lane (:mod:`llog_client._fastlane`) where it
    can, else through ``http``, the client's httpx client."""

    def __init__(self, http: httpx.Client | None, headers: Mapping[str, str],
                 config: ClientConfig, lane_allowed: bool) -> None:
        self._http = http
        self._config = config
        self._lane = Lane() if lane_allowed else None
        self._usable: dict[str, bool] = {}  # by URL: reading the environment takes 0.4 ms
        # The client's own headers (user agent, token) under the consume's.
        self._headers = {k: v for k, v in headers.items() if k.lower() not in _RAW}

    def uses_lane(self, send: FetchSend) -> bool:
        if self._lane is None or send.compressed:
            return False
        url = self._config.url("/consume")
        if url not in self._usable:
            self._usable[url] = usable(url)
        return self._usable[url]

    def post(self, send: FetchSend) -> Results | Outcome:
        url = self._config.url("/consume")
        timeout = self._config.timeout(send.send)
        if self._lane is None or not self.uses_lane(send):
            assert self._http is not None, "the async consumer sends these itself"
            return self._post_http(self._http, url, send, timeout)
        got = self._lane.post(url, send.body, {**self._headers, **_RAW},
                              connect_s=timeout.connect, read_s=timeout.read)
        if isinstance(got, Broken):
            return got
        status, headers, content = got
        return _answer(status, headers.get("content-type", ""), content, lambda: reply_of(
            httpx.Response(status, headers=headers, content=content)))

    def _post_http(self, http: httpx.Client, url: str, send: FetchSend,
                   timeout: httpx.Timeout) -> Results | Outcome:
        try:
            response = http.post(url, content=send.body, headers=_headers(send),
                                 timeout=timeout)
        except httpx.TransportError as exc:
            return broken_of(exc)
        return _http_answer(response)

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()

    def interrupt(self) -> None:
        """End a request under way on the lane now (from another thread: closing the
        socket would not wake a ``recv`` blocked on it; shutting it down does)."""
        if self._lane is not None:
            self._lane.interrupt()


def _http_answer(response: httpx.Response) -> Results | Outcome:
    return _answer(response.status_code, response.headers.get("content-type", ""),
                   response.content, lambda: reply_of(response))


async def apost(http: httpx.AsyncClient, config: ClientConfig, send: FetchSend
                ) -> Results | Outcome:
    """Through the async client's httpx client: one given a transport of its own, a
    proxy in between, or compressed answers."""
    try:
        response = await http.post(config.url("/consume"), content=send.body,
                                   headers=_headers(send), timeout=config.timeout(send.send))
    except httpx.TransportError as exc:
        return broken_of(exc)
    return _http_answer(response)
