"""A flush's commits go into the tail cache as one put per run of a partition's small
binary groups (app/tailcache/flush_puts.py): the cache holds exactly what a put per
group left, and only what gains is joined."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from app.storage import columnar
from app.storage.appends import AppendGroup, AppendResult
from app.storage.batch import RecordBatch
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload
from app.tailcache.flush_puts import (
    JOIN_MAX_BYTES,
    JOIN_MAX_RECORDS,
    CachePut,
    flush_puts,
    join_max_bytes,
)
from app.tailcache.memory import MemoryTailCache

A, B = TopicPartition("orders", 0), TopicPartition("orders", 1)
MiB = 1024 * 1024


def _committed(tp: TopicPartition, start: int, records: Sequence[Payload],
               append_time_ms: int = 1000) -> tuple[AppendGroup, AppendResult]:
    end = start + len(records) - 1
    return (AppendGroup(tp, records),
            AppendResult(tp, start, end, len(records), "k", "s3://b/w",
                         append_time_ms=append_time_ms))


def _view(*values: Payload) -> RecordBatch:
    """Records as a binary request's entry holds them: a view into a larger body."""
    body = b"head" + columnar.encode(list(values)) + b"tail"
    return RecordBatch.checked(memoryview(body)[4:-4], columnar.ENCODING_V3)


def _shape(puts: Iterable[CachePut]) -> list[tuple[TopicPartition, int, int]]:
    return [(tp, start, len(records)) for tp, start, records, _ in puts]


def _cached(committed: list[tuple[AppendGroup, AppendResult]], *, joined: bool
            ) -> dict[TopicPartition, list[tuple[int, Payload, int]]]:
    """What a memory cache answers for A and B from offset 1, after the flush's puts
    (joined) or a put per group."""
    cache = MemoryTailCache(64 * MiB)
    if joined:
        for put in flush_puts(committed, MiB):
            cache.put(*put)
    else:
        for group, result in committed:
            cache.put(group.tp, result.start_offset, group.records, result.append_time_ms)
    out = {}
    for tp in (A, B):
        hit = cache.get(tp, 1, None, None)
        assert hit is not None
        out[tp] = [(offset, record, t) for (offset, record), t in zip(
            hit.records, hit.append_times, strict=True)]
    return out


def test_small_binary_groups_in_a_row_are_one_put_of_the_same_records() -> None:
    committed = [_committed(A, 1, _view(b"v1", b"v2")), _committed(B, 1, _view(b"w1")),
                 _committed(A, 3, _view(b"v3")), _committed(B, 2, _view(b"w2", b"w3")),
                 _committed(A, 4, _view(b"v4", b"v5"))]
    puts = list(flush_puts(committed, MiB))
    assert _shape(puts) == [(A, 1, 5), (B, 1, 3)]
    assert _cached(committed, joined=True) == _cached(committed, joined=False)
    joined = puts[0][2]
    assert isinstance(joined, RecordBatch) and isinstance(joined.body, bytes)
    assert joined.columns == columnar.read_columns(joined.body)  # the layout, as read
    assert list(joined) == [b"v1", b"v2", b"v3", b"v4", b"v5"]


def test_groups_are_put_in_offset_order_whatever_order_they_committed_in() -> None:
    committed = [_committed(A, 3, _view(b"v3")), _committed(A, 1, _view(b"v1", b"v2"))]
    puts = list(flush_puts(committed, MiB))
    assert _shape(puts) == [(A, 1, 3)]
    assert list(puts[0][2]) == [b"v1", b"v2", b"v3"]


