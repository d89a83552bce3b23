"""A flush's commits go into the tail cache as one put per run of a partition's groups
(app/tailcache/flush_puts.py): the cache holds exactly what a put per group left."""

from __future__ import annotations

from collections.abc import Sequence

from app.storage.appends import AppendGroup, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.tailcache.flush_puts import flush_puts
from app.tailcache.memory import MemoryTailCache

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)


def _committed(tp: TopicPartition, start: int, records: Sequence[Payload],
               append_time_ms: int = 1000) -> tuple[AppendGroup, AppendResult]:
    end = start + len(records) - 1
    return (AppendGroup(tp, records),
            AppendResult(tp, start, end, len(records), "k", "s3://b/w",
                         append_time_ms=append_time_ms))


def _batch(*values: bytes) -> RecordBatch:
    return RecordBatch.of([*values])


def _cached(committed: list[tuple[AppendGroup, AppendResult]], *, joined: bool
            ) -> dict[TopicPartition, list[tuple[int, Payload, int]]]:
    """What a memory cache answers for A and B from offset 1, after the flush's puts
    (joined) or a put per group (as before)."""
    cache = MemoryTailCache(64 * 1024 * 1024)
    if joined:
        for put in flush_puts(committed):
            cache.put(put.tp, put.start_offset, put.records, put.append_time_ms)
    else:
        for group, result in committed:
            cache.put(group.tp, result.start_offset, group.records, result.append_time_ms)
    out = {}
    for tp in (A, B):
        hit = cache.get(tp, 1, None, None)
        assert hit is not None
        times = hit.append_times
        out[tp] = [(offset, record, t) for (offset, record), t in zip(hit.records, times,
                                                                      strict=True)]
    return out


def test_a_partitions_groups_in_a_row_are_one_put_holding_the_same_records() -> None:
    keyed = RecordBatch.of([LogRecord(b"k1", b"v3", timestamp_ms=5), b"v4"])
    committed = [
        _committed(A, 1, _batch(b"v1", b"v2")),
        _committed(B, 1, _batch(b"w1")),
        _committed(A, 3, keyed),  # a key and a timestamp column the first lacks
        _committed(B, 2, _batch(b"w2", b"w3")),
        _committed(A, 5, _batch(b"v5")),
    ]
    puts = flush_puts(committed)
    assert [(p.tp, p.start_offset, len(p.records)) for p in puts] == [(A, 1, 5), (B, 1, 3)]
    assert _cached(committed, joined=True) == _cached(committed, joined=False)


def test_groups_are_put_in_offset_order_whatever_order_they_committed_in() -> None:
    committed = [_committed(A, 3, _batch(b"v3")), _committed(A, 1, _batch(b"v1", b"v2")),
                 _committed(B, 1, _batch(b"w1"))]
    puts = flush_puts(committed)
    assert [(p.tp, p.start_offset, len(p.records)) for p in puts] == [(A, 1, 3), (B, 1, 1)]
    assert list(puts[0].records) == [b"v1", b"v2", b"v3"]


def test_what_does_not_follow_is_put_on_its_own() -> None:
    plain_list: list[Payload] = [b"v4"]
    committed = [
        _committed(A, 1, _batch(b"v1")),
        _committed(A, 2, _batch(b"v2"), append_time_ms=2000),  # another append time
        _committed(A, 3, _batch(b"v3"), append_time_ms=2000),
        _committed(A, 4, plain_list, append_time_ms=2000),  # not a columnar batch
        _committed(A, 7, _batch(b"v7"), append_time_ms=2000),  # a gap before it
        _committed(A, 7, _batch(b"v7"), append_time_ms=2000),  # the same again (an echo)
        _committed(B, 1, _batch(b"w1")),
    ]
    puts = flush_puts(committed)
    assert [(p.tp, p.start_offset, len(p.records)) for p in puts] == [
        (A, 1, 1), (A, 2, 2), (A, 4, 1), (A, 7, 1), (A, 7, 1), (B, 1, 1)]
    assert puts[3].records is committed[4][0].records  # put alone: not copied here


def test_a_batch_whose_count_is_not_its_offsets_is_not_joined() -> None:
    group, result = _committed(A, 1, _batch(b"v1", b"v2"))
    wrong = AppendResult(A, 1, 1, 1, "k", "s3://b/w", append_time_ms=1000)
    puts = flush_puts([(group, wrong), _committed(A, 2, _batch(b"v3"))])
    assert [(p.start_offset, len(p.records)) for p in puts] == [(1, 2), (2, 1)]
