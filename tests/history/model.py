"""A history: every operation of a run as invoke / ok / fail / info, one JSON line each.

As in Jepsen, an operation is two entries of one process: its ``invoke`` (what it asked,
when) and its completion: ``ok`` (it happened, with what the broker answered), ``fail``
(it certainly did not happen: a refusal that writes nothing) or ``info`` (unknown: a
timeout, a cut connection, a 5xx, a CommitInDoubt). A process has at most one operation
outstanding, so an entry's completion is the next entry of its process.

Operations (``f``) and their values:

- ``produce``: invoke ``{"topic", "partition", "values": [str], "keyed", "idem"}``; ok
  adds ``{"offsets": [int]}``, one per value, as the broker answered them.
- ``poll``: a read at ``offset`` of one partition (``wait_ms`` > 0: a long-poll); invoke
  ``{"topic", "partition", "offset", "wait_ms", "via"}``; ok ``{"records": [[offset,
  value]], "log_start": int | None, "error": str | None}``.
- ``group_poll``: a consumer group member's read; invoke ``{"group", "member", "mode":
  "at_least_once" | "at_most_once", "topic", "partition", "offset"}``; ok ``{"records"}``
  as for ``poll`` (at_most_once: the position was committed before the answer left).
- ``group_commit``: invoke ``{"group", "member", "topic", "partition", "offset"}`` (the
  API's committed offset: the last offset processed); ok / fail / info.
- ``truncate``: the log start moved on purpose (retention, a topic delete); ok
  ``{"topic", "partition", "log_start"}``: records below it are gone by design.
- ``final_read``: the full read at the end; ok ``{"topic", "partition", "log_start",
  "records"}``.
- ``final_group``: a group's committed offset read at the end; ok ``{"group",
  "topic", "partition", "committed"}``.
- ``nemesis``: a fault applied or healed (``process`` "nemesis"); invoke/ok carry
  ``{"fault", "target"}``. Not checked, drawn.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["invoke", "ok", "fail", "info"]


@dataclass(frozen=True)
class Entry:
    index: int
    process: str
    type: Kind
    f: str
    time: float  # seconds since the run started
    value: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"index": self.index, "process": self.process, "type": self.type,
                           "f": self.f, "time": round(self.time, 6), "value": self.value})


@dataclass(frozen=True)
class Op:
    """An invoke and its completion (None: the run ended first, which is ``info``)."""

    invoke: Entry
    done: Entry | None

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def outcome(self) -> Kind:
        return "info" if self.done is None else self.done.type

    @property
    def start(self) -> float:
        return self.invoke.time

    @property
    def end(self) -> float:
        return float("inf") if self.done is None else self.done.time

    @property
    def asked(self) -> dict[str, Any]:
        return self.invoke.value

    @property
    def answer(self) -> dict[str, Any]:
        return {} if self.done is None else self.done.value

    @property
    def indexes(self) -> list[int]:
        return [self.invoke.index] + ([] if self.done is None else [self.done.index])


class History:
    """Entries in the order they happened, and the operations they pair into."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries = list(entries)
        self.ops = pair(self.entries)

    def of(self, *fs: str) -> Iterator[Op]:
        return (op for op in self.ops if op.f in fs)

    @classmethod
    def load(cls, path: Path) -> History:
        entries = []
        with path.open() as lines:
            for line in lines:
                if line.strip():
                    raw = json.loads(line)
                    entries.append(Entry(raw["index"], raw["process"], raw["type"], raw["f"],
                                         raw["time"], raw.get("value") or {}))
        return cls(entries)


def pair(entries: list[Entry]) -> list[Op]:
    """Each invoke with the next entry of its process (a completion of another kind
    between is a malformed history)."""
    open_: dict[str, Entry] = {}
    ops: list[Op] = []
    for e in entries:
        if e.type == "invoke":
            if e.process in open_:
                raise ValueError(f"process {e.process} invoked entry {e.index} while "
                                 f"{open_[e.process].index} was outstanding")
            open_[e.process] = e
            continue
        started = open_.pop(e.process, None)
        if started is None or started.f != e.f:
            raise ValueError(f"entry {e.index} completes nothing its process invoked")
        ops.append(Op(started, e))
    ops.extend(Op(e, None) for e in open_.values())
    ops.sort(key=lambda op: op.invoke.index)
    return ops


class Recorder:
    """Appends entries to a JSON-lines file as they happen (a run that crashes leaves
    every entry written so far), and keeps them for the checker."""

    def __init__(self, path: Path, clock: Any) -> None:
        self._file = path.open("w")
        self._clock = clock
        self.entries: list[Entry] = []

    def add(self, process: str, type_: Kind, f: str, value: dict[str, Any] | None = None
            ) -> Entry:
        e = Entry(len(self.entries), process, type_, f, self._clock(), value or {})
        self.entries.append(e)
        self._file.write(e.to_json() + "\n")
        return e

    def close(self) -> None:
        self._file.close()
