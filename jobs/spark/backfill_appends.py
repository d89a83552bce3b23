"""backfill's append tasks: chunks of staged rows appended through
:meth:`LogWriter.append_shared`, exactly once across crashes and re-runs (idempotency
keys, progress markers and the resume rule; docs/spark-jobs.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio

from app.errors import LlogError
from app.storage.appends import AppendGroup, AppendResult
from app.storage.compression import NO_COMPRESSION, Compression
from app.storage.idempotency import IDEMPOTENCY_FIELD, IDEMPOTENCY_WINDOW
from app.storage.keys import TopicPartition
from app.storage.log_record import LogRecord, Payload, payload_size
from app.storage.metadata import Control, now_ms
from app.storage.topic_catalog import TopicCatalog
from app.storage.writer import LogWriter
from app.stores.s3.store import S3Store
from jobs.spark.stores import Stores, job_object_key, open_stores
from jobs.spark.tasks import run_async, task_identity, task_logger

JOB = "backfill"

CHUNK_COLUMNS = (
    "topic string, partition int, chunk long, records long, bytes long, status string, "
    "start_offset long, end_offset long, blob_key string, error string"
)
APPENDED = "appended"
SKIPPED_MARKER = "skipped_marker"  # below the newest progress marker
SKIPPED_COMMITTED = "skipped_committed"  # its idempotency key says it is committed
FAILED = "failed"
AMBIGUOUS = "ambiguous"  # key window overflowed: cannot prove it was not committed
NOT_ATTEMPTED = "not_attempted"  # an earlier chunk of the partition did not commit
OK_STATUSES = (APPENDED, SKIPPED_MARKER, SKIPPED_COMMITTED)



@dataclass(frozen=True)
class TaskParams:
    job_id: str
    blob_bytes: int
    marker_every: int
    max_records_per_second: float


# -- idempotency: the resume rule, pure ------------------------------------------------


def chunk_key(job_id: str, chunk: int) -> str:
    return f"backfill/{job_id}/{chunk}"


def resume_decision(control: Control | None, key: str, bound: int
                    ) -> tuple[str, tuple[int, int] | None]:
    """Was the chunk with idempotency ``key`` committed? ``bound`` is the end offset of
    the newest append of this job known to precede it (or the high watermark when the
    job first touched the partition).

    Returns ``("committed", (start, end))``, ``("not_committed", None)`` or
    ``("ambiguous", None)``. The writer remembers the last 64 keys of a partition in
    commit order and forgets the oldest first. If the chunk had been committed, it was
    after offset ``bound``; so if the oldest remembered key starts at or below
    ``bound``, nothing committed after ``bound`` has been forgotten, and the key's
    absence proves the chunk was not committed. A table that never filled up has
    forgotten nothing at all.
    """
    table = control.extra.get(IDEMPOTENCY_FIELD) if control is not None else None
    if not isinstance(table, dict):
        return "not_committed", None
    entry = table.get(key)
    if isinstance(entry, list) and len(entry) == 3 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in entry[:2]):
        return "committed", (int(entry[0]), int(entry[1]))
    if len(table) < IDEMPOTENCY_WINDOW:
        return "not_committed", None
    starts = [e[0] for e in table.values()
              if isinstance(e, list) and e and isinstance(e[0], int)]
    if starts and min(starts) <= bound:
        return "not_committed", None
    return "ambiguous", None


# -- the Spark task --------------------------------------------------------------------


@dataclass
class _Unit:
    tp: TopicPartition
    chunk: int
    records: list[Payload]

    @property
    def size(self) -> int:
        return sum(payload_size(r) for r in self.records)


@dataclass
class _TpState:
    marker_next: int = 0  # chunks below this are done (newest progress marker)
    bound: int = 0
    verifying: bool = False
    failed: bool = False
    since_marker: int = 0
    next_chunk: int = 0


class _RecordingS3:
    """The task's S3Store, remembering the key of the last PUT (the blob of a flush)."""

    def __init__(self, s3: S3Store) -> None:
        self._s3 = s3
        self.last_put: str | None = None

    async def put(self, key: str, body: bytes) -> None:
        await self._s3.put(key, body)
        self.last_put = key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s3, name)


