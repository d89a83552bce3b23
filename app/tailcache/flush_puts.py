"""What one flush's commits put into the tail cache: a partition's small binary groups
committed one right after another go in as one put.

A flush of 100 KiB binary requests commits about two dozen groups per partition, each a
view into its request's body. Put one by one, each costs a copy of its records (a put
owns its bytes), the cache's lock, a merge and an eviction check: about 12 µs apiece,
a tenth of the broker's CPU at saturation. Joined, they cost the same bytes copied once
and one put; what the cache holds afterwards is the same records at the same offsets.

Only what gains is joined (docs/performance.md, Joined tail-cache puts): groups whose
records are views (a group that owns its bytes, as a JSON body's does, goes in without
a copy on its own), of values alone (a chunk's record sizes are its value lengths, read
without a step per record), and runs of at most ``JOIN_MAX_RECORDS`` records and the
caller's byte bound (a chunk larger than the cache's budget would be cut record by
record). Anything else, or a group whose offsets or append time do not follow the group
before it, is put on its own, as it always was.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from app.storage import columnar
from app.storage.appends import AppendGroup, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import Payload

__all__ = ["JOIN_MAX_BYTES", "JOIN_MAX_RECORDS", "CachePut", "flush_puts", "join_max_bytes"]

# A joined chunk's records at most: a read of the tail takes its sizes per get, and a
# request's own chunk holds about as many at the sizes that gain from joining.
JOIN_MAX_RECORDS = 1024
# And its bytes at most (a caller bounds them by its cache's budget too).
JOIN_MAX_BYTES = 1024 * 1024


# One ``TailCache.put``: (partition, start offset, records, append time). A plain tuple:
# one is made per group of every flush.
CachePut = tuple[TopicPartition, int, Sequence[Payload], int]


# A committed group: its result, its records, and its bytes if it may be joined.
_Done = tuple[AppendResult, Sequence[Payload], int | None]


def join_max_bytes(cache_max_bytes: int) -> int:
    """The bytes of a joined put for a cache of this budget: at most a sixteenth of it,
    so that the cache never cuts one record by record to fit, and JOIN_MAX_BYTES."""
    return min(JOIN_MAX_BYTES, cache_max_bytes // 16)


def flush_puts(committed: Sequence[tuple[AppendGroup, AppendResult]], max_bytes: int
               ) -> Iterator[CachePut]:
    """The puts for a flush's committed groups: per partition in offset order, runs of
    joinable groups that follow one another (the next starts where the last ended, at
    the same append time) as one put of at most ``max_bytes`` of records and
    ``JOIN_MAX_RECORDS`` records; every other group as a put of its own. With nothing
    to join, a put per group in the order given. Each joined copy is made when its put
    is taken, not all of them before the first put."""
    sizes = [_joinable_bytes(r, g.records) for g, r in committed]
    if sizes.count(None) == len(sizes):
        for group, result in committed:
            yield result.tp, result.start_offset, group.records, result.append_time_ms
        return
    by_tp: dict[TopicPartition, list[_Done]] = {}
    for (group, result), nbytes in zip(committed, sizes, strict=True):
        by_tp.setdefault(result.tp, []).append((result, group.records, nbytes))
    for tp, done in by_tp.items():
        done.sort(key=_start)  # stable: equal starts keep their order
        run: list[_Done] = []
        records = size = 0
        for item in done:
            result, batch, nbytes = item
            if nbytes is None:  # on its own, after the run before it
                if run:
                    yield _put(tp, run)
                    run = []
                yield tp, result.start_offset, batch, result.append_time_ms
                continue
            n = len(batch)
            if not (run and _follows(run[-1][0], result) and records + n <= JOIN_MAX_RECORDS
                    and size + nbytes <= max_bytes):
                if run:
                    yield _put(tp, run)
                run, records, size = [], 0, 0
            run.append(item)
            records, size = records + n, size + nbytes
        if run:
            yield _put(tp, run)


def _start(item: _Done) -> int:
    return item[0].start_offset


def _joinable_bytes(result: AppendResult, records: Sequence[Payload]) -> int | None:
    """The record bytes of a group that may be joined to others, or None."""
    if (type(records) is not RecordBatch or type(records.body) is bytes
            or records.columns is None or records.columns.columns != 0
            or records.n_records != result.end_offset - result.start_offset + 1):
        return None
    return records.size


def _follows(a: AppendResult, b: AppendResult) -> bool:
    return b.start_offset == a.end_offset + 1 and b.append_time_ms == a.append_time_ms


def _put(tp: TopicPartition, run: list[_Done]) -> CachePut:
    first = run[0][0]
    if len(run) == 1:
        return (tp, first.start_offset, run[0][1], first.append_time_ms)
    layouts = []
    for _, records, _ in run:
        assert isinstance(records, RecordBatch) and records.columns is not None
        layouts.append(records.columns)
    body = b"".join(columnar.join(layouts))
    # Values alone: the joined body's layout is its lengths, not read back record by record.
    lengths = list(itertools.chain.from_iterable(c.value_lengths for c in layouts))
    joined = RecordBatch.of_columns(body, columnar.values_columns(body, lengths))
    return (tp, first.start_offset, joined, first.append_time_ms)
