"""The checker: reads a whole history and names every anomaly, with the entries that
show it (after Jepsen's Kafka/queue checker, for this API).

Values are unique per run, so a value is a record's identity. What each anomaly means:

- ``lost_write``: a produce answered ok whose value the final full read of its partition
  does not hold, at an offset at or above that read's log start (records that retention
  or a delete removed on purpose are below it).
- ``failed_but_stored``: a value read though every attempt to produce it was answered
  ``fail`` (a refusal that writes nothing).
- ``duplicate``: one value at two offsets.
- ``inconsistent_offset``: two values at one offset, across reads.
- ``wrong_offset``: a produce's answer named an offset where its value was not read.
- ``noncontiguous_produce``: the offsets of one produce answer are not consecutive.
- ``nonmonotonic_poll``: an answer's records go back, or start below the offset asked.
- ``skipping_poll``: an answer passes over an offset that holds a record (read anywhere)
  at or above every log start the run knew of while the poll ran.
- ``resurrection``: a record read below a log start that was known (a truncate done, or
  a read that answered it) before the read began.
- ``stuck_poll``: a long-poll answered empty at an offset where a record had been
  acknowledged before the poll began.
- ``group_reread``: a consumer group delivered a record again after a commit past it
  completed (at-least-once), or at all (at-most-once: ``commit: true``).
- ``log_start_refused``: a read at offset 0 (``earliest``: the log start, wherever a
  delete or retention moved it, docs/http-api.md) answered ``OffsetOutOfRange``.
- ``group_skip``: a record at or below a group's final committed offset (the API's: the
  last offset processed), at or above the
  final log start, that the group delivered to nobody (at-most-once: and that no answer
  the client never saw could have held).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from tests.history.model import History, Op

TP = tuple[str, int]
KINDS = ("lost_write", "failed_but_stored", "duplicate", "inconsistent_offset",
         "wrong_offset", "noncontiguous_produce", "nonmonotonic_poll", "skipping_poll",
         "resurrection", "stuck_poll", "log_start_refused", "group_reread", "group_skip")
READS = ("poll", "group_poll", "final_read")


@dataclass(frozen=True)
class Anomaly:
    kind: str
    what: str
    entries: tuple[int, ...]  # the indexes of the entries that show it


@dataclass
class Report:
    anomalies: dict[str, list[Anomaly]] = field(default_factory=lambda: defaultdict(list))
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    checked: Counter[str] = field(default_factory=Counter)

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values())

    def add(self, kind: str, what: str, ops: Iterable[Op]) -> None:
        assert kind in KINDS, kind
        entries = tuple(sorted({i for op in ops for i in op.indexes}))
        self.anomalies[kind].append(Anomaly(kind, what, entries))

    def summary(self) -> dict[str, Any]:
        return {"valid": self.valid,
                "anomalies": {k: len(self.anomalies.get(k, ())) for k in KINDS},
                "outcomes": {f: dict(c) for f, c in sorted(self.outcomes.items())},
                "checked": dict(self.checked)}


def _tp(value: dict[str, Any]) -> TP:
    return str(value["topic"]), int(value["partition"])


def _records(op: Op) -> list[tuple[int, str]]:
    return [(int(o), str(v)) for o, v in op.answer.get("records") or ()]


class _Facts:
    """What the reads and answers of a history established."""

    def __init__(self, history: History) -> None:
        self.seen: dict[tuple[TP, int], dict[str, list[Op]]] = defaultdict(
            lambda: defaultdict(list))
        self.where: dict[str, set[tuple[TP, int]]] = defaultdict(set)
        self.acked: dict[str, tuple[TP, int, Op]] = {}
        self.produced: dict[str, list[Op]] = defaultdict(list)  # every attempt, any outcome
        self.final: dict[TP, tuple[int, dict[int, str], Op]] = {}
        # Log starts known, with the time they were known from and the time they
        # may have moved from (a truncate's invoke).
        self.starts: dict[TP, list[tuple[float, float, int]]] = defaultdict(list)
        for op in history.ops:
            self._learn(op)
        # Every read adds a log start: the two questions below are asked once per read,
        # so each is answered by a search in times sorted once, with running maxima.
        self._known = {tp: _running_max([(done, s) for done, _, s in rows])
                       for tp, rows in self.starts.items()}
        self._possible = {tp: _running_max([(began, s) for _, began, s in rows])
                          for tp, rows in self.starts.items()}

    def _learn(self, op: Op) -> None:
        if op.f == "produce":
            for value in op.asked.get("values") or ():
                self.produced[str(value)].append(op)
        if op.outcome != "ok":
            return
        if op.f in READS:
            tp = _tp(op.answer if op.f == "final_read" else op.asked)
            for offset, value in _records(op):
                self.seen[(tp, offset)][value].append(op)
                self.where[value].add((tp, offset))
            start = op.answer.get("log_start")
            if start is not None:
                self.starts[tp].append((op.end, op.start, int(start)))
            if op.f == "final_read":
                self.final[tp] = (int(op.answer["log_start"]), dict(_records(op)), op)
        elif op.f == "produce":
            tp = _tp(op.asked)
            for value, offset in zip(op.asked["values"], op.answer.get("offsets") or (),
                                     strict=False):
                self.acked[str(value)] = (tp, int(offset), op)
        elif op.f == "truncate":
            tp = _tp(op.answer)
            self.starts[tp].append((op.end, op.start, int(op.answer["log_start"])))

    def known_before(self, tp: TP, t: float) -> int:
        """The highest log start known (completed) before ``t``."""
        return _max_before(self._known.get(tp), t)

    def possible_by(self, tp: TP, t: float) -> int:
        """The highest log start that may have been in force before ``t`` (a move that
        had begun)."""
        return _max_before(self._possible.get(tp), t)


def _running_max(rows: list[tuple[float, int]]) -> tuple[list[float], list[int]]:
    """Times in order, and the highest value at or before each."""
    rows.sort()
    highest, maxima = 0, []
    for _, value in rows:
        highest = max(highest, value)
        maxima.append(highest)
    return [t for t, _ in rows], maxima


def _max_before(index: tuple[list[float], list[int]] | None, t: float) -> int:
    """The highest value of the times strictly before ``t`` (0 when none)."""
    if index is None:
        return 0
    times, maxima = index
    at = bisect_left(times, t)
    return maxima[at - 1] if at else 0


def check(history: History) -> Report:
    report = Report()
    for op in history.ops:
        report.outcomes[op.f][op.outcome] += 1
    facts = _Facts(history)
    _check_produces(history, facts, report)
    _check_positions(facts, report)
    _check_polls(history, facts, report)
    _check_groups(history, facts, report)
    return report


def _check_produces(history: History, facts: _Facts, report: Report) -> None:
    for op in history.of("produce"):
        offsets = [int(o) for o in op.answer.get("offsets") or ()]
        if op.outcome == "ok" and offsets != list(range(offsets[0], offsets[0] + len(offsets))
                                                  if offsets else []):
            report.add("noncontiguous_produce", f"offsets {offsets} of one answer", [op])
        if op.outcome == "fail":
            for value in op.asked["values"]:
                # A resend that failed says nothing of an earlier attempt that may
                # have written: only a value every attempt of which failed counts.
                attempts = facts.produced.get(str(value), [op])
                if facts.where.get(str(value)) and all(a.outcome == "fail"
                                                       for a in attempts):
                    report.add("failed_but_stored", f"{value} refused, then read at "
                               f"{sorted(facts.where[str(value)])}", attempts)
    for value, (tp, offset, op) in facts.acked.items():
        report.checked["acknowledged"] += 1
        seen_at = facts.where.get(value, set())
        if seen_at and (tp, offset) not in seen_at:
            report.add("wrong_offset", f"{value} answered at {tp}@{offset}, read at "
                       f"{sorted(seen_at)}", [op])
        final = facts.final.get(tp)
        if final is None:
            report.checked["acknowledged_unread"] += 1
            continue
        log_start, records, read = final
        if offset >= log_start and value not in records.values():
            report.add("lost_write", f"{value} acknowledged at {tp}@{offset}, not in the "
                       f"final read (log start {log_start})", [op, read])


def _check_positions(facts: _Facts, report: Report) -> None:
    for value, places in facts.where.items():
        if len(places) > 1:
            # The attempts that wrote it, and one read of each copy.
            ops = facts.produced.get(value, [])[:4] + [
                facts.seen[(tp, o)][value][0] for tp, o in sorted(places)]
            report.add("duplicate", f"{value} at {sorted(places)}", ops)
    for (tp, offset), values in facts.seen.items():
        if len(values) > 1:
            ops = [ops_[0] for ops_ in values.values()]
            report.add("inconsistent_offset", f"{tp}@{offset} holds {sorted(values)}", ops)


def _check_polls(history: History, facts: _Facts, report: Report) -> None:
    held: dict[TP, list[int]] = defaultdict(list)
    for tp, offset in facts.seen:
        held[tp].append(offset)
    for offsets in held.values():
        offsets.sort()
    # Acknowledged records by partition, in offset order, for the stuck-poll check.
    acked: dict[TP, list[tuple[int, float, Op]]] = defaultdict(list)
    for tp, offset, produced in facts.acked.values():
        acked[tp].append((offset, produced.end, produced))
    for rows in acked.values():
        rows.sort(key=lambda row: row[0])
    for op in history.of("poll", "group_poll", "final_read"):
        if op.outcome == "fail" and op.answer.get("error") == "OffsetOutOfRange" \
                and op.asked.get("offset") == 0:
            report.add("log_start_refused", f"a read of {_tp(op.asked)} at its log start "
                       "(offset 0) answered OffsetOutOfRange", [op])
        if op.outcome != "ok":
            continue
        tp = _tp(op.answer if op.f == "final_read" else op.asked)
        records = _records(op)
        floor = facts.known_before(tp, op.start)
        for offset, value in records:
            if offset < floor:
                report.add("resurrection", f"{value} read at {tp}@{offset}, below the log "
                           f"start {floor} known before the read", [op])
        if op.f == "final_read" or op.asked.get("offset") is None:
            continue  # a read "from the committed offset": no number to check against
        report.checked["reads"] += 1
        _check_one_answer(op, tp, records, held[tp], acked[tp], facts, report)


def _check_one_answer(op: Op, tp: TP, records: list[tuple[int, str]], held: list[int],
                      acked: list[tuple[int, float, Op]], facts: _Facts, report: Report
                      ) -> None:
    """One answer's offsets against what the partition held; ``held`` and ``acked`` in
    offset order, so each answer costs a search, not a pass over the whole history."""
    asked = int(op.asked["offset"])
    offsets = [o for o, _ in records]
    if offsets != sorted(set(offsets)) or (offsets and offsets[0] < asked):
        report.add("nonmonotonic_poll", f"asked {tp}@{asked}, answered {offsets}", [op])
        return
    floor = max(facts.possible_by(tp, op.end), int(op.answer.get("log_start") or 0))
    if offsets:
        answered = set(offsets)
        lo, hi = bisect_left(held, max(asked, floor)), bisect_left(held, offsets[-1])
        passed = [o for o in held[lo:hi] if o not in answered]
        if passed:
            report.add("skipping_poll", f"asked {tp}@{asked}, answered {offsets}, passing "
                       f"over {passed[:5]}", [op])
    elif int(op.asked.get("wait_ms") or 0) > 0 and not op.answer.get("error"):
        start = bisect_left(acked, max(asked, floor), key=lambda row: row[0])
        waiting = next(((o, p) for o, end, p in islice(acked, start, None) if end < op.start),
                       None)
        if waiting is not None:
            o, produced = waiting
            report.add("stuck_poll", f"a long-poll at {tp}@{asked} answered empty; "
                       f"{tp}@{o} was acknowledged before it began", [op, produced])


def _check_groups(history: History, facts: _Facts, report: Report) -> None:
    deliveries: dict[tuple[str, TP], list[tuple[Op, int]]] = defaultdict(list)
    unseen: dict[tuple[str, TP], list[Op]] = defaultdict(list)
    modes: dict[str, str] = {}
    for op in history.of("group_poll"):
        key = (str(op.asked["group"]), _tp(op.asked))
        modes[key[0]] = str(op.asked.get("mode", "at_least_once"))
        if op.outcome == "ok":
            deliveries[key].extend((op, o) for o, _ in _records(op))
        else:
            unseen[key].append(op)
    commits: dict[tuple[str, TP], list[Op]] = defaultdict(list)
    for op in history.of("group_commit"):
        if op.outcome == "ok":
            commits[(str(op.asked["group"]), _tp(op.asked))].append(op)
    for key, delivered in deliveries.items():
        _check_rereads(key, delivered, commits[key], modes[key[0]], report)
    for op in history.of("final_group"):
        if op.outcome == "ok":
            key = (str(op.answer["group"]), _tp(op.answer))
            _check_skips(key, op, deliveries[key], unseen[key], modes.get(key[0], ""),
                         facts, report)


def _check_rereads(key: tuple[str, TP], delivered: list[tuple[Op, int]],
                   commits: list[Op], mode: str, report: Report) -> None:
    first: dict[int, Op] = {}
    for op, offset in sorted(delivered, key=lambda d: d[0].start):
        earlier = first.get(offset)
        if earlier is None:
            first[offset] = op
            continue
        if earlier is op:
            continue
        past = [c for c in commits if int(c.asked["offset"]) >= offset and c.end < op.start]
        if mode == "at_most_once" or past:
            why = "at-most-once" if mode == "at_most_once" else "after a commit past it"
            report.add("group_reread", f"group {key[0]} delivered {key[1]}@{offset} again "
                       f"({why})", [earlier, op, *past[:1]])


def _check_skips(key: tuple[str, TP], final: Op, delivered: list[tuple[Op, int]],
                 unseen: list[Op], mode: str, facts: _Facts, report: Report) -> None:
    committed = final.answer.get("committed")
    if committed is None:
        return
    tp = key[1]
    final_read = facts.final.get(tp)
    floor = final_read[0] if final_read else 0
    got = {o for _, o in delivered}
    held = sorted(o for (t, o) in facts.seen if t == tp)
    missed = [o for o in held if floor <= o <= int(committed) and o not in got]
    if mode == "at_most_once":  # an answer never seen may have delivered it
        missed = [o for o in missed
                  if not any(int(u.asked.get("offset") or 0) <= o for u in unseen)]
    if missed:
        report.add("group_skip", f"group {key[0]} committed {tp} to {committed} but "
                   f"delivered {missed[:5]} to nobody", [final])
