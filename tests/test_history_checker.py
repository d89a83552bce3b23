"""The history checker alone (tests/history/checker.py): a correct history passes, and a
hand-made history of each anomaly is caught, with the entries that show it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.history.checker import KINDS, Report, check
from tests.history.model import Entry, History, Kind

T = "t"


class Builder:
    """Entries of a history, each operation invoked and completed in turn (``at`` sets
    the clock; operations that overlap are built with invoke/complete)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.now = 0.0

    def invoke(self, process: str, f: str, **value: Any) -> None:
        self._add(process, "invoke", f, value)

    def complete(self, process: str, kind: Kind, f: str, **value: Any) -> None:
        self._add(process, kind, f, value)

    def _add(self, process: str, kind: Kind, f: str, value: dict[str, Any]) -> None:
        self.now += 1
        self.entries.append(Entry(len(self.entries), process, kind, f, self.now, value))

    def produce(self, values: list[str], offsets: list[int] | None, kind: Kind = "ok",
                partition: int = 0, process: str = "w") -> None:
        self.invoke(process, "produce", topic=T, partition=partition, values=values)
        answer = {} if offsets is None else {"offsets": offsets}
        self.complete(process, kind, "produce", **answer)

    def poll(self, offset: int, records: list[tuple[int, str]], wait_ms: int = 0,
             log_start: int | None = None, process: str = "r", partition: int = 0) -> None:
        self.invoke(process, "poll", topic=T, partition=partition, offset=offset,
                    wait_ms=wait_ms)
        self.complete(process, "ok", "poll", records=[list(r) for r in records],
                      log_start=log_start)

    def group_poll(self, offset: int, records: list[tuple[int, str]], *, member: str = "m1",
                   mode: str = "at_least_once", kind: Kind = "ok") -> None:
        self.invoke(member, "group_poll", group="g", member=member, mode=mode, topic=T,
                    partition=0, offset=offset)
        self.complete(member, kind, "group_poll", records=[list(r) for r in records])

    def commit(self, offset: int, member: str = "m1") -> None:
        self.invoke(member, "group_commit", group="g", member=member, topic=T, partition=0,
                    offset=offset)
        self.complete(member, "ok", "group_commit")

    def truncate(self, log_start: int) -> None:
        self.invoke("admin", "truncate", topic=T, partition=0)
        self.complete("admin", "ok", "truncate", topic=T, partition=0, log_start=log_start)

    def final(self, records: list[tuple[int, str]], log_start: int = 1) -> None:
        self.invoke("final", "final_read", topic=T, partition=0)
        self.complete("final", "ok", "final_read", topic=T, partition=0, log_start=log_start,
                      records=[list(r) for r in records])

    def final_group(self, committed: int) -> None:
        self.invoke("final", "final_group", group="g", topic=T, partition=0)
        self.complete("final", "ok", "final_group", group="g", topic=T, partition=0,
                      committed=committed)

    def report(self) -> Report:
        return check(History(self.entries))


def _only(report: Report, kind: str) -> None:
    found = {k: len(v) for k, v in report.anomalies.items() if v}
    assert found == {kind: found.get(kind, 0)} and found.get(kind), found


def correct() -> Builder:
    """Two produces, reads, a long-poll that waits for the second, a group that reads
    and commits, a truncation, and the final reads."""
    h = Builder()
    h.produce(["a", "b"], [1, 2])
    h.poll(1, [(1, "a"), (2, "b")], log_start=1)
    h.invoke("r", "poll", topic=T, partition=0, offset=3, wait_ms=1000)  # waits
    h.produce(["c"], [3])
    h.complete("r", "ok", "poll", records=[[3, "c"]], log_start=1)
    h.group_poll(1, [(1, "a"), (2, "b")])
    h.group_poll(1, [(1, "a")])  # at-least-once: uncommitted, may come again
    h.commit(2)
    h.group_poll(3, [(3, "c")], member="m2")
    h.commit(3, member="m2")
    h.truncate(2)
    h.poll(2, [(2, "b"), (3, "c")], log_start=2)
    h.produce(["d"], None, kind="info")  # unknown outcome: may or may not be stored
    h.produce(["e"], None, kind="fail")  # refused: must not be stored
    h.final([(2, "b"), (3, "c")], log_start=2)
    h.final_group(3)
    return h


def test_a_correct_history_has_no_anomaly() -> None:
    report = correct().report()
    assert report.valid, report.anomalies
    assert report.summary()["outcomes"]["produce"] == {"ok": 2, "info": 1, "fail": 1}
    assert report.checked["acknowledged"] == 3


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_anomaly_is_caught(kind: str) -> None:
    h = BAD[kind]()
    report = h.report()
    _only(report, kind)
    (anomaly, *_) = report.anomalies[kind]
    assert anomaly.entries and all(0 <= i < len(h.entries) for i in anomaly.entries)


def _lost() -> Builder:
    h = Builder()
    h.produce(["a", "b"], [1, 2])
    h.final([(1, "a")])
    return h


def _failed_but_stored() -> Builder:
    h = Builder()
    h.produce(["a"], None, kind="fail")
    h.final([(1, "a")])
    return h


def _duplicate() -> Builder:
    h = Builder()
    h.produce(["a"], [1])
    h.produce(["b"], [2])
    h.final([(1, "a"), (2, "b"), (3, "a")])
    return h


