"""The CLI's reading of every partition and its output templates, with a fake client:
the order records are printed in, the requests made for them, and what a template
writes."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import pytest

from llog_client import (
    ConsumedRecord,
    Fetched,
    GroupPage,
    GroupSummary,
    LlogClient,
    LlogError,
    RetryPolicy,
    StorageUnavailable,
)
from llog_client._cli_groups import all_groups
from llog_client._cli_records import TopicReader, output_format, template

TOPIC = "orders"


def rec(partition: int, offset: int, at: int, value: bytes = b"v", **kw: Any
        ) -> ConsumedRecord:
    return ConsumedRecord(TOPIC, partition, offset, value, append_time_ms=at, **kw)


class FakeLog:
    """Partitions as lists of records (offset = index + 1), answering fetch_many as the
    broker does, at most ``per_answer`` records a partition; ``on_wait`` runs when a
    request would long-poll at the tail (it may append, as a producer would)."""

    def __init__(self, logs: dict[int, list[ConsumedRecord]], per_answer: int = 2) -> None:
        self.logs = logs
        self.per_answer = per_answer
        self.requests: list[tuple[list[int], int]] = []
        self.on_wait: Any = None
        self.errors: dict[int, list[LlogError]] = {}

    def fetch_many(self, positions: Mapping[tuple[str, int], Any], *,
                    max_wait_ms: int, max_bytes: int) -> list[Fetched | LlogError]:
        self.requests.append(([p for _, p in positions], max_wait_ms))
        if max_wait_ms and self.on_wait is not None:
            self.on_wait(self.logs)
        out: list[Fetched | LlogError] = []
        for (_, p), start in positions.items():
            if self.errors.get(p):
                out.append(self.errors[p].pop(0))
                continue
            log = self.logs[p]
            first = 1 if start == "earliest" else len(log) + 1 if start == "latest" else start
            records = tuple(log[first - 1:first - 1 + self.per_answer])
            out.append(Fetched(TOPIC, p, records, first + len(records), len(log)))
        return out


def read(log: FakeLog, partitions: list[int], *, follow: bool = False,
         retry: RetryPolicy | None = None) -> tuple[list[list[ConsumedRecord]], TopicReader]:
    reader = TopicReader(log, TOPIC, dict.fromkeys(partitions, "earliest"),  # type: ignore[arg-type]
                         follow=follow, max_wait_ms=5000, retry=retry)
    return list(reader), reader


def test_records_of_all_partitions_print_in_append_time_order() -> None:
    log = FakeLog({0: [rec(0, 1, 10), rec(0, 2, 30), rec(0, 3, 30), rec(0, 4, 60)],
                   1: [rec(1, 1, 20), rec(1, 2, 30)],
                   2: []})
    runs, reader = read(log, [0, 1, 2])
    printed = [(r.partition, r.offset) for run in runs for r in run]
    # ties (30 ms) by partition, then offset
    assert printed == [(0, 1), (1, 1), (0, 2), (0, 3), (1, 2), (0, 4)]
    assert reader.caught_up
    # Each round asks in one request for the partitions that have nothing waiting.
    assert sorted(log.requests[0][0]) == [0, 1, 2]
    assert all(wait == 0 for _, wait in log.requests)


def test_follow_long_polls_every_partition_in_one_request() -> None:
    log = FakeLog({0: [rec(0, 1, 10)], 1: [], 2: []})

    def produce(logs: dict[int, list[ConsumedRecord]]) -> None:
        if not logs[2]:
            logs[2].append(rec(2, 1, 50, b"late"))

    log.on_wait = produce
    reader = TopicReader(log, TOPIC, dict.fromkeys([0, 1, 2], "earliest"),  # type: ignore[arg-type]
                         follow=True, max_wait_ms=5000)
    runs = iter(reader)
    assert [r.value for r in next(runs)] == [b"v"]
    assert reader.caught_up
    assert [(r.partition, r.value) for r in next(runs)] == [(2, b"late")]
    polls = [(sorted(parts), wait) for parts, wait in log.requests if wait]
    assert polls == [([0, 1, 2], 5000)]


def test_a_tail_with_nothing_to_read_says_it_caught_up() -> None:
    runs, reader = read(FakeLog({0: [], 1: []}), [0, 1])
    assert runs == [[]] and reader.caught_up


def test_retriable_partition_errors_are_asked_again_and_others_raised() -> None:
    log = FakeLog({0: [rec(0, 1, 10)], 1: [rec(1, 1, 5)]})
    log.errors[1] = [StorageUnavailable("slow", retriable=True)]
    quick = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.001)
    runs, _ = read(log, [0, 1], retry=quick)
    assert [(r.partition, r.offset) for run in runs for r in run] == [(1, 1), (0, 1)]
    log.errors[1] = [StorageUnavailable("down", retriable=True)] * 3
    with pytest.raises(StorageUnavailable):
        read(log, [0, 1], retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.001))


def test_templates_write_fields_escapes_and_raw_bytes() -> None:
    record = ConsumedRecord("t", 3, 17, b"\xff\x00", key=b"k", headers=(("a", b"1"),
                            ("b", b"\xfe")), timestamp_ms=None, append_time_ms=99)
    shown = template(r"%t %p %o %k %K %s %S %T %h %% \t\\\n").render(record)
    assert shown == b"t 3 17 k 1 \xff\x00 2 99 a=1,b=\xfe % \t\\\n"
    keyless = ConsumedRecord("t", 0, 1, b"", timestamp_ms=5, append_time_ms=99)
    assert template("[%k][%K][%T][%h]").render(keyless) == b"[][-1][5][]"
    assert output_format("json") == "json" and output_format("value") == "value"
    for bad in ("%q", "jsno", "50%"):
        with pytest.raises(argparse.ArgumentTypeError):
            output_format(bad)


def test_groups_are_listed_page_after_page() -> None:
    def summary(name: str) -> GroupSummary:
        return GroupSummary(name, 1, 0, (), 0, 0)

    pages = {None: GroupPage((summary("a"), summary("b")), "b"),
             "b": GroupPage((summary("c"),), None)}

    class Groups:
        def list_groups(self, *, after: str | None, limit: int) -> GroupPage:
            return pages[after]

    client: LlogClient = Groups()  # type: ignore[assignment]
    assert [g.group for g in all_groups(client)] == ["a", "b", "c"]
