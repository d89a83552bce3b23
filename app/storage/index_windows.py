"""How many offsets a page of index entries spans: the key range an index scan asks for.

Oxia's range scan has no limit: it streams every key of the range it is given, and the
client stops reading after a page. Asked for ``index/{offset}`` up to the end of the
partition's index, a read from an old offset had the whole index after it streamed and
parsed, for a page of sixteen entries: a catch-up through a partition of thousands of WAL
entries (data not compacted yet) spent most of its time there, more the further behind
it was. A scan now asks for a window of offsets that should hold about a page: the
records an entry of the partition holds on average, learned from the pages read, times
the page. A window that holds no entry grows the estimate, so a partition of large
compacted entries takes a few short scans before it is learned, never a long one.

Bounded: estimates of ``max_partitions`` partitions, least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from app.storage.keys import TopicPartition
from app.storage.spans import Span

GUESS = 16.0  # records per entry of a partition not seen yet
GROWTH = 8.0  # how much an empty window widens the estimate


class IndexWindows:
    def __init__(self, max_partitions: int = 10_000) -> None:
        self._per_entry: OrderedDict[TopicPartition, float] = OrderedDict()
        self._max = max_partitions

    def span(self, tp: TopicPartition, entries: int) -> int:
        """Offsets that ``entries`` index entries of ``tp`` should span."""
        per_entry = self._per_entry.get(tp, GUESS)
        return max(entries, int(entries * per_entry))

    def learn(self, tp: TopicPartition, spans: Sequence[Span]) -> None:
        """Spans just read: what an entry holds, on average."""
        if spans:
            self._set(tp, max(1.0, (spans[-1].end - spans[0].start + 1) / len(spans)))

    def widen(self, tp: TopicPartition) -> None:
        """A window held no entry: entries are larger than estimated."""
        self._set(tp, self._per_entry.get(tp, GUESS) * GROWTH)

    def _set(self, tp: TopicPartition, per_entry: float) -> None:
        self._per_entry[tp] = min(per_entry, float(1 << 40))
        self._per_entry.move_to_end(tp)
        while len(self._per_entry) > self._max:
            self._per_entry.popitem(last=False)
