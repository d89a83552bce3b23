"""``llog groups list|describe|reset``: the consumer groups (docs/http-api.md, Consumer
groups) over the client's group calls, as tables or JSON.

Only the client's public names are used here, so this module goes with the client."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from llog_client import (
    GroupDescription,
    GroupNotEmpty,
    GroupSummary,
    LlogClient,
)

PAGE = 100  # groups a list request asks for (LLOG_GROUP_LIST_MAX is 1000 by default)
Target = Literal["earliest", "latest"] | int


def reset_target(text: str) -> Target:
    """``--to``: earliest, latest or the offset to commit (the last one processed)."""
    if text == "earliest":
        return "earliest"
    if text == "latest":
        return "latest"
    try:
        offset = int(text)
    except ValueError:
        offset = -1
    if offset < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected earliest, latest or an offset")
    return offset


def all_groups(llog: LlogClient) -> Iterator[GroupSummary]:
    """Every group, a page at a time."""
    after: str | None = None
    while True:
        page = llog.list_groups(after=after, limit=PAGE)
        yield from page.groups
        if page.next_after is None or page.next_after == after:  # no loop on a bad answer
            return
        after = page.next_after


def reset(llog: LlogClient, args: argparse.Namespace) -> dict[tuple[str, int], int]:
    """Set the group's committed offsets; a group with live members is refused by the
    broker, and the message says what to do."""
    target: Target | None = args.to
    try:
        return llog.reset_offsets(
            args.group, args.topic, partition=args.partition,
            to=target if isinstance(target, str) else None,
            offset=target if isinstance(target, int) else None,
            timestamp_ms=args.to_timestamp_ms)
    except GroupNotEmpty as exc:
        exc.message += ("; stop its consumers (or wait until their sessions end) and "
                        "reset again")
        raise


# -- printing ----------------------------------------------------------------------------


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    cells = [[c.upper() for c in columns]] + [
        ["-" if row.get(c) is None else str(row[c]) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in cells)


def _partitions(assignment: Sequence[tuple[str, int]]) -> str:
    return ",".join(f"{topic}/{partition}" for topic, partition in assignment) or "-"


def list_text(groups: Sequence[GroupSummary]) -> str:
    return table([{**dataclasses.asdict(g), "topics": ",".join(g.topics) or "-"}
                  for g in groups],
                 ("group", "generation", "members", "topics", "updated_at_ms"))


def describe_text(found: GroupDescription) -> str:
    """The group, its members, and each partition's committed offset and lag."""
    head = table([{**dataclasses.asdict(found), "members": len(found.members)}],
                 ("group", "generation", "members", "created_at_ms", "updated_at_ms"))
    members = table([{"member": m.member_id, "client": m.client_id,
                      "topics": ",".join(m.topics), "assignment": _partitions(m.assignment),
                      "expires_at_ms": m.expires_at_ms} for m in found.members],
                    ("member", "client", "topics", "assignment", "expires_at_ms"))
    partitions = table([{**dataclasses.asdict(p), "committed": p.committed_offset}
                        for p in found.partitions],
                       ("topic", "partition", "owner", "committed", "log_start_offset",
                        "high_watermark", "lag"))
    return "\n\n".join((head, members, partitions))


def reset_text(done: Mapping[tuple[str, int], int]) -> str:
    return table([{"topic": t, "partition": p, "committed": o}
                  for (t, p), o in sorted(done.items())], ("topic", "partition", "committed"))


def as_json(found: Any) -> str:
    if isinstance(found, dict):  # a reset's committed offsets
        found = [{"topic": t, "partition": p, "offset": o} for (t, p), o in sorted(found.items())]
    elif isinstance(found, list):
        found = [dataclasses.asdict(g) for g in found]
    else:
        found = dataclasses.asdict(found)
    return json.dumps(found, indent=2)


def run_groups(llog: LlogClient, args: argparse.Namespace) -> str:
    """What ``llog groups ACTION`` prints."""
    as_text = args.format != "json"
    if args.action == "list":
        groups = list(all_groups(llog))
        return list_text(groups) if as_text else as_json(groups)
    if args.action == "describe":
        found = llog.describe_group(args.group)
        return describe_text(found) if as_text else as_json(found)
    done = reset(llog, args)
    return reset_text(done) if as_text else as_json(done)
