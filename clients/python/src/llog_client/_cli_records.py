"""What ``llog consume`` and ``llog tail`` read and how they print it, in the manner of
kcat: every partition of the topic (or those ``--partition`` names), read with one
consume request over all of them at a time and interleaved by append time; and
kcat's output templates (``--format '%p %o %k %s\\n'``).

Only the client's public names are used here, so this module goes with the client."""

from __future__ import annotations

import argparse
import heapq
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from llog_client import ConsumedRecord, LlogClient, LlogError, RetryPolicy

Start = Literal["earliest", "latest"] | int

# What the partitions' records waiting to be printed may hold at most, shared out over
# the partitions (each answer brings at least one record, however large).
BUFFER_BYTES = 8 * 1024 * 1024
MIN_REQUEST_BYTES = 64 * 1024
MAX_REQUEST_BYTES = 4 * 1024 * 1024


# -- choosing partitions and where to start ------------------------------------------


def partition_list(text: str) -> list[int]:
    """``--partition``: a number, or several separated by commas."""
    try:
        numbers = [int(part) for part in text.split(",")]
    except ValueError:
        numbers = [-1]
    if any(n < 0 for n in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a partition number, or "
                                         "several separated by commas")
    return numbers


def _chosen(args: argparse.Namespace) -> list[int]:
    return list(dict.fromkeys(args.partition or ()))  # once each, in the order given


def starts(llog: LlogClient, args: argparse.Namespace) -> dict[int, Start]:
    """Where each partition is read from. Partitions named with ``--partition`` start
    where asked (an offset outside one is the broker's ``OffsetOutOfRange``); all of a
    topic's, each at ``--from`` within its own log, so one offset fits partitions of
    any length. ``tail`` starts each partition ``--lines`` before its end."""
    chosen = _chosen(args)
    if chosen:
        if args.command != "tail":
            return dict.fromkeys(chosen, args.start)
        ends = [llog.offsets(args.topic, p) for p in chosen]
        return {p: _last(e.log_start_offset, e.high_watermark, args.lines)
                for p, e in zip(chosen, ends, strict=True)}
    states = llog.describe_topic(args.topic).partition_states
    if args.command == "tail":
        return {s.partition: _last(s.log_start_offset, s.high_watermark, args.lines)
                for s in states}
    start: Start = args.start
    if isinstance(start, str):
        return {s.partition: start for s in states}
    return {s.partition: min(max(start, s.log_start_offset), s.high_watermark + 1)
            for s in states}


def _last(log_start: int, high_watermark: int, lines: int) -> int:
    return max(log_start, high_watermark + 1 - lines)


# -- reading every partition -------------------------------------------------------------


def order(record: ConsumedRecord) -> tuple[int, int, int]:
    """Records print by append time; records appended in the same millisecond by
    partition, then offset."""
    at = record.append_time_ms if record.append_time_ms is not None else record.timestamp_ms
    return (at or 0, record.partition, record.offset)


@dataclass
class _Partition:
    number: int
    position: Start
    at_end: bool = False  # read to the end the broker last reported
    waiting: deque[ConsumedRecord] = field(default_factory=deque)
    failures: int = 0  # retriable errors in a row