@dataclass
class _Task:
    stores: Stores
    writer: LogWriter
    recorder: _RecordingS3
    params: TaskParams
    results: list[tuple[Any, ...]] = field(default_factory=list)
    states: dict[TopicPartition, _TpState] = field(default_factory=dict)
    compressions: dict[str, Compression] = field(default_factory=dict)
    appended_records: int = 0
    appends: int = 0
    started: float = field(default_factory=time.monotonic)

    def marker_prefix(self, tp: TopicPartition) -> str:
        return job_object_key(self.stores.layout, "backfill", self.params.job_id, "progress",
                              tp.topic, str(tp.partition), "")

    def result(self, unit: _Unit, status: str, start: int | None = None,
               end: int | None = None, blob: str | None = None,
               error: str | None = None) -> None:
        self.results.append((unit.tp.topic, unit.tp.partition, unit.chunk, len(unit.records),
                             unit.size, status, start, end, blob, error))

    async def compression(self, topic: str) -> Compression:
        """How the topic stores its appends (read once per task): backfilled records
        rest as the broker's own appends of the topic would."""
        if topic not in self.compressions:
            found = await TopicCatalog(self.stores.oxia, self.stores.layout).get(topic)
            self.compressions[topic] = (NO_COMPRESSION if found is None
                                        else found.config.stored_as())
        return self.compressions[topic]

    async def read_control(self, tp: TopicPartition) -> Control | None:
        record = await self.stores.oxia.get(self.stores.layout.control(tp), tp.partition_key)
        return None if record is None else Control.from_json(record.value)

    async def state(self, tp: TopicPartition) -> _TpState:
        """The partition's progress: from its newest marker, or a fresh start marker."""
        state = self.states.get(tp)
        if state is not None:
            return state
        newest: str | None = None
        async for info in self.stores.s3.list(self.marker_prefix(tp)):
            if newest is None or info.key > newest:
                newest = info.key
        if newest is None:
            control = await self.read_control(tp)
            hw = control.sequence_counter if control is not None else 0
            state = _TpState(bound=hw)
            await self.write_marker(tp, state, 0)
        else:
            marker = json.loads(await self.stores.s3.get(newest))
            state = _TpState(marker_next=int(marker["next_chunk"]),
                             bound=int(marker["bound_offset"]), verifying=True)
            state.next_chunk = state.marker_next
        self.states[tp] = state
        return state

    async def write_marker(self, tp: TopicPartition, state: _TpState, next_chunk: int) -> None:
        body = json.dumps({
            "job_id": self.params.job_id, "topic": tp.topic, "partition": tp.partition,
            "next_chunk": next_chunk, "bound_offset": state.bound, "written_at_ms": now_ms(),
        }, sort_keys=True).encode()
        # Conditional create: a marker is written once and never changes.
        await self.stores.s3.create_if_absent(
            f"{self.marker_prefix(tp)}{next_chunk:012d}.json", body)
        state.since_marker = 0
        state.marker_next = max(state.marker_next, next_chunk)

    async def admit(self, unit: _Unit) -> bool:
        """Should this unit be appended? Records the outcome of those that should not."""
        state = await self.state(unit.tp)
        if state.failed:
            self.result(unit, NOT_ATTEMPTED, error="an earlier chunk did not commit")
            return False
        if unit.chunk < state.marker_next:
            self.result(unit, SKIPPED_MARKER)
            return False
        if state.verifying:
            control = await self.read_control(unit.tp)
            verdict, offsets = resume_decision(
                control, chunk_key(self.params.job_id, unit.chunk), state.bound)
            if verdict == "committed":
                assert offsets is not None
                self.result(unit, SKIPPED_COMMITTED, offsets[0], offsets[1])
                await self.done(unit, state, offsets[1])
                return False
            if verdict == "ambiguous":
                state.failed = True
                self.result(unit, AMBIGUOUS, error=(
                    "the partition's idempotency window (64 keys) overflowed since the "
                    "last progress marker; cannot prove this chunk was not committed"))
                return False
            state.verifying = False  # not committed, so no later chunk was either
        return True

    async def done(self, unit: _Unit, state: _TpState, end: int) -> None:
        state.bound = end
        state.next_chunk = unit.chunk + 1
        state.since_marker += 1
        if state.since_marker >= self.params.marker_every:
            await self.write_marker(unit.tp, state, state.next_chunk)

    async def flush(self, units: list[_Unit]) -> None:
        if not units:
            return
        await self.throttle(sum(len(u.records) for u in units))
        groups = [AppendGroup(u.tp, u.records, chunk_key(self.params.job_id, u.chunk),
                              await self.compression(u.tp.topic))
                  for u in units]
        self.recorder.last_put = None
        try:
            results = await self.writer.append_shared(groups)
        except LlogError as exc:
            results = [exc for _ in units]
        ours = self.recorder.last_put
        for unit, res in zip(units, results, strict=True):
            state = self.states[unit.tp]
            if isinstance(res, AppendResult):
                # The writer answers a key it remembers with the first append's offsets
                # (a retried or duplicated Spark task): then our blob was not used.
                blob = self.stores.layout.parse_uri(res.wal_uri)[1]
                status = APPENDED if blob == ours else SKIPPED_COMMITTED
                self.result(unit, status, res.start_offset, res.end_offset, blob)
                if status == APPENDED:
                    self.appended_records += res.count
                await self.done(unit, state, res.end_offset)
            else:
                state.failed = True
                self.result(unit, FAILED, error=f"{res.error_type}: {res}")
        self.appends += 1

    async def throttle(self, records: int) -> None:
        rate = self.params.max_records_per_second
        if rate <= 0:
            return
        ahead = (self.appended_records + records) / rate - (time.monotonic() - self.started)
        if ahead > 0:
            await anyio.sleep(ahead)

    async def finish(self) -> None:
        for tp, state in self.states.items():
            if state.since_marker > 0:
                await self.write_marker(tp, state, state.next_chunk)


