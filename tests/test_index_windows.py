"""An index scan asks Oxia for about a page of entries, not for the rest of the index
(Oxia streams the whole range it is asked for): learned per partition, widened when a
window holds nothing. The real Oxia and MinIO where it says so."""

from __future__ import annotations

from typing import Any

from app.storage.appends import AppendGroup, AppendResult
from app.storage.index_windows import GUESS, IndexWindows
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry
from app.storage.reader import LogReader
from app.storage.spans import Span
from tests.helpers.compaction import make_compactor
from tests.helpers.stack import Engine


def _span(end: int, count: int) -> Span:
    return Span(end, IndexEntry(type="WAL", msg_count=count, data_key="s3://b/k"))


def test_windows_learn_the_records_an_entry_holds_and_widen_when_empty() -> None:
    tp, other = TopicPartition("t", 0), TopicPartition("t", 1)
    windows = IndexWindows(max_partitions=1)
    assert windows.span(tp, 16) == int(16 * GUESS)
    windows.learn(tp, [_span(100, 100), _span(300, 200)])
    assert windows.span(tp, 16) == 16 * 150
    windows.widen(tp)
    assert windows.span(tp, 16) > 16 * 150 * 4
    windows.learn(tp, [_span(1, 1)])
    assert windows.span(tp, 16) == 16  # never fewer offsets than entries
    windows.learn(other, [_span(10, 10)])  # bounded: the older partition is forgotten
    assert windows.span(tp, 16) == int(16 * GUESS)


async def test_a_catch_up_scans_about_a_page_of_a_long_index(engine: Engine,
                                                            topic: str) -> None:
    tp = TopicPartition(topic, 0)
    entries = 500
    for i in range(entries):  # one record per entry: the longest index for its records
        (result,) = await engine.writer.append_shared([AppendGroup(tp, [b"%d" % i])])
        assert isinstance(result, AppendResult)
    # The first entries compacted into one, far larger than the ones after it.
    compactor = make_compactor(engine, min_entry_age_ms=0, max_entries=100)
    assert (await compactor.compact_once(tp)).did_work

    reader = LogReader(engine.oxia, engine.s3, engine.layout)
    asked: list[tuple[str, str]] = []
    real = engine.oxia.range_scan

    async def recording(lo: str, hi: str, partition_key: str, **kw: Any) -> Any:
        asked.append((lo, hi))
        return await real(lo, hi, partition_key, **kw)

    engine.oxia.range_scan = recording  # type: ignore[method-assign]
    got, offset = [], 1
    while True:
        result = await reader.read(tp, offset, max_records=10)
        if not result.records:
            break
        got.extend(v for _, v in result.records)
        offset = result.next_offset
    engine.oxia.range_scan = real  # type: ignore[method-assign]
    assert got == [b"%d" % i for i in range(entries)]
    # Every scan asked for a range of at most a few pages' entries, not the index's rest.
    for lo, hi in asked:
        keys = await engine.oxia.list_keys(lo, hi, tp.partition_key)
        assert len(keys) <= 4 * 64, (lo, hi, len(keys))