class TopicReader:
    """The records of some partitions of a topic, in append-time order, in runs ready
    to print.

    A record is printed once every other partition has a record waiting (its own first
    says whether it comes before) or has been read to its end: no partition's earlier
    records can then still arrive out of order. Each round asks, in one consume
    request, for the partitions that have nothing waiting; once all were read to their
    end, it stops, or (``follow``) long-polls them all in one request, printing what
    arrives on any of them at once.

    ``caught_up`` turns true with the run that reaches the end of every partition
    (that run is yielded even when empty)."""

    def __init__(self, llog: LlogClient, topic: str, starts: dict[int, Start], *,
                 follow: bool, max_wait_ms: int, retry: RetryPolicy | None = None) -> None:
        self._llog = llog
        self._topic = topic
        self._parts = {p: _Partition(p, start) for p, start in starts.items()}
        self._follow = follow
        self._max_wait_ms = max_wait_ms
        self._retry = retry or RetryPolicy()
        self._budget = max(MIN_REQUEST_BYTES,
                           min(MAX_REQUEST_BYTES, BUFFER_BYTES // max(1, len(starts))))
        self._heads: list[tuple[tuple[int, int, int], int]] = []  # (order, partition)
        self._turn = 0
        self.caught_up = False

    def __iter__(self) -> Iterator[list[ConsumedRecord]]:
        while self._parts:
            ready = self._ready()
            reached = not self._heads and all(p.at_end for p in self._parts.values())
            if ready or (reached and not self.caught_up):
                self.caught_up = self.caught_up or reached
                yield ready
            if reached and not self._follow:
                return
            self._fetch()

    def _ready(self) -> list[ConsumedRecord]:
        """The records that may be printed now, in order."""
        out: list[ConsumedRecord] = []
        blocked = sum(1 for p in self._parts.values() if not p.waiting and not p.at_end)
        while self._heads and not blocked:
            _, number = heapq.heappop(self._heads)
            part = self._parts[number]
            out.append(part.waiting.popleft())
            if part.waiting:
                heapq.heappush(self._heads, (order(part.waiting[0]), number))
            elif not part.at_end:
                blocked += 1
        return out

    def _fetch(self) -> None:
        wanted = [p for p in self._parts.values()
                  if not p.waiting and (self._follow or not p.at_end)]
        # The answer's budget goes to partitions in request order: rotate it.
        self._turn = (self._turn + 1) % len(wanted)
        wanted = wanted[self._turn:] + wanted[:self._turn]
        tail_only = all(p.at_end for p in wanted)
        answers = self._llog.fetch_many(
            {(self._topic, p.number): p.position for p in wanted},
            max_wait_ms=self._max_wait_ms if tail_only else 0, max_bytes=self._budget)
        pause = 0.0
        for part, got in zip(wanted, answers, strict=True):
            if isinstance(got, LlogError):
                pause = max(pause, self._failed(part, got))
                continue
            part.failures = 0
            part.position, part.at_end = got.next_offset, got.at_end
            if got.records:
                part.waiting.extend(got.records)
                heapq.heappush(self._heads, (order(got.records[0]), part.number))
        if pause:
            time.sleep(pause)  # a command-line program: nothing else waits on it

    def _failed(self, part: _Partition, error: LlogError) -> float:
        """A partition's error: raised, unless retriable within the retry policy (the
        pause before asking again is returned)."""
        part.failures += 1
        if not error.retriable or part.failures >= self._retry.max_attempts:
            raise error
        return self._retry.delay_s(part.failures - 1, error.retry_after_s)


def batches(llog: LlogClient, args: argparse.Namespace) -> Iterator[list[ConsumedRecord]]:
    """What ``consume`` or ``tail`` prints, in runs (``--count`` is the caller's)."""
    reader = TopicReader(llog, args.topic, starts(llog, args), follow=args.follow,
                         max_wait_ms=args.max_wait_ms)
    if args.command != "tail":
        yield from reader
        return
    # The last --lines of the topic: each partition's last ones, merged, cut to --lines.
    runs = iter(reader)
    last: deque[ConsumedRecord] = deque(maxlen=args.lines)
    for run in runs:
        last.extend(run)
        if reader.caught_up:
            break
    yield list(last)
    yield from runs


# -- output templates ----------------------------------------------------------------


def record_time(record: ConsumedRecord) -> int:
    """The record's timestamp: the producer's when it gave one, else the append time
    (as a Kafka record's is its create time, else its log-append time); -1: neither."""
    for ms in (record.timestamp_ms, record.append_time_ms):
        if ms is not None:
            return ms
    return -1


def _headers(record: ConsumedRecord) -> bytes:
    return b",".join(name.encode() + b"=" + value for name, value in record.headers)


def _decimal(number: int) -> bytes:
    return str(number).encode()


Field = Callable[[ConsumedRecord], bytes]
FIELDS: dict[str, Field] = {
    "k": lambda r: r.key or b"",
    "s": lambda r: r.value,
    "o": lambda r: _decimal(r.offset),
    "p": lambda r: _decimal(r.partition),
    "t": lambda r: r.topic.encode(),
    "T": lambda r: _decimal(record_time(r)),
    "h": _headers,
    "S": lambda r: _decimal(len(r.value)),
    "K": lambda r: _decimal(-1 if r.key is None else len(r.key)),
}
ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\"}


@dataclass(frozen=True)
class Template:
    """A kcat ``-f`` format: text with ``%`` fields and backslash escapes."""

    text: str
    parts: tuple[bytes | Field, ...]

    def render(self, record: ConsumedRecord) -> bytes:
        return b"".join(p if isinstance(p, bytes) else p(record) for p in self.parts)

    def __str__(self) -> str:
        return self.text


def template(text: str) -> Template:
    parts: list[bytes | Field] = []
    literal = bytearray()
    chars = iter(text)
    for char in chars:
        if char not in "%\\":
            literal += os.fsencode(char)
            continue
        after = next(chars, "")
        if char == "\\":
            literal += ESCAPES.get(after, os.fsencode(char + after))
        elif after == "%":
            literal += b"%"
        elif after in FIELDS:
            parts.extend([bytes(literal), FIELDS[after]] if literal else [FIELDS[after]])
            literal.clear()
        else:
            raise argparse.ArgumentTypeError(
                f"{text!r}: unknown field %{after} (fields: "
                f"{' '.join('%' + f for f in FIELDS)}, and %% for %)")
    if literal:
        parts.append(bytes(literal))
    return Template(text, tuple(parts))


OutputFormat = Literal["value", "json"] | Template


def output_format(text: str) -> OutputFormat:
    """``--format``: ``value``, ``json``, or a template (it has a ``%`` field or a
    backslash escape; anything else is taken for a misspelt name)."""
    if text == "value":
        return "value"
    if text == "json":
        return "json"
    if "%" in text or "\\" in text:
        return template(text)
    raise argparse.ArgumentTypeError(f"{text!r}: expected value, json or a template "
                                     "such as '%p:%o %k=%s\\n'")


FORMAT_HELP = (
    "value: each value on a line; json: JSON lines with topic, partition, offset, key, "
    "headers and timestamps; or a template, as kcat's -f: %%s value, %%k key, %%o offset, "
    "%%p partition, %%t topic, %%T timestamp (ms; the producer's, else the append time), "
    "%%h headers (name=value,...), %%S value size, %%K key size (-1: no key), %%%% a %%, "
    "and \\n \\t \\r \\\\ escapes; nothing is added (end it with \\n). A template writes "
    "keys, values and headers as their raw bytes")
