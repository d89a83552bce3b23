"""Index entries parsed once while kept (app/storage/spans.py, ParsedSpans)."""

from __future__ import annotations

from app.storage.keys import KeyLayout, TopicPartition
from app.storage.metadata import IndexEntry
from app.storage.spans import ParsedSpans

LAYOUT = KeyLayout("llog", "bucket")
TP = TopicPartition("t", 0)


def _entry(count: int = 10) -> bytes:
    return IndexEntry("COMPACTED", count, "s3://bucket/k", object_bytes=4096,
                      chunks=[[0, 4, 1], [5, 2000, 2]]).to_json()


def test_an_entry_met_again_is_not_parsed_again() -> None:
    spans = ParsedSpans()
    key = LAYOUT.index(TP, 10)
    first = spans.span(LAYOUT, TP, key, _entry(), 7)
    assert first is not None and first.chunks is not None
    assert spans.span(LAYOUT, TP, key, _entry(), 7) is first


def test_a_rewritten_entry_is_parsed_afresh() -> None:
    spans = ParsedSpans()
    key = LAYOUT.index(TP, 10)
    first = spans.span(LAYOUT, TP, key, _entry(), 7)
    again = spans.span(LAYOUT, TP, key, _entry(), 8)  # a new version, same bytes
    assert again is not first and again is not None and again.version == 8
    other = spans.span(LAYOUT, TP, key, _entry(9), 8)  # same version, other bytes
    assert other is not None and other.entry.msg_count == 9


def test_keys_of_other_partitions_are_not_spans() -> None:
    spans = ParsedSpans()
    assert spans.span(LAYOUT, TP, LAYOUT.index(TopicPartition("u", 0), 10), _entry(), 7) \
        is None
    assert len(spans) == 0


def test_the_cache_is_bounded_by_bytes() -> None:
    value = _entry()
    spans = ParsedSpans(max_bytes=len(value) * (1 + ParsedSpans.PARSED_FACTOR) * 3)
    for end in range(10, 20):
        spans.span(LAYOUT, TP, LAYOUT.index(TP, end), value, 1)
    assert len(spans) == 3
    too_big = ParsedSpans(max_bytes=len(value))
    assert too_big.span(LAYOUT, TP, LAYOUT.index(TP, 10), value, 1) is not None
    assert len(too_big) == 0
