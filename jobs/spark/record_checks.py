"""Whether this release fully understands a parsed Oxia record.

:mod:`app.storage.metadata` accepts any JSON object with the required fields: readers
ignore what they do not know, so a newer release can add fields. A job that deletes
objects needs more: it must be sure it understood every field that can name one. A
record that parses but has an encoding, type or state this release does not know, a
``data_key`` that is not an ``s3://`` URI, or numbers that are not integers, may point
at objects in ways this code cannot see. Such a record is *unreadable*: audit reports
it as corruption and vacuum deletes nothing while one exists (docs/spark-jobs.md,
"Garbage collection fails closed").

Each ``*_problems`` function returns what is wrong, an empty list when nothing is.
"""

from __future__ import annotations

from typing import get_args

from app.errors import CorruptData, InvalidRequest
from app.storage.codec import ENTRY_ENCODINGS
from app.storage.compression import parse_codec
from app.storage.keys import KeyLayout
from app.storage.metadata import (
    Compaction,
    CompactionCursor,
    CompactionState,
    Control,
    EntryType,
    IndexEntry,
    Pending,
)

_U32_MAX = 2**32 - 1


def _is_int(value: object, minimum: int = 0, maximum: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= minimum
            and (maximum is None or value <= maximum))


def _integers(record: object, names: tuple[str, ...], minimum: int = 0) -> list[str]:
    return [f"{name} {getattr(record, name)!r} is not an integer >= {minimum}"
            for name in names if not _is_int(getattr(record, name), minimum)]


def _optional_integers(record: object, names: tuple[str, ...]) -> list[str]:
    return [f"{name} {getattr(record, name)!r} is not an integer >= 0"
            for name in names if getattr(record, name) is not None
            and not _is_int(getattr(record, name))]


def _data_problems(data_key: object, encoding: object, crc32c: object) -> list[str]:
    out = []
    if encoding not in ENTRY_ENCODINGS:
        out.append(f"encoding {encoding!r} is not one this release reads {ENTRY_ENCODINGS}")
    if crc32c is not None and not _is_int(crc32c, 0, _U32_MAX):
        out.append(f"crc32c {crc32c!r} is not an unsigned 32-bit integer")
    if not isinstance(data_key, str):
        out.append(f"data_key {data_key!r} is not a string")
    else:
        try:
            KeyLayout.parse_uri(data_key)
        except InvalidRequest as exc:
            out.append(f"data_key: {exc}")
    return out


def _codec_problems(name: object) -> list[str]:
    try:
        parse_codec(name)
    except CorruptData as exc:
        return [str(exc)]
    return []


def index_entry_problems(entry: IndexEntry) -> list[str]:
    out = []
    if entry.type not in get_args(EntryType):
        out.append(f"type {entry.type!r} is not one of {get_args(EntryType)}")
    out += _integers(entry, ("msg_count",), 1)
    out += _integers(entry, ("created_at_ms",))
    out += _optional_integers(entry, ("byte_offset", "byte_length", "raw_length"))
    out += _codec_problems(entry.codec)
    return out + _data_problems(entry.data_key, entry.encoding, entry.crc32c)


def pending_problems(pending: Pending) -> list[str]:
    out = []
    if pending.entry_type != "WAL":
        out.append(f"entry_type {pending.entry_type!r} is not 'WAL'")
    out += _integers(pending, ("start_offset", "end_offset", "msg_count"), 1)
    out += _integers(pending, ("created_at_ms",))
    out += _optional_integers(pending, ("byte_offset", "byte_length"))
    return out + _data_problems(pending.data_key, pending.encoding, pending.crc32c)


def control_problems(control: Control) -> list[str]:
    """Problems of the control record itself; its pending record is checked apart."""
    out = _integers(control, ("sequence_counter",))
    out += _optional_integers(control, ("log_start_bytes", "appended_bytes",
                                        "last_append_ms"))
    start = control.log_start_offset
    if start is not None and not _is_int(start, 1):
        out.append(f"log_start_offset {start!r} is not an integer >= 1")
    return out


def compaction_problems(compaction: Compaction) -> list[str]:
    out = []
    if compaction.state not in get_args(CompactionState):
        out.append(f"state {compaction.state!r} is not one of {get_args(CompactionState)}")
    out += _integers(compaction, ("start_offset", "end_offset", "msg_count",
                                  "tail_entry_start_offset"), 1)
    out += _integers(compaction, ("created_at_ms",))
    out += _optional_integers(compaction, ("raw_length",))
    out += _codec_problems(compaction.codec)
    return out + _data_problems(compaction.data_key, compaction.encoding, compaction.crc32c)


def cursor_problems(cursor: CompactionCursor) -> list[str]:
    return _integers(cursor, ("offset",), 1)
