"""The fetch of a read's units from S3: at most ``fetch_concurrency`` downloads per call
and ``max_concurrent_fetches`` per process; a shared WAL blob is read whole once for all
the partitions that want its slices and kept (app/storage/wal_objects.py), else slices
of one blob wanted by several partitions share one ranged GET when that is not
wasteful; whole objects and chunks are kept verified and decoded in the
:class:`ObjectCache`. After a read that stopped inside a compacted blob, the chunks
that follow are read ahead (app/storage/read_ahead.py)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence

import anyio

from app.errors import CorruptData, LlogError, ObjectMissing
from app.storage import codec, columnar
from app.storage.batch import RecordBatch
from app.storage.chunks import chunk_records
from app.storage.compression import Codec
from app.storage.keys import KeyLayout
from app.storage.log_record import Payload
from app.storage.metadata import IndexEntry
from app.storage.object_cache import ObjectCache
from app.storage.read_ahead import ReadAhead
from app.storage.read_plan import SpanFetch
from app.storage.runs import Pieces
from app.storage.slices import open_slice
from app.storage.spans import Span
from app.storage.stored import raw_body
from app.storage.wal_objects import WalObjects
from app.stores.s3.store import S3Store

Records = Sequence[Payload]
_Job = tuple[Callable[[], Awaitable[None]], list[SpanFetch]]
# Compressed chunks of fewer raw bytes are decompressed in place (well under a
# millisecond); more go to a worker thread.
_INLINE_RAW_BYTES = 64 * 1024
# Chunks whose records stay views of their bytes (the others are decoded into copies).
_KEPT_AS_COLUMNS = (columnar.ENCODING_V3, codec.ENCODING_V3_CHUNKED)


class SpanFetcher:
    """Fills units with their records from S3 or the object cache, within the per-call
    and per-process download limits (the process's limiter is its own state)."""

    def __init__(self, s3: S3Store, layout: KeyLayout, objects: ObjectCache,
                 wal: WalObjects, ahead: ReadAhead, *, fetch_concurrency: int,
                 max_concurrent_fetches: int) -> None:
        self._s3 = s3
        self._layout = layout
        self._objects = objects
        self._wal = wal
        self._ahead = ahead
        self._fetch_concurrency = fetch_concurrency
        self._process_fetches = anyio.CapacityLimiter(max_concurrent_fetches)

    async def fetch(self, units: list[SpanFetch]) -> None:
        """Fill every unit's records (or error); a failure only touches its own units."""
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)

        async def run(job: Callable[[], Awaitable[None]], group: list[SpanFetch]) -> None:
            async with limiter, self._process_fetches:
                try:
                    await job()
                except LlogError as exc:
                    for unit in group:
                        if unit.records is None:
                            unit.error = exc

        async with anyio.create_task_group() as tg:
            for job, group in self._jobs(units):
                tg.start_soon(run, job, group)
        for unit in units:
            parts = unit.chunks
            if parts is not None and unit.error is None and unit.records is None:
                unit.records = Pieces([part for part in parts if part is not None])

    def wal_objects_from(self, spans: Iterable[Span], offset: int, budget: int) -> list[str]:
        """The shared WAL objects not yet kept that hold the slices of ``spans`` from
        ``offset`` on (about ``budget`` bytes), while each is served whole."""
        keys: dict[str, None] = {}
        planned = 0
        for span in spans:
            if span.end < offset:
                continue
            start, length = span.entry.byte_offset, span.entry.byte_length
            if start is None or length is None or planned >= budget:
                break
            key = span.object_key(self._layout)
            if not self._wal.serves(key, start + length):
                break
            if not self._objects.holds_object(key):
                keys[key] = None
            planned += length
        return list(keys)

    def read_objects_ahead(self, name: str, keys: list[str]) -> None:
        """Read the WAL objects ``keys`` whole into the cache in the background (each
        read holds its first ``max_bytes`` at most)."""
        self._ahead.start(name, functools.partial(self._read_objects, keys),
                          len(keys) * self._wal.max_bytes)

    async def _read_objects(self, keys: list[str]) -> None:
        limiter = anyio.CapacityLimiter(self._fetch_concurrency)

        async def read(key: str) -> None:
            async with limiter, self._process_fetches:
                await self._wal.read(key, 0)

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(read, key)

    def _jobs(self, units: list[SpanFetch]) -> list[_Job]:
        slices: dict[str, list[SpanFetch]] = {}
        wholes: dict[str, list[SpanFetch]] = {}
        jobs: list[_Job] = []
        for unit in units:
            key = unit.span.object_key(self._layout)
            if unit.span.entry.byte_offset is not None:
                slices.setdefault(key, []).append(unit)
            elif unit.chunk_range is not None:
                jobs.extend(self._chunk_jobs(key, unit))
            else:
                wholes.setdefault(key, []).append(unit)
        for key, group in slices.items():
            if self._wal.serves(key, max(sum(_slice(u)) for u in group)):
                jobs.append((functools.partial(self._fetch_from_object, key, group), group))
            else:
                jobs.extend(self._slice_jobs(key, group))
        for key, group in wholes.items():
            jobs.append((functools.partial(self._fetch_whole, key, group), group))
        return jobs

    def _slice_jobs(self, key: str, group: list[SpanFetch]) -> list[_Job]:
        """One ranged GET for slices of one blob when their span is at most twice what
        is wanted (several partitions of one flush), else one GET per slice."""
        lo = min(_slice(u)[0] for u in group)
        hi = max(sum(_slice(u)) for u in group)
        wanted = sum(_slice(u)[1] for u in group)
        if len(group) > 1 and hi - lo <= 2 * wanted:
            return [(functools.partial(self._fetch_slices, key, group, lo, hi), group)]
        return [(functools.partial(self._fetch_slices, key, [u], *_bounds(u)), [u])
                for u in group]

    async def _fetch_slices(self, key: str, group: list[SpanFetch], lo: int, hi: int) -> None:
        data = await self._s3.get_range_buffer(key, lo, hi - lo)
        for unit in group:
            start, length = _slice(unit)
            unit.records = await _slice_records(
                memoryview(data)[start - lo:start - lo + length], unit.span.entry)

    async def _fetch_from_object(self, key: str, group: list[SpanFetch]) -> None:
        """The group's slices from the whole object (kept, or read once for all): each
        verified; a slice that fails is its unit's error alone."""
        data = await self._wal.read(key, len(group))
        view = memoryview(data)
        for unit in group:
            start, length = _slice(unit)
            entry = unit.span.entry
            try:
                if start + length > len(data):
                    raise ObjectMissing(
                        f"s3://{self._s3.bucket}/{key}: holds {len(data)} bytes, the index "
                        f"says a slice ends at {start + length} (object truncated?)")
                unit.records = await _slice_records(view[start:start + length], entry)
            except LlogError as exc:
                unit.error = exc

    def _chunk_jobs(self, key: str, unit: SpanFetch) -> list[_Job]:
        """A job for the unit's chunks unless the cache holds them all (a previous
        read's last chunk often is cached: its answer ended inside it)."""
        assert unit.chunk_range is not None
        first, last = unit.chunk_range
        unit.chunks = [self._objects.get(key, i) for i in range(first, last + 1)]
        if all(part is not None for part in unit.chunks):
            return []
        return [(functools.partial(self._fetch_chunks, key, unit), [unit])]

    async def _fetch_chunks(self, key: str, unit: SpanFetch) -> None:
        """The unit's chunks not yet in its parts: those a read-ahead under way brings
        from the cache once it has, the rest with one ranged GET."""
        assert unit.chunks is not None and unit.chunk_range is not None
        await self._ahead.wait(key)
        first = unit.chunk_range[0]
        missing = []
        for i, part in enumerate(unit.chunks, first):
            if part is None:
                unit.chunks[i - first] = self._objects.get(key, i)
                if unit.chunks[i - first] is None:
                    missing.append(i)
        if missing:
            await self._get_chunks(key, unit, missing[0], missing[-1])

    async def _get_chunks(self, key: str, unit: SpanFetch, first: int, last: int) -> None:
        """Chunks ``first .. last`` of a unit's blob, in one ranged GET, into its parts
        and the object cache."""
        chunks = unit.span.chunks
        assert chunks is not None and unit.chunks is not None and unit.chunk_range is not None
        lo, hi = chunks[first].byte_offset, chunks[last].byte_end
        stored_codec = unit.span.codec
        encoding = unit.span.entry.encoding
        wanted = chunks[first:last + 1]
        bodies: list[bytes | bytearray | memoryview]
        if encoding in _KEPT_AS_COLUMNS and stored_codec is Codec.NONE and last > first:
            # Kept as they are stored, so a cached chunk must not pin the range (a
            # decompressed one has its own): each cut from the body on its own.
            bodies = list(await self._s3.get_range_cut(
                key, lo, [(c.byte_offset - lo, c.byte_end - lo) for c in wanted]))
        else:
            data = memoryview(await self._s3.get_range_buffer(key, lo, hi - lo))
            bodies = [data[c.byte_offset - lo:c.byte_end - lo] for c in wanted]

        def decode() -> list[Records]:
            return [chunk_records(memoryview(body), c, encoding, stored_codec)
                    for body, c in zip(bodies, wanted, strict=True)]

        if stored_codec is Codec.NONE or unit.span.chunks_cost(first, last) <= _INLINE_RAW_BYTES:
            decoded = decode()
        else:  # zstd releases the GIL: many chunks decompress off the event loop
            decoded = await anyio.to_thread.run_sync(decode)
        for i, records in enumerate(decoded, first):
            self._objects.put(key, records, i)
            unit.chunks[i - unit.chunk_range[0]] = records

    def read_on(self, unit: SpanFetch) -> None:
        """After a read that stopped inside a compacted blob: fetch as many bytes of the
        chunks that follow in the background, for the next read."""
        chunks = unit.span.chunks
        if chunks is None or unit.chunk_range is None or unit.error is not None:
            return
        first, last = unit.chunk_range
        start = last + 1
        if start >= len(chunks):
            return
        size = chunks[last].byte_end - chunks[first].byte_offset
        end = start
        while end + 1 < len(chunks) and chunks[end].byte_end - chunks[start].byte_offset < size:
            end += 1
        key = unit.span.object_key(self._layout)
        missing = [i for i in range(start, end + 1) if not self._objects.holds(key, i)]
        if not missing:
            return
        ahead = SpanFetch(unit.span, unit.span.start + chunks[start].first_record, (start, end))
        ahead.chunks = [None] * (end - start + 1)
        self._ahead.start(key, functools.partial(self._get_chunks, key, ahead, missing[0],
                                                 missing[-1]),
                          unit.span.chunks_cost(missing[0], missing[-1]))

    async def _fetch_whole(self, key: str, group: list[SpanFetch]) -> None:
        entry = group[0].span.entry
        records = self._objects.get(key)
        if records is None:
            data = raw_body(await self._s3.get(key), entry)
            records = codec.decode_body(data, entry.encoding, entry.msg_count)
            self._objects.put(key, records)
        for unit in group:
            if len(records) != unit.span.entry.msg_count:
                raise CorruptData(f"{key} holds {len(records)} records, the index says "
                                  f"{unit.span.entry.msg_count}")
            unit.records = records


async def _slice_records(stored: memoryview, entry: IndexEntry) -> Sequence[Payload]:
    """The records of a WAL slice's stored bytes: verified, decompressed if it is."""
    body = await open_slice(stored, entry)
    return _batch(memoryview(body), entry.encoding, entry.msg_count)


def _batch(body: memoryview, encoding: str, count: int) -> Sequence[Payload]:
    """A checked body's records: a bytes-batch-v3 body stays in its columns (an answer
    takes runs of them as they are, app/storage/runs.py), others are decoded."""
    if encoding != columnar.ENCODING_V3:
        return codec.decode_body(body, encoding, count)
    return RecordBatch.of_columns(body, columnar.read_counted(body, count))


def _slice(unit: SpanFetch) -> tuple[int, int]:
    e = unit.span.entry
    assert e.byte_offset is not None and e.byte_length is not None
    return e.byte_offset, e.byte_length


def _bounds(unit: SpanFetch) -> tuple[int, int]:
    start, length = _slice(unit)
    return start, start + length