_STAGED = ("_chunk", "topic", "partition", "value")
_FIELDS = ("key", "headers", "timestamp_ms")


def payload_of(value: bytes, key: bytes | None = None,
               headers: list[dict[str, Any]] | None = None,
               timestamp_ms: int | None = None) -> Payload:
    """A staged row's record: plain bytes unless it has a key, headers or a timestamp
    (so plain rows are written as bytes-batch-v1, as a broker writes them)."""
    if key is None and not headers and timestamp_ms is None:
        return value
    return LogRecord(value, key, tuple((h["name"], h["value"]) for h in headers or ()),
                     timestamp_ms)


def read_staged(uri: str, batch_rows: int = 8192) -> Iterator[tuple[int, str, int, Payload]]:
    """Rows ``(chunk, topic, partition, record)`` of one staged Parquet file, in order."""
    import pyarrow.fs  # type: ignore[import-untyped,import-not-found,unused-ignore]
    import pyarrow.parquet as pq  # type: ignore[import-untyped,import-not-found,unused-ignore]

    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    with fs.open_input_file(path) as fh:
        parquet = pq.ParquetFile(fh)
        fields = [f for f in _FIELDS if f in parquet.schema_arrow.names]
        for batch in parquet.iter_batches(batch_size=batch_rows,
                                          columns=[*_STAGED, *fields]):
            chunks, topics, partitions, values, *rest = (c.to_pylist() for c in batch.columns)
            if not rest:  # plain values only: no record fields to look at
                yield from zip(chunks, topics, partitions, values, strict=True)
                continue
            extra = [dict(zip(fields, row, strict=True)) for row in zip(*rest, strict=True)]
            for chunk, topic, partition, value, more in zip(chunks, topics, partitions,
                                                            values, extra, strict=True):
                yield chunk, topic, partition, payload_of(value, **more)


def _units(rows: Iterable[tuple[int, str, int, Payload]]) -> Iterator[_Unit]:
    """Group rows sorted by (chunk, topic, partition, position): one unit per chunk."""
    unit: _Unit | None = None
    for chunk, topic, partition, value in rows:
        if unit is None or unit.chunk != chunk or unit.tp.topic != topic or (
                unit.tp.partition != partition):
            if unit is not None:
                yield unit
            unit = _Unit(TopicPartition(topic, partition), int(chunk), [])
        unit.records.append(value)
    if unit is not None:
        yield unit


def backfill_task(payload: Mapping[str, str], params: TaskParams,
                  files: Iterable[str]) -> Iterator[tuple[Any, ...]]:
    """Spark ``mapPartitions`` body: append the chunks of each staged file.

    A staged file holds every row of a set of topic-partitions, sorted by (chunk,
    topic, partition, position); the task reads it with pyarrow (no per-row
    serialisation between the JVM and Python) and packs the next chunk of each of its
    partitions into one shared blob per append.
    """
    logger = task_logger(JOB)
    todo = list(files)
    out: list[tuple[Any, ...]] = []

    async def run() -> None:
        async with open_stores(payload, task_identity(JOB)) as stores:
            recorder = _RecordingS3(stores.s3)
            # The store's own horizons (LLOG_RETRY_HORIZON_MS, which vacuum assumes),
            # never the constructor's defaults.
            writer = LogWriter.from_settings(stores.oxia, cast(S3Store, recorder),
                                             stores.layout, stores.metrics, stores.settings.writer)
            async with writer:
                task = _Task(stores, writer, recorder, params)
                last_log = time.monotonic()
                for uri in todo:
                    batch: list[_Unit] = []
                    size = 0
                    # Reading the file blocks the event loop briefly per row batch; the
                    # writer's background work just waits meanwhile.
                    for unit in _units(read_staged(uri)):
                        if batch and (unit.tp in {u.tp for u in batch}
                                      or size + unit.size > params.blob_bytes):
                            await task.flush(batch)
                            batch, size = [], 0
                        # After the flush: a chunk whose predecessor just failed must not
                        # be appended (its partition's order would break).
                        if not await task.admit(unit):
                            continue
                        batch.append(unit)
                        size += unit.size
                        if time.monotonic() - last_log > 10:
                            last_log = time.monotonic()
                            logger.info("%d records appended in %d appends so far",
                                        task.appended_records, task.appends)
                    await task.flush(batch)
                await task.finish()
                out.extend(task.results)
                logger.info("task done: %d records appended in %d appends, %d partitions",
                            task.appended_records, task.appends, len(task.states))

    run_async(run)
    return iter(out)
