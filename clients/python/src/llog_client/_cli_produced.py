"""What ``llog produce`` does with the futures of the records it sent: settles them a
chunk of lines at a time, in the order read, counting each chunk once it is
acknowledged and printing its runs of offsets with ``--print-offsets``."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Protocol

from llog_client._errors import LlogError
from llog_client._models import RecordMetadata
from llog_client._producer_core import RecordFuture


class Counter(Protocol):
    def add(self, records: int, nbytes: int) -> None: ...


def runs(topic: str, placed: Sequence[RecordMetadata]) -> Iterator[dict[str, object]]:
    """Consecutive records stored at consecutive offsets of one partition, as the JSON
    rows ``--print-offsets`` prints (one per acknowledged batch, or more)."""
    start = 0
    for i in range(1, len(placed) + 1):
        if i < len(placed):
            prev, this = placed[i - 1], placed[i]
            if (this.partition == prev.partition and this.offset == prev.offset + 1
                    and this.duplicate == prev.duplicate):
                continue
        first, last = placed[start], placed[i - 1]
        yield {"topic": topic, "partition": first.partition, "start_offset": first.offset,
               "end_offset": last.offset, "count": i - start, "duplicate": first.duplicate}
        start = i


def chunk_error(futures: Sequence[RecordFuture]) -> LlogError | None:
    """The first error among the records of a chunk, looked up a batch at a time.

    ``llog produce`` sends every record to one partition (the one given, the one key's,
    or 0), and the producer keeps a partition's batches in order: a chunk's records fill
    consecutive batches, each a run of its futures, and once the last is settled all are.
    """
    i = 0
    while i < len(futures):
        future = futures[i]
        if future.error is not None:
            return future.error
        i += future.left_in_batch
    return None


class ProducedChunks:
    """The chunks sent and not yet settled, oldest first. Their number is bounded by the
    producer's buffer: a chunk waits in it until its records are acknowledged."""

    def __init__(self, topic: str, *, printing: bool, progress: Counter) -> None:
        self._topic = topic
        self._printing = printing
        self._progress = progress
        self._pending: deque[tuple[list[RecordFuture], int]] = deque()

    def add(self, futures: list[RecordFuture], nbytes: int) -> None:
        if futures:
            self._pending.append((futures, nbytes))

    def settle(self, *, wait: bool) -> None:
        """Count (and print) the chunks whose records are settled, in order; with
        ``wait``, every chunk. Raises the first failure."""
        while self._pending:
            futures, nbytes = self._pending[0]
            if not wait and not (futures[0].done() and futures[-1].done()):
                return
            if self._printing:
                placed = [f.result() for f in futures]
                for row in runs(self._topic, placed):
                    print(json.dumps(row), flush=True)
            else:
                futures[-1].result()  # settled, and the others before it (see below)
                error = chunk_error(futures)
                if error is not None:
                    raise error
            self._pending.popleft()
            self._progress.add(len(futures), nbytes)