def test_only_what_gains_is_joined() -> None:
    owned = RecordBatch.of_values([b"v3"])  # a JSON body's: owns its bytes, no copy to save
    keyed = _view(LogRecord(b"v5", key=b"k"))  # sizes per record at every read
    plain: list[Payload] = [b"v7"]
    committed = [_committed(A, 1, _view(b"v1")), _committed(A, 2, _view(b"v2")),
                 _committed(A, 3, owned), _committed(A, 4, _view(b"v4")),
                 _committed(A, 5, keyed), _committed(A, 6, _view(b"v6")),
                 _committed(A, 7, plain), _committed(A, 8, _view(b"v8")),
                 _committed(B, 1, _view(b"w1"))]
    puts = list(flush_puts(committed, MiB))
    assert _shape(puts) == [(A, 1, 2), (A, 3, 1), (A, 4, 1), (A, 5, 1), (A, 6, 1),
                            (A, 7, 1), (A, 8, 1), (B, 1, 1)]
    assert puts[1][2] is owned and puts[3][2] is keyed and puts[5][2] is plain
    assert _cached(committed, joined=True) == _cached(committed, joined=False)


def test_what_does_not_follow_is_put_on_its_own() -> None:
    committed = [
        _committed(A, 1, _view(b"v1")),
        _committed(A, 2, _view(b"v2"), append_time_ms=2000),  # another append time
        _committed(A, 3, _view(b"v3"), append_time_ms=2000),
        _committed(A, 7, _view(b"v7"), append_time_ms=2000),  # a gap before it
        _committed(A, 7, _view(b"v7"), append_time_ms=2000),  # the same again (an echo)
    ]
    assert _shape(flush_puts(committed, MiB)) == [(A, 1, 1), (A, 2, 2), (A, 7, 1), (A, 7, 1)]
    group, _ = _committed(A, 1, _view(b"v1", b"v2"))
    wrong = AppendResult(A, 1, 1, 1, "k", "s3://b/w", append_time_ms=1000)  # count != offsets
    assert _shape(flush_puts([(group, wrong), _committed(A, 2, _view(b"v3"))], MiB)) == [
        (A, 1, 2), (A, 2, 1)]


def test_a_joined_put_stays_within_its_records_and_bytes() -> None:
    half = JOIN_MAX_RECORDS // 2
    many = [_committed(A, 1 + i * half, _view(*[b"x"] * half)) for i in range(5)]
    assert _shape(flush_puts(many, MiB)) == [(A, 1, 2 * half), (A, 1 + 2 * half, 2 * half),
                                             (A, 1 + 4 * half, half)]
    big = [_committed(A, 1 + i, _view(b"y" * 1000)) for i in range(10)]
    assert _shape(flush_puts(big, 3000)) == [(A, 1, 3), (A, 4, 3), (A, 7, 3), (A, 10, 1)]
    alone = [_committed(A, 1, _view(b"z" * 5000)), _committed(A, 2, _view(b"z"))]
    assert _shape(flush_puts(alone, 3000)) == [(A, 1, 1), (A, 2, 1)]


def test_the_cache_answers_a_read_from_inside_a_joined_put() -> None:
    committed = [_committed(A, 1 + 3 * i, _view(b"a%d" % i, b"b%d" % i, b"c%d" % i))
                 for i in range(4)]
    cache = MemoryTailCache(64 * MiB)
    for put in flush_puts(committed, MiB):
        cache.put(*put)
    hit = cache.get(A, 5, 3, None)
    assert hit is not None
    assert list(hit.records) == [(5, b"b1"), (6, b"c1"), (7, b"a2")]
    assert hit.high_watermark == 12


def test_with_nothing_to_join_the_puts_are_the_groups_in_the_order_given() -> None:
    owned = [RecordBatch.of_values([b"v%d" % i]) for i in range(4)]
    committed = [_committed(B, 2, owned[0]), _committed(A, 3, owned[1]),
                 _committed(A, 1, owned[2]), _committed(B, 1, owned[3])]
    puts = list(flush_puts(committed, MiB))
    assert [(tp, start) for tp, start, _, _ in puts] == [(B, 2), (A, 3), (A, 1), (B, 1)]
    assert [records for _, _, records, _ in puts] == owned


def test_a_joined_put_is_at_most_a_sixteenth_of_the_cache() -> None:
    assert join_max_bytes(64 * MiB) == JOIN_MAX_BYTES == MiB
    assert join_max_bytes(8 * MiB) == MiB // 2
    assert join_max_bytes(0) == 0  # no cache: nothing joined (each group alone)
