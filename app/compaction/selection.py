"""Which WAL entries at the compaction cursor make a run: contiguous, old enough, within
the entry and byte budgets (docs/protocol.md, step 3)."""

from __future__ import annotations

from app.storage.spans import Span


def select_run(scanned: list[Span], *, newest_allowed_ms: int, min_entries: int,
               max_entries: int, max_bytes: int) -> tuple[list[Span], str | None]:
    """The run of WAL entries from the first one on, within the budgets, or no run and
    why. Entries created after ``newest_allowed_ms`` are too young.

    The byte budget is soft below ``min_entries``: a run always gets that many entries
    if they qualify, or one oversized entry would stop the cursor for good.
    """
    run: list[Span] = []
    size = 0
    too_young = False
    for item in scanned:
        entry = item.entry
        if entry.type != "WAL" or (run and item.start != run[-1].end + 1):
            break
        if entry.created_at_ms > newest_allowed_ms:
            too_young = True
            break
        item_bytes = span_bytes(item)
        if len(run) >= max_entries or (
            len(run) >= min_entries and size + item_bytes > max_bytes
        ):
            break
        run.append(item)
        size += item_bytes
    if len(run) < min_entries:
        return [], "entries_too_young" if too_young else "too_few_entries"
    return run, None


def span_bytes(item: Span) -> int:
    """The WAL bytes of one entry as a run counts them: as decompressed."""
    return item.entry.raw_length or item.entry.byte_length or 0


def run_bytes(run: list[Span]) -> int:
    """The WAL bytes a run rewrites (what the compaction throttle charges for it)."""
    return sum(span_bytes(item) for item in run)
