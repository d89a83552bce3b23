"""The audit's object checks: HEAD every object a partition references (once per task),
and with ``--deep`` fetch every slice and compacted object, verify ``crc32c`` and the
LLS1 header, and decode the body."""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from typing import Any

import anyio

from app.errors import CorruptData, ObjectMissing
from app.storage import codec
from app.storage.compression import parse_codec
from app.storage.keys import TopicPartition
from app.storage.metadata import IndexEntry
from app.storage.stored import raw_body
from app.stores.s3.store import ObjectInfo
from jobs.spark.findings import CORRUPTION, WARNING, Finding, ObjectUse
from jobs.spark.snapshot import object_key
from jobs.spark.stores import Stores

_U32 = struct.Struct(">I")
# References no reader follows: a missing object is a warning, not lost data. A stray
# or an entry below the log start may be re-created by a delayed materialising create
# after vacuum removed its blob (docs/protocol.md, Races with compaction).
UNREAD_MISSING = {"stray": "stray_object_missing", "trimmable": "trimmable_object_missing"}


@dataclass
class Checked:
    findings: list[Finding]
    bytes_verified: int = 0
    records_verified: int = 0


class ObjectChecker:
    """HEADs (and with ``deep`` reads) the objects of one task, each HEAD at most once."""

    def __init__(self, stores: Stores, deep: bool, concurrency: int) -> None:
        self.stores = stores
        self.deep = deep
        self._limiter = anyio.CapacityLimiter(max(1, concurrency))
        self._heads: dict[str, ObjectInfo | None] = {}
        self._head_locks: dict[str, anyio.Lock] = {}
        self._headers: dict[str, dict[tuple[str, int, int], dict[str, Any]] | CorruptData] = {}
        self._header_locks: dict[str, anyio.Lock] = {}

    async def head(self, key: str) -> ObjectInfo | None:
        lock = self._head_locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._heads:
                async with self._limiter:
                    self._heads[key] = await self.stores.s3.head(key)
            return self._heads[key]

    async def header(self, key: str, size: int) -> dict[tuple[str, int, int], dict[str, Any]]:
        """The LLS1 header's parts by (topic, partition, body_offset), fetched once."""
        lock = self._header_locks.setdefault(key, anyio.Lock())
        async with lock:
            if key not in self._headers:
                try:
                    self._headers[key] = await self._fetch_header(key, size)
                except CorruptData as exc:
                    self._headers[key] = exc
            cached = self._headers[key]
        if isinstance(cached, CorruptData):
            raise cached
        return cached

    async def _fetch_header(self, key: str, size: int
                            ) -> dict[tuple[str, int, int], dict[str, Any]]:
        if size < 8:
            raise CorruptData("object too small for an LLS1 header")
        async with self._limiter:
            head = await self.stores.s3.get_range(key, 0, 8)
        if head[:4] != codec.MAGIC:
            raise CorruptData("not an LLS1 blob (bad magic)")
        (length,) = _U32.unpack_from(head, 4)
        if length > codec.MAX_HEADER_BYTES or 8 + length > size:
            raise CorruptData(f"LLS1 header length {length} exceeds the blob ({size} bytes)")
        async with self._limiter:
            raw = await self.stores.s3.get_range(key, 8, length)
        try:
            header = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptData(f"LLS1 header is not JSON: {exc!s:.200}") from None
        if not isinstance(header, dict) or header.get("version") != 1 or not isinstance(
                header.get("partitions"), list):
            raise CorruptData("LLS1 header: unknown version or no partitions list")
        parts: dict[tuple[str, int, int], dict[str, Any]] = {}
        for part in header["partitions"]:
            if isinstance(part, dict):
                parts[(str(part.get("topic")), _int(part.get("partition")),
                       _int(part.get("body_offset")))] = part
        return parts

    async def check(self, tp: TopicPartition, use: ObjectUse) -> Checked:
        key = object_key(self.stores.layout, use.data_key)

        def at(kind: str, severity: str, message: str, size: int | None = None) -> Checked:
            return Checked([Finding(kind, severity, message, use.first, use.last,
                                    use.index_key, use.data_key, size=size)])

        if key is None:
            return at("foreign_object", WARNING,
                      f"{use.kind} references an object outside bucket "
                      f"{self.stores.layout.bucket}; not checked")
        info = await self.head(key)
        if info is None:
            if use.kind in UNREAD_MISSING:
                return at(UNREAD_MISSING[use.kind], WARNING,
                          f"{use.kind} entry references a missing object")
            return at("missing_object", CORRUPTION, f"{use.kind} references a missing object")
        if use.byte_offset is not None:
            length = use.byte_length or 0
            if use.byte_offset < 8 or use.byte_offset + length > info.size:
                return at("slice_out_of_bounds", CORRUPTION,
                          f"slice [{use.byte_offset}, {use.byte_offset + length}) lies "
                          f"outside the object of {info.size} bytes", info.size)
        elif info.size < 4:
            return at("object_too_small", CORRUPTION,
                      f"object of {info.size} bytes cannot hold a bytes-batch-v1 body",
                      info.size)
        if not self.deep or use.kind == "trimmable":  # below the log start: never read
            return Checked([])
        try:
            return await self._verify(tp, use, key, info)
        except CorruptData as exc:
            return at("corrupt_data", CORRUPTION, str(exc), info.size)
        except ObjectMissing as exc:
            return at("slice_out_of_bounds", CORRUPTION, str(exc), info.size)

    async def _verify(self, tp: TopicPartition, use: ObjectUse, key: str,
                      info: ObjectInfo) -> Checked:
        found: list[Finding] = []
        crc = use.crc32c
        if use.byte_offset is not None:
            length = use.byte_length or 0
            parts = await self.header(key, info.size)
            part = parts.get((tp.topic, tp.partition, use.byte_offset))
            if part is None or _int(part.get("body_length")) != length or _int(
                    part.get("msg_count")) != use.msg_count or (
                    crc is not None and "crc32c" in part and _int(part.get("crc32c")) != crc
                    ) or not _same_codec(part, use.entry):
                found.append(Finding(
                    "header_mismatch", CORRUPTION,
                    f"the LLS1 header has no body of {tp} at {use.byte_offset} with "
                    f"{length} bytes and {use.msg_count} records (header says {part})",
                    use.first, use.last, use.index_key, use.data_key, size=info.size))
            elif crc is None and "crc32c" in part:
                crc = _int(part.get("crc32c"))
            async with self._limiter:
                body = await self.stores.s3.get_range(key, use.byte_offset, length)
        else:
            async with self._limiter:
                body = await self.stores.s3.get(key)
        codec.decode_body(raw_body(body, _stored_as(use, crc)), use.encoding, use.msg_count)
        return Checked(found, len(body), use.msg_count)


def _stored_as(use: ObjectUse, crc: int | None) -> IndexEntry:
    """What ``use`` says about its stored bytes, with the checksum to verify them by."""
    if use.entry is None:
        return IndexEntry("WAL" if use.byte_offset is not None else "COMPACTED",
                          use.msg_count, use.data_key, use.encoding, use.byte_offset,
                          use.byte_length, crc32c=crc)
    return dataclasses.replace(use.entry, crc32c=crc, extra=dict(use.entry.extra))


def _same_codec(part: dict[str, Any], entry: IndexEntry | None) -> bool:
    """Whether the LLS1 header and the index agree on how a slice is stored."""
    try:
        return parse_codec(part.get("codec")) is parse_codec(
            None if entry is None else entry.codec)
    except CorruptData:
        return False


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
