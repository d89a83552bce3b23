"""The audit's checks of one partition snapshot, pure (no I/O): coverage of
``log start..high watermark``, entries wholly below the log start (trimmable), strays,
the pending append, the cursor and the compaction record, and the list of objects to
check (:class:`ObjectUse`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from app.storage.metadata import IndexEntry, Pending
from jobs.spark.findings import CORRUPTION, INFO, WARNING, Finding, ObjectUse
from jobs.spark.snapshot import IndexRow, PartitionSnapshot


@dataclass
class Analysis:
    findings: list[Finding]
    uses: list[ObjectUse]
    strays: list[IndexRow]
    deletable_strays: list[IndexRow]  # strays below the cursor: can never matter again
    pending_materialised: bool
    # Entries wholly below the log start: unreadable, allowed until compaction trims
    # them (docs/protocol.md, Retention); their objects still count as referenced.
    trimmable: list[IndexRow] = field(default_factory=list)


@dataclass
class _Entry:
    """A readable index entry: its row, and the offsets it covers."""

    row: IndexRow
    entry: IndexEntry
    start: int
    end: int


@dataclass
class _Work:
    snap: PartitionSnapshot
    now: int
    stale_after_ms: int
    out: list[Finding] = field(default_factory=list)

    def add(self, kind: str, severity: str, message: str, first_offset: int | None = None,
            last_offset: int | None = None, index_key: str | None = None,
            data_key: str | None = None, age_ms: int | None = None) -> None:
        self.out.append(Finding(kind, severity, message, first_offset, last_offset,
                                index_key, data_key, age_ms))


def analyse(snap: PartitionSnapshot, now: int, stale_after_ms: int) -> Analysis:
    """Coverage, strays, cursor, pending and compaction checks of one snapshot."""
    w = _Work(snap, now, stale_after_ms)
    _check_records(w)
    trimmable, entries = _split_log_start(w, _readable_entries(w))
    live, strays = _split_strays(entries)
    deletable = _report_strays(w, strays)
    pending = snap.control.pending if snap.control is not None else None
    materialised = pending is not None and _materialised(pending, live + trimmable)
    spans = [(e.start, e.end, e.row.key) for e in live]
    if pending is not None:
        _check_pending(w, pending, materialised)
        if not materialised:
            spans.append((pending.start_offset, pending.end_offset, "meta/control pending"))
    _check_tiling(w, spans)
    _check_cursor(w, live)
    _check_compaction(w)
    return Analysis(w.out, _uses(snap, live, strays, trimmable, pending, materialised),
                    [e.row for e in strays], [e.row for e in deletable], materialised,
                    [e.row for e in trimmable])


def _uses(snap: PartitionSnapshot, live: list[_Entry], strays: list[_Entry],
          trimmable: list[_Entry], pending: Pending | None, materialised: bool
          ) -> list[ObjectUse]:
    """Every object the partition references, with what it should hold."""
    uses = ([_use("index", e) for e in live] + [_use("stray", e) for e in strays]
            + [_use("trimmable", e) for e in trimmable])
    if pending is not None and not materialised:
        uses.append(ObjectUse("pending", pending.data_key, pending.start_offset,
                              pending.end_offset, pending.msg_count, pending.byte_offset,
                              pending.byte_length, pending.crc32c, None, pending.encoding,
                              pending.index_entry()))
    comp = snap.compaction
    if comp is not None:
        uses.append(ObjectUse("compaction", comp.data_key, comp.start_offset, comp.end_offset,
                              comp.msg_count, None, None, comp.crc32c, None, comp.encoding,
                              comp.compacted_entry()))
    return uses


def _split_log_start(w: _Work, entries: list[_Entry]) -> tuple[list[_Entry], list[_Entry]]:
    """(trimmable, the rest): entries ending below the log start are reported together,
    as one informational finding; they take no part in the other checks."""
    control = w.snap.control
    log_start = control.log_start if control is not None else 1
    if control is not None and log_start > control.sequence_counter + 1:
        w.add("log_start_beyond_head", CORRUPTION, f"log start {log_start} is beyond the "
              f"high watermark {control.sequence_counter} + 1")
    below = [e for e in entries if e.end < log_start]
    if below:
        w.add("below_log_start", INFO, f"{len(below)} index entries lie wholly below the "
              f"log start {log_start}: trimmable (compaction deletes them)",
              min(e.start for e in below), max(e.end for e in below))
    return below, [e for e in entries if e.end >= log_start]


def _check_records(w: _Work) -> None:
    """Records that do not parse, are missing, or kept changing."""
    snap = w.snap
    for kind, message in snap.errors:
        w.add(kind, CORRUPTION, message)
    if not snap.control_present and snap.index:
        w.add("missing_control", CORRUPTION, "index entries exist but meta/control does not")
    if snap.control_present and not snap.cursor_present:
        w.add("missing_cursor", WARNING,
              "meta/control exists but meta/compaction-cursor does not")
    if not snap.stable:
        w.add("unstable_snapshot", WARNING, f"compaction kept changing the index during "
              f"{snap.attempts} reads; findings may be transient")


def _readable_entries(w: _Work) -> list[_Entry]:
    """Entries to check the index with; bad keys and values, and entries beyond the
    high watermark, are reported instead."""
    hw, hw_after = w.snap.high_watermark, w.snap.high_watermark_after
    entries = []
    for row in w.snap.index:
        if row.end is None:
            w.add("bad_index_key", CORRUPTION, row.error or "bad key", index_key=row.key)
        elif row.entry is None or row.error is not None:
            w.add("bad_index_entry", CORRUPTION, row.error or "bad value",
                  last_offset=row.end, index_key=row.key)
        elif row.end > hw_after:
            w.add("beyond_high_watermark", CORRUPTION,
                  f"entry ends at {row.end}, the high watermark is {hw_after}",
                  row.start, row.end, row.key, row.entry.data_key)
        elif row.end <= hw:  # above hw: appended while the index was being scanned
            entries.append(_Entry(row, row.entry, row.end - row.entry.msg_count + 1, row.end))
    return entries


def _split_strays(entries: list[_Entry]) -> tuple[list[_Entry], list[_Entry]]:
    """(live, strays): strays are WAL entries lying entirely inside a compacted range."""
    compacted = sorted((e for e in entries if e.entry.type == "COMPACTED"), key=lambda e: e.end)
    ends = [e.end for e in compacted]
    live, strays = [], []
    for e in entries:
        if e.entry.type == "WAL":
            i = bisect.bisect_left(ends, e.end)
            if i < len(compacted) and compacted[i].start <= e.start:
                strays.append(e)
                continue
        live.append(e)
    return live, strays


def _report_strays(w: _Work, strays: list[_Entry]) -> list[_Entry]:
    """Reports each stray with why it is one; returns those below the cursor."""
    comp = w.snap.compaction
    deletable = []
    for e in strays:
        if e.end < w.snap.cursor:
            reason = "below the compaction cursor"
            deletable.append(e)
        elif comp is not None and comp.state in ("DELETING_OLD", "UPDATING_CURSOR") and (
                comp.start_offset <= e.end < comp.end_offset):
            reason = f"left by the compaction in flight ({comp.state})"
        else:
            reason = "inside a compacted range"
        w.add("stray", WARNING, f"WAL entry is a stray: {reason}", e.start, e.end, e.row.key,
              e.entry.data_key)
    return deletable


def _materialised(pending: Pending, live: list[_Entry]) -> bool:
    """Whether an index entry already holds the pending append."""
    for e in live:
        same_key = e.end == pending.end_offset and e.start == pending.start_offset
        covering = (e.entry.type == "COMPACTED" and e.start <= pending.start_offset
                    and pending.end_offset <= e.end)
        if (same_key and e.entry.append_id in (None, pending.append_id)) or covering:
            return True
    return False


def _check_pending(w: _Work, pending: Pending, materialised: bool) -> None:
    age = w.now - pending.created_at_ms
    hw = w.snap.high_watermark
    if pending.end_offset != hw:
        w.add("pending_not_at_head", CORRUPTION,
              f"pending ends at {pending.end_offset}, the high watermark is {hw}",
              pending.start_offset, pending.end_offset, data_key=pending.data_key, age_ms=age)
    if not materialised and age >= w.stale_after_ms:
        # Valid (readers serve it from meta/control, the next append or a compaction
        # materialises it), but old: an idle partition, or a writer that died after its
        # commit.
        w.add("stale_pending", INFO, f"pending append {pending.append_id} not materialised "
              f"for {age / 1000:.0f} s", pending.start_offset, pending.end_offset,
              data_key=pending.data_key, age_ms=age)


def _check_tiling(w: _Work, spans: list[tuple[int, int, str]]) -> None:
    """``spans`` must tile ``log start..high watermark``: no gap, no overlap. What lies
    below the log start is not read, so only the parts at or above it count."""
    hw = w.snap.high_watermark
    log_start = w.snap.control.log_start if w.snap.control is not None else 1
    expected = log_start
    clipped = [(max(start, log_start), end, where) for start, end, where in spans
               if end >= log_start]
    for start, end, where in sorted(clipped, key=lambda s: (s[0], -s[1])):
        if start > expected:
            w.add("gap", CORRUPTION, f"no entry covers offsets {expected}..{start - 1}",
                  expected, start - 1)
        elif start < expected:
            w.add("overlap", CORRUPTION, f"{where} covers {start}..{end}, overlapping "
                  f"entries before it up to {expected - 1}", start, min(end, expected - 1),
                  where)
        expected = max(expected, end + 1)
    if expected <= hw:
        w.add("gap", CORRUPTION, f"no entry covers offsets {expected}..{hw}", expected, hw)


def _check_cursor(w: _Work, live: list[_Entry]) -> None:
    """Invariant 4: every offset below the cursor and at or above the log start is
    covered by a compacted entry (``live`` holds no entry wholly below the log start)."""
    cursor, hw = w.snap.cursor, w.snap.high_watermark
    if cursor > hw + 1:
        w.add("cursor_beyond_head", CORRUPTION,
              f"compaction cursor {cursor} is beyond the high watermark {hw}")
    for e in live:
        if e.entry.type == "WAL" and e.start < cursor:
            w.add("wal_below_cursor", CORRUPTION, f"WAL entry below the compaction cursor "
                  f"{cursor} and not covered by a compacted entry", e.start, e.end,
                  e.row.key, e.entry.data_key)


def _check_compaction(w: _Work) -> None:
    comp = w.snap.compaction
    if comp is None:
        return
    age = w.now - comp.created_at_ms
    stale = age >= w.stale_after_ms
    w.add("stale_compaction" if stale else "compaction_in_flight", WARNING if stale else INFO,
          f"meta/compaction {comp.compaction_id} in state {comp.state} for "
          f"{age / 1000:.0f} s", comp.start_offset, comp.end_offset, data_key=comp.data_key,
          age_ms=age)


def _use(kind: str, e: _Entry) -> ObjectUse:
    return ObjectUse(kind, e.entry.data_key, e.start, e.end, e.entry.msg_count,
                     e.entry.byte_offset, e.entry.byte_length, e.entry.crc32c, e.row.key,
                     e.entry.encoding, e.entry)