def _inconsistent() -> Builder:
    h = Builder()
    h.produce(["a"], [1])
    h.poll(1, [(1, "a")])
    h.produce(["b"], None, kind="info")
    h.poll(1, [(1, "b")])
    h.final([(1, "a")])
    return h


def _wrong_offset() -> Builder:
    h = Builder()
    h.produce(["a"], [1])
    h.produce(["b"], [1])  # answered the offset of another record
    h.final([(1, "a"), (2, "b")])
    return h


def _noncontiguous() -> Builder:
    h = Builder()
    h.produce(["a", "b"], [1, 3])
    h.produce(["x"], [2])
    h.final([(1, "a"), (2, "x"), (3, "b")])
    return h


def _nonmonotonic() -> Builder:
    h = Builder()
    h.produce(["a", "b"], [1, 2])
    h.poll(2, [(1, "a"), (2, "b")])
    h.final([(1, "a"), (2, "b")])
    return h


def _skipping() -> Builder:
    h = Builder()
    h.produce(["a", "b", "c"], [1, 2, 3])
    h.poll(1, [(1, "a"), (3, "c")])
    h.final([(1, "a"), (2, "b"), (3, "c")])
    return h


def _resurrection() -> Builder:
    h = Builder()
    h.produce(["a", "b"], [1, 2])
    h.truncate(3)  # a delete: the log start past both
    h.poll(1, [(1, "a")])
    h.final([], log_start=3)
    return h


def _stuck() -> Builder:
    h = Builder()
    h.produce(["a"], [1])
    h.poll(1, [], wait_ms=500)
    h.final([(1, "a")])
    return h


def _reread() -> Builder:
    h = Builder()
    h.produce(["a", "b"], [1, 2])
    h.group_poll(1, [(1, "a"), (2, "b")])
    h.commit(2)
    h.group_poll(1, [(1, "a")], member="m2")  # the new owner read below the commit
    h.final([(1, "a"), (2, "b")])
    return h


def _skip() -> Builder:
    h = Builder()
    h.produce(["a", "b", "c"], [1, 2, 3])
    h.group_poll(1, [(1, "a")], mode="at_most_once")
    h.group_poll(3, [(3, "c")], mode="at_most_once", member="m2")
    h.final([(1, "a"), (2, "b"), (3, "c")])
    h.final_group(3)
    return h


def _log_start_refused() -> Builder:
    h = Builder()
    h.produce(["a"], [1])
    h.truncate(2)
    h.invoke("r", "poll", topic=T, partition=0, offset=0, wait_ms=0)
    h.complete("r", "fail", "poll", error="OffsetOutOfRange")
    h.final([], log_start=2)
    return h


BAD = {"lost_write": _lost, "failed_but_stored": _failed_but_stored,
       "duplicate": _duplicate, "inconsistent_offset": _inconsistent,
       "wrong_offset": _wrong_offset, "noncontiguous_produce": _noncontiguous,
       "nonmonotonic_poll": _nonmonotonic, "skipping_poll": _skipping,
       "resurrection": _resurrection, "stuck_poll": _stuck,
       "log_start_refused": _log_start_refused, "group_reread": _reread,
       "group_skip": _skip}


def test_at_most_once_never_rereads_even_without_a_commit() -> None:
    h = Builder()
    h.produce(["a"], [1])
    h.group_poll(1, [(1, "a")], mode="at_most_once")
    h.group_poll(1, [(1, "a")], mode="at_most_once", member="m2")
    h.final([(1, "a")])
    _only(h.report(), "group_reread")


def test_an_answer_never_seen_excuses_an_at_most_once_gap_but_not_an_at_least_once_one(
        ) -> None:
    for mode, expect_skip in (("at_most_once", False), ("at_least_once", True)):
        h = Builder()
        h.produce(["a", "b"], [1, 2])
        h.group_poll(1, [], mode=mode, kind="info")  # its answer was lost
        h.group_poll(2, [(2, "b")], mode=mode, member="m2")
        h.final([(1, "a"), (2, "b")])
        h.final_group(2)
        assert bool(h.report().anomalies.get("group_skip")) is expect_skip, mode


def test_records_removed_on_purpose_are_not_lost_and_a_concurrent_move_excuses_a_gap(
        ) -> None:
    h = Builder()
    h.produce(["a", "b", "c"], [1, 2, 3])
    h.invoke("admin", "truncate", topic=T, partition=0)  # retention, during the poll
    h.poll(1, [(3, "c")])
    h.complete("admin", "ok", "truncate", topic=T, partition=0, log_start=3)
    h.final([(3, "c")], log_start=3)
    assert h.report().valid, h.report().anomalies


def test_a_history_with_an_operation_left_open_counts_it_as_unknown() -> None:
    h = Builder()
    h.produce(["a"], [1])
    h.invoke("w2", "produce", topic=T, partition=0, values=["z"])  # the run ended
    h.final([(1, "a"), (2, "z")])
    report = h.report()
    assert report.valid and report.outcomes["produce"]["info"] == 1


def test_a_resend_that_failed_does_not_make_an_earlier_unknown_attempt_an_anomaly() -> None:
    h = Builder()
    h.produce(["a"], None, kind="info")  # cut: it may have been written
    h.produce(["a"], None, kind="fail")  # the resend found no connection
    h.final([(1, "a")])
    assert h.report().valid, h.report().anomalies
