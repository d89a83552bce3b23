"""Typed models of the JSON records kept in Oxia (see docs/protocol.md).

Readers ignore fields they do not know, but records that are rewritten (``meta/control``)
carry unknown fields through, so an older writer never strips what a newer one added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, Self

from app.clock import wall_ms
from app.errors import CorruptData

ENCODING = "bytes-batch-v1"
LogState = Literal["OPEN", "FENCED"]
EntryType = Literal["WAL", "COMPACTED"]
CompactionState = Literal["WRITING_COMPACTED_INDEX", "DELETING_OLD", "UPDATING_CURSOR"]


def now_ms() -> int:
    return wall_ms()


class _Record:
    """JSON (de)serialisation shared by every record type."""

    _required: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, data: object) -> Self:
        if not isinstance(data, dict):
            raise CorruptData(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)} - {"extra"}  # type: ignore[arg-type]
        missing = [name for name in cls._required if name not in data]
        if missing:
            raise CorruptData(f"{cls.__name__}: missing fields {missing}")
        kwargs = {k: v for k, v in data.items() if k in known}
        obj = cls._build(kwargs)
        obj.extra = {k: v for k, v in data.items() if k not in known}  # type: ignore[attr-defined]
        return obj

    @classmethod
    def _build(cls, kwargs: dict[str, Any]) -> Self:
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise CorruptData(f"{cls.__name__}: {exc}") from None

    @classmethod
    def from_json(cls, raw: bytes) -> Self:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise CorruptData(f"{cls.__name__}: not JSON: {exc!s:.200}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(getattr(self, "extra", {}) or {})
        for f in fields(self):  # type: ignore[arg-type]
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = value.to_dict() if isinstance(value, _Record) else value
        return out

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()


def _opt() -> Any:
    return field(default=None, metadata={"omit_none": True})


@dataclass
class Pending(_Record):
    """A committed append whose index entry may not be materialised yet."""

    _required = ("append_id", "start_offset", "end_offset", "msg_count", "data_key")

    append_id: str
    start_offset: int
    end_offset: int
    msg_count: int
    data_key: str
    entry_type: EntryType = "WAL"
    encoding: str = ENCODING
    byte_offset: int | None = _opt()
    byte_length: int | None = _opt()
    created_at_ms: int = 0
    crc32c: int | None = _opt()
    # The partition's appended body bytes up to and including this append (retention).
    end_bytes: int | None = _opt()
    # A compressed slice: its codec and its size before compression (byte_length and
    # crc32c describe the stored bytes); absent: stored raw.
    codec: str | None = _opt()
    raw_length: int | None = _opt()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.end_offset - self.start_offset + 1 != self.msg_count or self.msg_count < 1:
            raise CorruptData(
                f"pending [{self.start_offset}, {self.end_offset}] does not hold "
                f"{self.msg_count} records"
            )

    def covers(self, offset: int) -> bool:
        return self.start_offset <= offset <= self.end_offset

    def index_entry(self) -> IndexEntry:
        return IndexEntry(
            type=self.entry_type,
            msg_count=self.msg_count,
            data_key=self.data_key,
            encoding=self.encoding,
            byte_offset=self.byte_offset,
            byte_length=self.byte_length,
            created_at_ms=self.created_at_ms,
            crc32c=self.crc32c,
            append_id=self.append_id,
            end_bytes=self.end_bytes,
            codec=self.codec,
            raw_length=self.raw_length,
        )


@dataclass
class Control(_Record):
    """``meta/control``: log state, highest assigned offset, and the pending append."""

    _required = ("log_state", "sequence_counter")

    log_state: LogState = "OPEN"
    sequence_counter: int = 0
    pending: Pending | None = None
    # The append time of the newest append: append times never go backwards within a
    # partition, so a lookup by time can search the index (docs/protocol.md).
    last_append_ms: int | None = _opt()
    # The first offset still readable: retention moves it forward (None: 1), and the
    # appended bytes before it; the body bytes ever appended (retention by bytes).
    log_start_offset: int | None = _opt()
    log_start_bytes: int | None = _opt()
    appended_bytes: int | None = _opt()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def _build(cls, kwargs: dict[str, Any]) -> Self:
        pending = kwargs.get("pending")
        if pending is not None:
            kwargs["pending"] = Pending.from_dict(pending)
        if kwargs.get("log_state") not in ("OPEN", "FENCED"):
            raise CorruptData(f"Control: unknown log_state {kwargs.get('log_state')!r}")
        return super()._build(kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["pending"] = self.pending.to_dict() if self.pending is not None else None
        return out

    @property
    def fenced(self) -> bool:
        return self.log_state == "FENCED"

    @property
    def log_start(self) -> int:
        return self.log_start_offset or 1


@dataclass
class IndexEntry(_Record):
    """``index/{end_offset}``: where the records ``[end - msg_count + 1, end]`` live."""

    _required = ("type", "msg_count", "data_key")

    type: EntryType
    msg_count: int
    data_key: str
    encoding: str = ENCODING
    byte_offset: int | None = _opt()
    byte_length: int | None = _opt()
    created_at_ms: int = 0
    crc32c: int | None = _opt()
    append_id: str | None = _opt()
    end_bytes: int | None = _opt()  # the partition's appended bytes up to this entry's end
    # COMPACTED entries: the object's size and its chunk table (app/storage/chunks.py),
    # and the append times of its first and last record.
    object_bytes: int | None = _opt()
    chunks: list[list[int]] | None = field(default=None, metadata={"omit_none": True})
    first_append_ms: int | None = _opt()
    last_append_ms: int | None = _opt()
    # How the stored bytes are compressed (app/storage/compression.py; absent: none). A
    # COMPACTED entry's codec covers every chunk: each one is a frame of its own.
    codec: str | None = _opt()
    # Compressed bytes: the body's size before compression (a WAL slice's, which bounds
    # its decompression; a compacted object's whole body, which readers plan by).
    raw_length: int | None = _opt()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.msg_count < 1:
            raise CorruptData(f"index entry with msg_count {self.msg_count}")
        if (self.byte_offset is None) != (self.byte_length is None):
            raise CorruptData("index entry with only one of byte_offset/byte_length")
        if self.chunks is not None and self.object_bytes is None:
            raise CorruptData("index entry with a chunk table but no object_bytes")

    @property
    def is_slice(self) -> bool:
        return self.byte_offset is not None


@dataclass
class CompactionCursor(_Record):
    """``meta/compaction-cursor``: the first offset not yet compacted."""

    _required = ("offset",)

    offset: int = 1
    extra: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass
class Compaction(_Record):
    """``meta/compaction``: the recoverable record of an in-flight compaction."""

    _required = ("compaction_id", "state", "start_offset", "end_offset", "msg_count",
                 "data_key", "tail_entry_start_offset")

    compaction_id: str
    state: CompactionState
    start_offset: int
    end_offset: int
    msg_count: int
    data_key: str
    tail_entry_start_offset: int
    encoding: str = ENCODING
    created_at_ms: int = 0
    crc32c: int | None = _opt()
    object_bytes: int | None = _opt()
    chunks: list[list[int]] | None = field(default=None, metadata={"omit_none": True})
    first_append_ms: int | None = _opt()
    last_append_ms: int | None = _opt()
    end_bytes: int | None = _opt()
    codec: str | None = _opt()  # the compacted object's chunks (IndexEntry.codec)
    raw_length: int | None = _opt()  # the compacted body before compression
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def compacted_entry(self) -> IndexEntry:
        """The COMPACTED index entry this compaction puts at its end key."""
        return IndexEntry(
            type="COMPACTED", msg_count=self.msg_count, data_key=self.data_key,
            encoding=self.encoding, created_at_ms=self.created_at_ms, crc32c=self.crc32c,
            object_bytes=self.object_bytes, chunks=self.chunks,
            first_append_ms=self.first_append_ms, last_append_ms=self.last_append_ms,
            end_bytes=self.end_bytes, codec=self.codec, raw_length=self.raw_length,
        )


@dataclass
class CompactorClaim(_Record):
    """``meta/compactor-claim``: an ephemeral scheduling hint, never trusted for recovery."""

    _required = ("compactor_id",)

    compactor_id: str
    claimed_at_ms: int = 0
    # Unique per acquisition: lets a compactor whose create went unanswered tell its own
    # claim from another's when it reads the record back.
    claim_id: str | None = _opt()
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
