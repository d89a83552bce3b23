"""The idempotency window kept inside ``meta/control`` (pure functions).

The control record's ``idempotency`` field maps the most recent idempotency keys of a
partition to where their records were committed: ``{key: [start, end, data_key]}``,
oldest first. The same CAS that commits an append updates it, so "committed" and
"remembered" can never disagree; the oldest keys are forgotten first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.storage.appends import AppendResult
from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import Control

IDEMPOTENCY_FIELD = "idempotency"
IDEMPOTENCY_WINDOW = 64


@dataclass(frozen=True)
class Remembered:
    """Where the append of a remembered key was committed."""

    start: int
    end: int
    data_key: str

    def result(self, tp: TopicPartition, layout: KeyLayout) -> AppendResult:
        return AppendResult(tp, self.start, self.end, self.end - self.start + 1,
                            layout.index(tp, self.end), self.data_key, duplicate=True)


def remembered(control: Control, key: str) -> Remembered | None:
    """The committed append of ``key``, if the window still holds it."""
    table = control.extra.get(IDEMPOTENCY_FIELD)
    if not isinstance(table, dict):
        return None
    entry = table.get(key)
    if (not isinstance(entry, list) or len(entry) != 3
            or not isinstance(entry[0], int) or not isinstance(entry[1], int)):
        return None
    return Remembered(entry[0], entry[1], str(entry[2]))


def window_since(control: Control, sequence_counter: int) -> bool:
    """Whether the window still holds every key committed after ``sequence_counter``
    (an earlier control record's): true while it has never been full, or while its
    oldest key was committed at or next to that offset, since keys leave oldest first.
    A writer that read that earlier record and does not find its key now knows the key
    was not committed in between only if this holds."""
    table = control.extra.get(IDEMPOTENCY_FIELD)
    if not isinstance(table, dict) or len(table) < IDEMPOTENCY_WINDOW:
        return True
    oldest = next(iter(table.values()))
    if not isinstance(oldest, list) or not oldest or not isinstance(oldest[0], int):
        return False  # unreadable: nothing shows what was forgotten
    return oldest[0] <= sequence_counter + 1


def remember(control: Control, entries: Iterable[tuple[str, Remembered]]
             ) -> dict[str, list[object]]:
    """The window after committing ``entries`` (key, where), newest last."""
    table = control.extra.get(IDEMPOTENCY_FIELD)
    out: dict[str, list[object]] = dict(table) if isinstance(table, dict) else {}
    for key, where in entries:
        out.pop(key, None)
        out[key] = [where.start, where.end, where.data_key]
    while len(out) > IDEMPOTENCY_WINDOW:
        del out[next(iter(out))]
    return out
