"""The file tail cache's files on disk: a partition's directory, a file written whole
under a temporary name and renamed into place (so nobody sees a partial file), a file
read as a miss when it vanished, and a listing of every segment file of a store's
subtree (stale temporary files of crashed writers deleted on the way). No state: what
the cache knows of these files is in app/tailcache/partition_index.py and
app/tailcache/segment_budget.py."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from app.errors import InvalidRequest
from app.storage.keys import TopicPartition
from app.tailcache.segment import parse_segment_name

TMP_PREFIX = ".tmp-"
# Temporary files older than this belong to a crashed writer.
STALE_TMP_NS = 600 * 1_000_000_000


class FoundSegment(NamedTuple):
    """A segment file seen by a full scan."""

    mtime_ns: int
    path: str
    tp: TopicPartition | None  # None: a directory whose name is no topic-partition
    seg: tuple[int, int]
    size: int


def partition_dir(root: str, tp: TopicPartition) -> str:
    """The directory of ``tp``'s files under a store's subtree ``root``."""
    # Plain strings, not Path objects: the write path makes several per put, and
    # building Paths cost more than the system calls they name.
    return f"{root}/{tp.topic}/{tp.partition}"


def write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """Write every byte of ``parts`` to ``fd`` (``writev`` may write less than asked)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def write_atomic(directory: str, name: str, data: bytes | Sequence[bytes | memoryview]
                 ) -> None:
    """Write ``data`` (bytes, or parts in order) as ``directory/name`` so that nobody
    sees a partial file."""
    tmp = f"{directory}/{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            write_all(fd, [data] if isinstance(data, bytes) else data)
        finally:
            os.close(fd)
        os.replace(tmp, f"{directory}/{name}")
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_file(path: str) -> bytes | None:
    """The bytes of ``path``; None when it cannot be read (a miss)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # vanished (evicted), unreadable, a directory...: a miss
        return None


def list_segment_files(root: Path) -> list[FoundSegment]:
    """Every segment file under ``root``; deletes stale temporary files on the way."""
    found: list[FoundSegment] = []
    now = time.time_ns()
    for part_dir, tp in partition_dirs(root):
        try:
            entries = list(os.scandir(part_dir))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.name.startswith(TMP_PREFIX):
                    if now - entry.stat().st_mtime_ns > STALE_TMP_NS:
                        os.unlink(entry.path)
                    continue
                seg = parse_segment_name(entry.name)
                if seg is None:
                    continue
                st = entry.stat()
            except OSError:
                continue
            found.append(FoundSegment(st.st_mtime_ns, entry.path, tp, seg, st.st_size))
    return found


def partition_dirs(root: Path) -> list[tuple[Path, TopicPartition | None]]:
    """Every partition directory under ``root``, with its topic-partition (None: a
    name that is none)."""
    out: list[tuple[Path, TopicPartition | None]] = []
    try:
        topics = list(os.scandir(root))
    except OSError:
        return out
    for topic in topics:
        if not topic.is_dir(follow_symlinks=False):
            continue
        try:
            partitions = list(os.scandir(topic.path))
        except OSError:
            continue
        for part in partitions:
            if not part.is_dir(follow_symlinks=False):
                continue
            tp: TopicPartition | None = None
            if part.name.isdigit() and str(int(part.name)) == part.name:
                with contextlib.suppress(InvalidRequest):
                    tp = TopicPartition(topic.name, int(part.name))
            out.append((Path(part.path), tp))
    return out
