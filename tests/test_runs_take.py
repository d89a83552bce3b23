"""``take`` (app/storage/runs.py) reckons the sizes of only the records it may take, and
takes what reckoning every record's size took: the same run and the same bytes for every
kind of chunk, start, record limit and budget."""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

from app.storage import codec
from app.storage.batch import RecordBatch
from app.storage.log_record import LogRecord, Payload
from app.storage.runs import Pieces, Run, record_sizes, take


def _take_reckoning_all(records: Sequence[Payload], first: int, offset: int,
                        append_time_ms: int, *, budget: int | None,
                        max_records: int | None, may_exceed: bool) -> tuple[Run, int]:
    """``take`` as it was: every record's size, then the slice."""
    sizes = record_sizes(records)[first:]
    limit = len(sizes) if max_records is None else max(0, min(len(sizes), max_records))
    cumulative = list(accumulate(sizes[:limit]))
    n = len(cumulative) if budget is None else bisect_right(cumulative, budget)
    if n == 0 and may_exceed and limit > 0:
        n = 1
    return Run(records, first, first + n, offset, append_time_ms), \
        (cumulative[n - 1] if n else 0)


def _chunks(rng: random.Random) -> list[Sequence[Payload]]:
    n = rng.randrange(0, 40)
    values = [rng.randbytes(rng.randrange(0, 50)) for _ in range(n)]
    keyed: list[Payload] = [LogRecord(v, key=rng.randbytes(rng.randrange(0, 9))
                                      if rng.random() < 0.6 else None) for v in values]
    headed: list[Payload] = [LogRecord(v, headers=(("h", b"x" * rng.randrange(3)),))
                             for v in values]
    v2 = RecordBatch.checked(codec.encode_batch_v2(headed), codec.ENCODING_V2)
    return [values, RecordBatch.of_values(list(values)), RecordBatch.of(keyed), keyed,
            v2, Pieces([list(values[: n // 2]), RecordBatch.of_values(values[n // 2:])])]


def test_take_equals_reckoning_every_records_size() -> None:
    rng = random.Random(46)
    checked = 0
    for _ in range(300):
        for records in _chunks(rng):
            for _ in range(6):
                first = rng.randrange(0, len(records) + 2)
                kwargs = {"budget": rng.choice([None, 0, rng.randrange(0, 400)]),
                          "max_records": rng.choice([None, 0, -1, rng.randrange(0, 50)]),
                          "may_exceed": rng.random() < 0.5}
                assert take(records, first, 7, 1000, **kwargs) == \
                    _take_reckoning_all(records, first, 7, 1000, **kwargs)
                run, _ = take(records, first, 7, 1000, **kwargs)
                assert list(run.sizes()) == list(record_sizes(records)[run.first:run.stop])
                checked += 1
    assert checked == 300 * 6 * 6
